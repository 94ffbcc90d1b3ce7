"""The gateway <-> worker wire protocol: every message declared once as a msgspec Struct, bounded decoding.

A message travels as two ZeroMQ frames: one byte naming its type (the union's tag: `TYPE` of each
message class), then a msgpack array of the message's fields in declaration order (nested records
likewise; `Ready.bounds` and `Ready.latency` values are maps of their fields). The worker binds a ROUTER
socket, gateways connect DEALER sockets, so on the worker side a peer identity frame comes first.

Conversation:
  gateway -> worker: Hello (version check), ScoreBatch, BeamBatch, Shutdown, Goodbye
  worker -> gateway: Ready (answers Hello), ScoreResults, BeamResults, Heartbeat (to every known
                     gateway), Error (a batch or frame that could not be served), Goodbye (leaving)

Deadlines are relative budgets in milliseconds remaining when the message is sent; the receiver
converts them to its own monotonic clock. Token ids and tensors are raw little-endian bytes:
batches name their token dtype (int32 or int64); results use float32 and int32 (see each field).

`decode` treats its input as untrusted: the frame count and body size are bounded, msgspec checks
every field's type and declared constraint in C (array lengths, id lengths, signs, enumerations),
the checks below add what spans fields (lengths against token counts, duplicates), and any failure
is a ProtocolError naming the field. It never raises anything else. Constructing a message checks
nothing: only what crosses the process boundary is validated.
"""

from __future__ import annotations

import enum
import functools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import msgspec
import numpy as np
from msgspec import Meta

from shared.bounds import Bounds
from shared.latency_model import LatencyModel

PROTOCOL_VERSION = 4
"""3: msgspec codec; Ready.latency values travel as maps {alpha, beta, gamma, delta}.
4: Ready.bounds is a Bounds (every bound present); Ready and Heartbeat lose the fields no gateway read."""
TOKEN_DTYPES = {"int32": np.dtype("<i4"), "int64": np.dtype("<i8")}
FLOAT32 = np.dtype("<f4")
INT32 = np.dtype("<i4")
MAX_ID_CHARS = 256
MAX_ITEMS = 1 << 16
"""Longest array a message may hold (requests, samples, label ids, results)."""


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
Scalar = int | float | str | bool
RequestId = Annotated[str, Meta(min_length=1, max_length=MAX_ID_CHARS)]
NonNegative = Annotated[int, Meta(ge=0)]
Positive = Annotated[int, Meta(ge=1)]
TokenIds = Annotated[tuple[NonNegative, ...], Meta(max_length=MAX_ITEMS)]
TokenDtype = Literal[tuple(TOKEN_DTYPES)]


class Record(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True, gc=False):
    """A message, or a record inside one: a msgpack array of its fields in declaration order.

    gc=False: records hold only scalars, bytes, tuples and dicts of those, never a cycle.
    """


# ---- Error codes and statuses ---------------------------------------------------------------

class ErrorCode(enum.StrEnum):
    """Values of Error.code."""

    MALFORMED = "malformed"  # frames that are not a valid message
    OUT_OF_BOUNDS = "out_of_bounds"  # a batch exceeding the deployment's bounds
    OVERLOADED = "overloaded"  # the worker's queue is full; retry elsewhere or later
    DRAINING = "draining"  # the worker is shutting down and takes no new work
    UNSUPPORTED = "unsupported"  # a workload this worker does not serve, or an unexpected message
    VERSION_MISMATCH = "version_mismatch"  # Hello carried another protocol version
    HELLO_REQUIRED = "hello_required"  # a batch from a peer that has not (re)sent Hello to this worker
    INTERNAL = "internal"  # the worker failed while computing; the batch was not served


class Status(enum.StrEnum):
    """Values of ScoreResult.status / BeamResult.status."""

    OK = "ok"
    EXPIRED = "expired"  # deadline passed before compute; never computed
    ERROR = "error"  # this request alone was rejected; `error` says why


ResultStatus = Status


# ---- Messages ---------------------------------------------------------------------------------

class Hello(Record):
    """Gateway -> worker: first message of a connection; answered by Ready or Error."""

    TYPE: ClassVar[int] = 1
    protocol_version: int
    gateway_id: str


class Ready(Record):
    """Worker -> gateway: the worker's bounds, model facts and fitted latency model per workload."""

    TYPE: ClassVar[int] = 2
    protocol_version: int
    worker_id: str
    device: str
    pid: int
    workloads: tuple[str, ...]
    """Subset of ("score", "beam") this worker serves."""
    bounds: Bounds
    """The bounds the artifacts were compiled with (a map of every Bounds field)."""
    model: dict[str, Scalar]
    """Model facts from the manifest (e.g. hidden_size, vocab_size, head_size)."""
    latency: dict[str, LatencyModel]
    """Per workload; B and L as defined in shared/latency_model.py."""


class ScoreRequest(Record):
    """One scoring request inside a ScoreBatch: its samples, packed."""

    request_id: RequestId
    deadline_ms: float
    """Budget remaining when the batch was sent (ms); <= 0 means already expired."""
    input_ids: bytes
    """All samples' token ids concatenated, little-endian in the batch's token_dtype."""
    sample_lens: Annotated[tuple[NonNegative, ...], Meta(min_length=1, max_length=MAX_ITEMS)]
    label_ids: TokenIds
    """Label tokens whose logits/logprobs/probs are returned for every sample (may be empty)."""
    top_k: NonNegative
    """0 = no top-k tokens."""
    return_hidden: bool = False
    prefix_len: NonNegative = 0
    """The first prefix_len ids of input_ids are the samples' shared prefix, computed once; then
    sample_lens are the suffix lengths (0 allowed: that sample is the prefix) and sample i is
    prefix + suffix i. 0 = no shared prefix: every sample is whole and has >= 1 token."""


class ScoreBatch(Record):
    """Gateway -> worker: scoring requests to run as one packed forward pass."""

    TYPE: ClassVar[int] = 3
    batch_id: int
    token_dtype: TokenDtype
    requests: Annotated[tuple[ScoreRequest, ...], Meta(min_length=1, max_length=MAX_ITEMS)]


class ScoreResult(Record):
    """One request's answer. Arrays are float32 / int32 little-endian, row-major [samples, ...]."""

    request_id: str
    status: ResultStatus
    error: str = ""
    num_samples: int = 0
    label_logits: bytes = b""  # float32 [S, N]
    label_logprobs: bytes = b""  # float32 [S, N]
    label_probs: bytes = b""  # float32 [S, N]
    topk_ids: bytes = b""  # int32 [S, k]
    topk_logprobs: bytes = b""  # float32 [S, k]
    hidden: bytes = b""  # float32 [S, H], only when return_hidden
    head: bytes = b""  # float32 [S, C], only when the model has an MLP head
    cached_tokens: NonNegative = 0
    """Tokens of this request whose keys/values were reused rather than computed (a shared prefix
    after its first use, the deployment's static prefix): submitted tokens - computed tokens."""

    def arrays(self) -> dict[str, np.ndarray]:
        """The non-empty arrays, shaped [num_samples, -1]."""
        out = {}
        for name, dtype in _SCORE_ARRAYS.items():
            raw = getattr(self, name)
            if raw and self.num_samples:
                out[name] = np.frombuffer(raw, dtype).reshape(self.num_samples, -1)
        return out


_SCORE_ARRAYS = {
    "label_logits": FLOAT32, "label_logprobs": FLOAT32, "label_probs": FLOAT32,
    "topk_ids": INT32, "topk_logprobs": FLOAT32, "hidden": FLOAT32, "head": FLOAT32,
}


class ScoreResults(Record):
    """Worker -> gateway: one ScoreResult per request of a ScoreBatch, in the same order."""

    TYPE: ClassVar[int] = 4
    batch_id: int
    results: Annotated[tuple[ScoreResult, ...], Meta(max_length=MAX_ITEMS)]
    queue_ms: float
    """Time the batch waited in the worker before compute."""
    compute_ms: float
    """Time of the model call (0 when every request expired)."""


class BeamRequest(Record):
    """One beam-search request inside a BeamBatch."""

    request_id: RequestId
    deadline_ms: float
    prompt_ids: bytes
    """Little-endian in the batch's token_dtype."""


class BeamBatch(Record):
    """Gateway -> worker: beam requests sharing one (num_beams, max_new_tokens, k) setting."""

    TYPE: ClassVar[int] = 5
    batch_id: int
    token_dtype: TokenDtype
    num_beams: Positive
    max_new_tokens: Positive
    num_return_sequences: Positive
    """At most num_beams."""
    requests: Annotated[tuple[BeamRequest, ...], Meta(min_length=1, max_length=MAX_ITEMS)]


class BeamResult(Record):
    """One request's best k continuations: int32 [k, S] tokens (pad after EOS), float32 [k] scores."""

    request_id: str
    status: ResultStatus
    error: str = ""
    sequences: bytes = b""  # int32 [k, S], new tokens only
    scores: bytes = b""  # float32 [k]
    lengths: bytes = b""  # int32 [k], new tokens per candidate

    def arrays(self, num_return_sequences: int) -> dict[str, np.ndarray]:
        """sequences [k, S], scores [k], lengths [k] (empty dict unless status is ok)."""
        if not self.sequences:
            return {}
        k = num_return_sequences
        return {
            "sequences": np.frombuffer(self.sequences, INT32).reshape(k, -1),
            "scores": np.frombuffer(self.scores, FLOAT32),
            "lengths": np.frombuffer(self.lengths, INT32),
        }


class BeamResults(Record):
    """Worker -> gateway: one BeamResult per request of a BeamBatch, in the same order."""

    TYPE: ClassVar[int] = 6
    batch_id: int
    results: Annotated[tuple[BeamResult, ...], Meta(max_length=MAX_ITEMS)]
    queue_ms: float
    compute_ms: float


class WorkerCounters(Record):
    """Monotone counters since the worker started."""

    batches_computed: int = 0
    requests_computed: int = 0
    requests_expired: int = 0
    errors: int = 0
    """Batches or frames answered with Error (malformed, out of bounds, internal)."""
    overloaded: int = 0
    """Batches refused because the queue was full or the worker was draining."""


class Heartbeat(Record):
    """Worker -> every known gateway, every heartbeat_interval_ms: liveness and load."""

    TYPE: ClassVar[int] = 7
    worker_id: str
    queue_depth: int
    """Batches queued, not yet computing (with in_flight: whether a stalled worker has caught up)."""
    in_flight: int
    draining: bool
    counters: WorkerCounters


class Error(Record):
    """Worker -> gateway: a batch (batch_id) or frame (batch_id None) that was not served."""

    TYPE: ClassVar[int] = 8
    code: ErrorCode
    message: str
    batch_id: int | None = None


class Shutdown(Record):
    """Gateway -> worker: drain (finish and answer what is queued) and exit."""

    TYPE: ClassVar[int] = 9
    reason: str = ""


class Goodbye(Record):
    """Either way: the sender leaves. A worker sends it when it starts draining."""

    TYPE: ClassVar[int] = 10
    sender_id: str
    reason: str = ""


Message = Hello | Ready | ScoreBatch | ScoreResults | BeamBatch | BeamResults | Heartbeat | Error | Shutdown | Goodbye
MESSAGE_TYPES: dict[int, type] = {
    cls.TYPE: cls for cls in (Hello, Ready, ScoreBatch, ScoreResults, BeamBatch, BeamResults,
                              Heartbeat, Error, Shutdown, Goodbye)
}


# ---- Raw array helpers ------------------------------------------------------------------------

def pack_ids(ids: Sequence[int] | np.ndarray, token_dtype: str = "int32") -> bytes:
    """Token ids as little-endian bytes of `token_dtype` (int32 or int64)."""
    return np.ascontiguousarray(ids, dtype=TOKEN_DTYPES[token_dtype]).tobytes()


def unpack_ids(raw: bytes, token_dtype: str) -> np.ndarray:
    """Inverse of pack_ids; a read-only 1-D view when possible."""
    return np.frombuffer(raw, dtype=TOKEN_DTYPES[token_dtype])


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
        if len(body) > limits.max_bin_len:  # only then can a bytes field be longer
            _check_bin_len(message, limits.max_bin_len, "")
    except msgspec.ValidationError as exc:
        problem, _, where = str(exc).partition(" - at `")
        path = _field_path(cls, where.rstrip("`"))
        raise ProtocolError(f"invalid {cls.__name__}{' at ' + path if path else ''}: {problem}") from None
    except _FieldError as exc:
        raise ProtocolError(f"invalid {cls.__name__} at {exc.path}: {exc.problem}") from None
    except Exception as exc:  # malformed msgpack (DecodeError) and anything else: never a crash
        raise ProtocolError(f"invalid {cls.__name__}: {type(exc).__name__}: {exc}") from None
    return message


_PATH_STEP = re.compile(r"\[(\d+|\.\.\.)\]|\.(\w+)")


def _field_path(cls: type, where: str) -> str:
    """msgspec's path into the arrays (`$[2][0][7]`) named by fields (`requests[0].prefix_len`)."""
    info, parts = _type_info(cls), []
    for index, key in _PATH_STEP.findall(where):
        if isinstance(info, msgspec.inspect.StructType):
            field = info.fields[int(index)]
            parts.append("." + field.name)
            info = field.type
        elif isinstance(info, (msgspec.inspect.VarTupleType, msgspec.inspect.DictType)):
            parts.append(f"[{index}]")
            info = getattr(info, "item_type", None) or info.value_type
        else:  # a dataclass inside (LatencyModel) travels as a map: msgspec names the key
            parts.append(f"[{index}]" if index else "." + key)
    return "".join(parts).lstrip(".")


@functools.cache
def _type_info(cls: type) -> msgspec.inspect.Type:
    return msgspec.inspect.type_info(cls)


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
        _require(req.prefix_len + sum(req.sample_lens) == tokens, path + ".sample_lens",
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


_CHECKS: dict[type, Callable[[Any], None]] = {
    ScoreBatch: _check_score_batch,
    BeamBatch: _check_beam_batch,
    ScoreResults: _check_results,
    BeamResults: _check_results,
}
