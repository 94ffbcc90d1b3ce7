"""Encoding and bounded decoding of the wire messages (shared/protocol/messages.py).

`decode` treats its input as untrusted: the frame count and body size are bounded, msgspec checks
every field's type and declared constraint in C (array lengths, id lengths, signs, enumerations),
the checks below add what spans fields (lengths against token counts, duplicates), and any failure
is a ProtocolError naming the field. It never raises anything else.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import numpy as np
from msgspec import Meta

from shared.bounds import Bounds
from shared.decode_errors import MISSING, Style, locate
from shared.protocol.messages import (MESSAGE_TYPES, TOKEN_DTYPES, BeamBatch, BeamRequest, BeamResults, CatalogSwap,
                                      Message,
                                      Ready, Record, ScoreBatch, ScoreRequest, ScoreResults)


class ProtocolError(ValueError):
    """Bytes that are not a valid message of this protocol version; the message says why."""


@dataclass(frozen=True)
class DecodeLimits:
    """Upper bounds applied before and while decoding untrusted frames (array and id lengths are
    declared on the message types)."""

    max_frame_bytes: int = 64 << 20
    """Largest body frame accepted, checked before decoding."""
    max_bin_len: int = 64 << 20
    """Largest bytes field (token ids, result arrays)."""


DEFAULT_LIMITS = DecodeLimits()


# ---- Encoding and decoding --------------------------------------------------------------------

def _plain_number(obj: Any) -> Any:
    """Encoder hook: numpy scalars (a batch id, a length taken from an array) travel as plain numbers."""
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__} in a protocol message")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_plain_number)
_TYPE_FRAMES = {t: bytes([t]) for t in MESSAGE_TYPES}
_DECODERS = {t: msgspec.msgpack.Decoder(cls) for t, cls in MESSAGE_TYPES.items()}


def encode(message: Message) -> list[bytes]:
    """Frames [type byte, msgpack body] for a message."""
    return [_TYPE_FRAMES[message.TYPE], _ENCODER.encode(message)]


class _FieldError(Exception):
    """A check below failed: `path` locates the value inside the message (e.g. requests[3].sample_lens)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(path, problem)
        self.path, self.problem = path, problem


def decode(frames: Sequence[bytes], limits: DecodeLimits = DEFAULT_LIMITS) -> Message:
    """A validated message from [type byte, body] frames; ProtocolError on anything else."""
    if len(frames) != 2:
        raise ProtocolError(f"expected 2 frames (type, body), got {len(frames)}")
    type_frame, body = frames
    if len(type_frame) != 1 or type_frame[0] not in _DECODERS:
        raise ProtocolError(f"unknown message type frame {bytes(type_frame[:8])!r}")
    cls = MESSAGE_TYPES[type_frame[0]]
    if len(body) > limits.max_frame_bytes:
        raise ProtocolError(f"{cls.__name__} body of {len(body)} bytes exceeds {limits.max_frame_bytes}")
    try:
        message = _DECODERS[type_frame[0]].decode(body)
        _CHECKS.get(cls, _no_check)(message)
        _BODY_CHECKS.get(cls, _no_check)(body)
        if len(body) > limits.max_bin_len:  # only then can a bytes field be longer
            _check_bin_len(message, limits.max_bin_len, "")
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"invalid {cls.__name__}: {_explain(exc, cls, body)}") from None
    except _FieldError as exc:
        raise ProtocolError(f"invalid {cls.__name__} at {exc.path}: {exc.problem}") from None
    except Exception as exc:  # malformed msgpack (DecodeError) and anything else: never a crash
        raise ProtocolError(f"invalid {cls.__name__}: {type(exc).__name__}: {exc}") from None
    return message


WIRE = Style(root="", whole="the message")


def _explain(error: msgspec.ValidationError, cls: type, body: bytes) -> str:
    """msgspec's error in words (shared/decode_errors.py), the value sent read back from the body."""
    try:
        sent = msgspec.msgpack.decode(body)
    except Exception:  # the body is malformed msgpack past the point msgspec stopped at
        sent = MISSING
    return locate(error, cls, sent).message(WIRE)


class _BatchHead(msgspec.Struct, array_like=True):
    """The first field of a ScoreBatch or BeamBatch; the rest of the array is skipped."""

    batch_id: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]


_BATCH_HEAD = msgspec.msgpack.Decoder(_BatchHead)


def peek_batch_id(frames: Sequence[bytes], limits: DecodeLimits = DEFAULT_LIMITS) -> int | None:
    """The batch_id of a batch frame that failed to decode, when it can be read; else None.

    Lets the worker name the batch in its Error reply, so the gateway fails it at once.
    """
    try:
        if len(frames) != 2 or len(frames[0]) != 1 or frames[0][0] not in (ScoreBatch.TYPE, BeamBatch.TYPE):
            return None
        if len(frames[1]) > limits.max_frame_bytes:
            return None
        return _BATCH_HEAD.decode(frames[1]).batch_id
    except Exception:
        return None


# ---- Checks that span fields (types, signs and lengths are declared on the messages) ----------

def _require(ok: bool, path: str, problem: str) -> None:
    if not ok:
        raise _FieldError(path, problem)


def _require_finite(value: float, path: str) -> None:
    _require(math.isfinite(value), path, "expected a finite number")


def _check_requests(requests: Sequence[ScoreRequest | BeamRequest]) -> None:
    seen = set()
    for i, req in enumerate(requests):
        _require(req.request_id not in seen, f"requests[{i}].request_id", f"duplicate request id {req.request_id!r}")
        seen.add(req.request_id)
        _require_finite(req.deadline_ms, f"requests[{i}].deadline_ms")


def _token_count(raw: bytes, token_dtype: str, path: str) -> int:
    itemsize = TOKEN_DTYPES[token_dtype].itemsize
    _require(len(raw) % itemsize == 0, path, f"{len(raw)} bytes is not a whole number of {token_dtype}")
    return len(raw) // itemsize


def _check_score_batch(batch: ScoreBatch) -> None:
    _check_requests(batch.requests)
    for i, req in enumerate(batch.requests):
        path = f"requests[{i}]"
        tokens = _token_count(req.input_ids, batch.token_dtype, path + ".input_ids")
        if not req.prefix_len:
            _require(min(req.sample_lens) >= 1, path + ".sample_lens", "every sample needs >= 1 token")
        _require(req.work().sent_tokens == tokens, path + ".sample_lens",
                 f"prefix_len {req.prefix_len} + sum {sum(req.sample_lens)} != {tokens} tokens in input_ids")


def _check_beam_batch(batch: BeamBatch) -> None:
    _check_requests(batch.requests)
    _require(batch.num_return_sequences <= batch.num_beams, "num_return_sequences",
             "must be between 1 and num_beams")
    for i, req in enumerate(batch.requests):
        tokens = _token_count(req.prompt_ids, batch.token_dtype, f"requests[{i}].prompt_ids")
        _require(tokens >= 1, f"requests[{i}].prompt_ids", "a prompt needs at least one token")


def _check_results(message: ScoreResults | BeamResults) -> None:
    _require_finite(message.queue_ms, "queue_ms")
    _require_finite(message.compute_ms, "compute_ms")


def _check_bin_len(value: Any, limit: int, path: str) -> None:
    """Every bytes field inside `value` is at most `limit` bytes long."""
    if isinstance(value, bytes):
        _require(len(value) <= limit, path.lstrip("."), f"{len(value)} bytes exceed max_bin_len {limit}")
    elif isinstance(value, Record):
        for name in value.__struct_fields__:
            _check_bin_len(getattr(value, name), limit, f"{path}.{name}")
    elif isinstance(value, tuple):
        for i, item in enumerate(value):
            _check_bin_len(item, limit, f"{path}[{i}]")


def _no_check(message: Any) -> None:
    pass


_READY_BOUNDS = Ready.__struct_fields__.index("bounds")
_BOUND_NAMES = tuple(f.name for f in dataclasses.fields(Bounds))


def _check_every_bound(body: bytes) -> None:
    """A Ready's bounds name every Bounds field: a worker that leaves one out is refused, the
    missing ones named (decoding alone would put the Bounds default in its place, silently)."""
    sent = msgspec.msgpack.decode(body)[_READY_BOUNDS]  # a map: the typed decode checked it
    missing = [name for name in _BOUND_NAMES if name not in sent]
    _require(not missing, "bounds", f"missing {', '.join(missing)}: a worker announces every bound its "
                                    "artifacts were compiled with, none taken by default")


def _check_catalog_swap(swap: CatalogSwap) -> None:
    _require(bool(swap.load or swap.unload), "load", "empty: name a catalogue to load or unload")
    both = sorted(set(swap.load) & set(swap.unload))
    _require(not both, "unload", f"{', '.join(map(repr, both))} both loaded and unloaded")
    _require(len(set(swap.unload)) == len(swap.unload), "unload", "a catalogue named twice")


_CHECKS: dict[type, Callable[[Any], None]] = {
    CatalogSwap: _check_catalog_swap,
    ScoreBatch: _check_score_batch,
    BeamBatch: _check_beam_batch,
    ScoreResults: _check_results,
    BeamResults: _check_results,
}
_BODY_CHECKS: dict[type, Callable[[bytes], None]] = {  # what the typed message no longer shows: which fields were sent
    Ready: _check_every_bound,
}
