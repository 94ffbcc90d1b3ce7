"""The gateway <-> worker wire protocol: every message, its msgpack encoding and bounded decoding.

A message travels as two ZeroMQ frames: one byte naming its type, then a msgpack array holding the
dataclass fields in declaration order (nested dataclasses likewise). The worker binds a ROUTER
socket, gateways connect DEALER sockets, so on the worker side a peer identity frame comes first.

Conversation:
  gateway -> worker: Hello (version check), ScoreBatch, BeamBatch, Shutdown, Goodbye
  worker -> gateway: Ready (answers Hello), ScoreResults, BeamResults, Heartbeat (to every known
                     gateway), Error (a batch or frame that could not be served), Goodbye (leaving)

Deadlines are relative budgets in milliseconds remaining when the message is sent; the receiver
converts them to its own monotonic clock. Token ids and tensors are raw little-endian bytes:
batches name their token dtype (int32 or int64); results use float32 and int32 (see each field).

`decode` treats its input as untrusted: frame count and size, string/bytes/array/map lengths and
nesting depth are bounded, every field is type-checked, and any failure is a ProtocolError naming
the problem. It never raises anything else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack
import numpy as np

from shared.latency_model import LatencyModel
from shared.wire_codec import FieldError, record_decoder, to_wire

PROTOCOL_VERSION = 2  # 2: shared prefixes (ScoreRequest.prefix_len, ScoreResult.cached_tokens, Ready.static_prefix_ids)
TOKEN_DTYPES = {"int32": np.dtype("<i4"), "int64": np.dtype("<i8")}
FLOAT32 = np.dtype("<f4")
INT32 = np.dtype("<i4")


class ProtocolError(ValueError):
    """Bytes that are not a valid message of this protocol version; the message says why."""


@dataclass(frozen=True)
class DecodeLimits:
    """Upper bounds applied before and while decoding untrusted frames."""

    max_frame_bytes: int = 64 << 20
    """Largest body frame accepted (msgpack max buffer)."""
    max_str_len: int = 1 << 16
    max_bin_len: int = 64 << 20
    max_array_len: int = 1 << 16
    max_map_len: int = 256


DEFAULT_LIMITS = DecodeLimits()
Scalar = int | float | str | bool


# ---- Error codes and statuses ---------------------------------------------------------------

class ErrorCode:
    """Values of Error.code."""

    MALFORMED = "malformed"  # frames that are not a valid message
    OUT_OF_BOUNDS = "out_of_bounds"  # a batch exceeding the deployment's bounds
    OVERLOADED = "overloaded"  # the worker's queue is full; retry elsewhere or later
    DRAINING = "draining"  # the worker is shutting down and takes no new work
    UNSUPPORTED = "unsupported"  # a workload this worker does not serve, or an unexpected message
    VERSION_MISMATCH = "version_mismatch"  # Hello carried another protocol version
    HELLO_REQUIRED = "hello_required"  # a batch from a peer that has not (re)sent Hello to this worker
    INTERNAL = "internal"  # the worker failed while computing; the batch was not served


class Status:
    """Values of ScoreResult.status / BeamResult.status."""

    OK = "ok"
    EXPIRED = "expired"  # deadline passed before compute; never computed
    ERROR = "error"  # this request alone was rejected; `error` says why


# ---- Messages ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Hello:
    """Gateway -> worker: first message of a connection; answered by Ready or Error."""

    TYPE: ClassVar[int] = 1
    protocol_version: int
    gateway_id: str


@dataclass(frozen=True)
class Ready:
    """Worker -> gateway: the worker's bounds, model facts and fitted latency model per workload."""

    TYPE: ClassVar[int] = 2
    protocol_version: int
    worker_id: str
    device: str
    pid: int
    workloads: tuple[str, ...]
    """Subset of ("score", "beam") this worker serves."""
    bounds: dict[str, int]
    """The [bounds] section the artifacts were compiled with."""
    model: dict[str, Scalar]
    """Model facts from the manifest (e.g. hidden_size, vocab_size, head_size)."""
    latency: dict[str, LatencyModel]
    """Per workload; B and L as defined in shared/latency_model.py."""
    latency_rmse_ms: dict[str, float]
    max_queued_batches: int
    num_streams: int
    heartbeat_interval_ms: int
    static_prefix_ids: tuple[int, ...] = ()
    """The deployment's static prefix (tokens of the template header whose keys/values the worker
    computed at load): a sample or shared prefix that starts with them (and is longer) costs them
    nothing. Empty when the deployment has none."""


@dataclass(frozen=True)
class ScoreRequest:
    """One scoring request inside a ScoreBatch: its samples, packed."""

    request_id: str
    deadline_ms: float
    """Budget remaining when the batch was sent (ms); <= 0 means already expired."""
    input_ids: bytes
    """All samples' token ids concatenated, little-endian in the batch's token_dtype."""
    sample_lens: tuple[int, ...]
    label_ids: tuple[int, ...]
    """Label tokens whose logits/logprobs/probs are returned for every sample (may be empty)."""
    top_k: int
    """0 = no top-k tokens."""
    return_hidden: bool = False
    prefix_len: int = 0
    """The first prefix_len ids of input_ids are the samples' shared prefix, computed once; then
    sample_lens are the suffix lengths (0 allowed: that sample is the prefix) and sample i is
    prefix + suffix i. 0 = no shared prefix: every sample is whole and has >= 1 token."""


@dataclass(frozen=True)
class ScoreBatch:
    """Gateway -> worker: scoring requests to run as one packed forward pass."""

    TYPE: ClassVar[int] = 3
    batch_id: int
    token_dtype: str
    requests: tuple[ScoreRequest, ...]


@dataclass(frozen=True)
class ScoreResult:
    """One request's answer. Arrays are float32 / int32 little-endian, row-major [samples, ...]."""

    request_id: str
    status: str
    error: str = ""
    num_samples: int = 0
    label_logits: bytes = b""  # float32 [S, N]
    label_logprobs: bytes = b""  # float32 [S, N]
    label_probs: bytes = b""  # float32 [S, N]
    topk_ids: bytes = b""  # int32 [S, k]
    topk_logprobs: bytes = b""  # float32 [S, k]
    hidden: bytes = b""  # float32 [S, H], only when return_hidden
    head: bytes = b""  # float32 [S, C], only when the model has an MLP head
    cached_tokens: int = 0
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


@dataclass(frozen=True)
class ScoreResults:
    """Worker -> gateway: one ScoreResult per request of a ScoreBatch, in the same order."""

    TYPE: ClassVar[int] = 4
    batch_id: int
    results: tuple[ScoreResult, ...]
    queue_ms: float
    """Time the batch waited in the worker before compute."""
    compute_ms: float
    """Time of the model call (0 when every request expired)."""


@dataclass(frozen=True)
class BeamRequest:
    """One beam-search request inside a BeamBatch."""

    request_id: str
    deadline_ms: float
    prompt_ids: bytes
    """Little-endian in the batch's token_dtype."""


@dataclass(frozen=True)
class BeamBatch:
    """Gateway -> worker: beam requests sharing one (num_beams, max_new_tokens, k) setting."""

    TYPE: ClassVar[int] = 5
    batch_id: int
    token_dtype: str
    num_beams: int
    max_new_tokens: int
    num_return_sequences: int
    requests: tuple[BeamRequest, ...]


@dataclass(frozen=True)
class BeamResult:
    """One request's best k continuations: int32 [k, S] tokens (pad after EOS), float32 [k] scores."""

    request_id: str
    status: str
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


@dataclass(frozen=True)
class BeamResults:
    """Worker -> gateway: one BeamResult per request of a BeamBatch, in the same order."""

    TYPE: ClassVar[int] = 6
    batch_id: int
    results: tuple[BeamResult, ...]
    queue_ms: float
    compute_ms: float


@dataclass(frozen=True)
class WorkerCounters:
    """Monotone counters since the worker started."""

    batches_computed: int = 0
    requests_computed: int = 0
    requests_expired: int = 0
    errors: int = 0
    """Batches or frames answered with Error (malformed, out of bounds, internal)."""
    overloaded: int = 0
    """Batches refused because the queue was full or the worker was draining."""


@dataclass(frozen=True)
class Heartbeat:
    """Worker -> every known gateway, every heartbeat_interval_ms: liveness and load."""

    TYPE: ClassVar[int] = 7
    worker_id: str
    seq: int
    queue_depth: int
    in_flight: int
    draining: bool
    counters: WorkerCounters


@dataclass(frozen=True)
class Error:
    """Worker -> gateway: a batch (batch_id) or frame (batch_id None) that was not served."""

    TYPE: ClassVar[int] = 8
    code: str
    message: str
    batch_id: int | None = None


@dataclass(frozen=True)
class Shutdown:
    """Gateway -> worker: drain (finish and answer what is queued) and exit."""

    TYPE: ClassVar[int] = 9
    reason: str = ""


@dataclass(frozen=True)
class Goodbye:
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

def encode(message: Message) -> list[bytes]:
    """Frames [type byte, msgpack body] for a message."""
    return [_TYPE_FRAMES[message.TYPE], msgpack.packb(message, default=to_wire)]


_TYPE_FRAMES = {t: bytes([t]) for t in MESSAGE_TYPES}
_DECODERS = {cls: record_decoder(cls) for cls in MESSAGE_TYPES.values()}


def _reject_ext(code: int, data: bytes) -> Any:
    raise FieldError("", f"msgpack extension type {code} is not allowed")


def decode(frames: Sequence[bytes], limits: DecodeLimits = DEFAULT_LIMITS) -> Message:
    """A validated message from [type byte, body] frames; ProtocolError on anything else."""
    if len(frames) != 2:
        raise ProtocolError(f"expected 2 frames (type, body), got {len(frames)}")
    type_frame, body = frames
    if len(type_frame) != 1 or type_frame[0] not in MESSAGE_TYPES:
        raise ProtocolError(f"unknown message type frame {bytes(type_frame[:8])!r}")
    cls = MESSAGE_TYPES[type_frame[0]]
    if len(body) > limits.max_frame_bytes:
        raise ProtocolError(f"{cls.__name__} body of {len(body)} bytes exceeds {limits.max_frame_bytes}")
    try:
        raw = msgpack.unpackb(
            body, use_list=False, raw=False, strict_map_key=True, ext_hook=_reject_ext,
            max_str_len=limits.max_str_len, max_bin_len=limits.max_bin_len,
            max_array_len=limits.max_array_len, max_map_len=limits.max_map_len, max_ext_len=0,
        )  # nesting depth is bounded by msgpack's own stack (StackError) and then by the schema
        message = _DECODERS[cls](raw)
        _CHECKS.get(cls, _no_check)(message)
    except FieldError as exc:
        where = f" at {exc.path.lstrip('.')}" if exc.path else ""
        raise ProtocolError(f"invalid {cls.__name__}{where}: {exc.problem}") from None
    except Exception as exc:  # msgpack raises several types; none may escape as a crash
        raise ProtocolError(f"invalid {cls.__name__}: {type(exc).__name__}: {exc}") from None
    return message


def peek_batch_id(frames: Sequence[bytes], limits: DecodeLimits = DEFAULT_LIMITS) -> int | None:
    """The batch_id of a batch frame that failed to decode, when it can be read; else None.

    Lets the worker name the batch in its Error reply, so the gateway fails it at once.
    """
    try:
        if len(frames) != 2 or len(frames[0]) != 1 or frames[0][0] not in (ScoreBatch.TYPE, BeamBatch.TYPE):
            return None
        if len(frames[1]) > limits.max_frame_bytes:
            return None
        raw = msgpack.unpackb(frames[1], use_list=False, raw=False, ext_hook=_reject_ext, max_ext_len=0,
                              max_str_len=limits.max_str_len, max_bin_len=limits.max_bin_len,
                              max_array_len=limits.max_array_len, max_map_len=limits.max_map_len)
        batch_id = raw[0] if isinstance(raw, tuple) and raw else None
        return batch_id if type(batch_id) is int and -(2**63) <= batch_id < 2**63 else None
    except Exception:
        return None


# ---- Semantic checks (shape consistency; deployment bounds are the worker's to enforce) --------

MAX_ID_CHARS = 256


def _require(ok: bool, path: str, problem: str) -> None:
    if not ok:
        raise FieldError(path, problem)


def _check_request_ids(requests: Sequence[Any]) -> None:
    _require(len(requests) > 0, ".requests", "a batch needs at least one request")
    seen = set()
    for i, req in enumerate(requests):
        rid = req.request_id
        _require(0 < len(rid) <= MAX_ID_CHARS, f".requests[{i}].request_id",
                 f"must be 1..{MAX_ID_CHARS} characters")
        _require(rid not in seen, f".requests[{i}].request_id", f"duplicate request id {rid!r}")
        seen.add(rid)


def _token_count(raw: bytes, token_dtype: str, path: str) -> int:
    itemsize = TOKEN_DTYPES[token_dtype].itemsize
    _require(len(raw) % itemsize == 0, path, f"{len(raw)} bytes is not a whole number of {token_dtype}")
    return len(raw) // itemsize


def _check_score_batch(batch: ScoreBatch) -> None:
    _require(batch.token_dtype in TOKEN_DTYPES, ".token_dtype", f"must be one of {sorted(TOKEN_DTYPES)}")
    _check_request_ids(batch.requests)
    for i, req in enumerate(batch.requests):
        path = f".requests[{i}]"
        tokens = _token_count(req.input_ids, batch.token_dtype, path + ".input_ids")
        _require(len(req.sample_lens) > 0, path + ".sample_lens", "a request needs at least one sample")
        _require(req.prefix_len >= 0, path + ".prefix_len", "must be >= 0")
        if req.prefix_len:
            _require(min(req.sample_lens) >= 0, path + ".sample_lens", "suffix lengths must be >= 0")
        else:
            _require(min(req.sample_lens) >= 1, path + ".sample_lens", "every sample needs >= 1 token")
        _require(req.prefix_len + sum(req.sample_lens) == tokens, path + ".sample_lens",
                 f"prefix_len {req.prefix_len} + sum {sum(req.sample_lens)} != {tokens} tokens in input_ids")
        _require(req.top_k >= 0, path + ".top_k", "must be >= 0")
        _require(all(t >= 0 for t in req.label_ids), path + ".label_ids", "token ids must be >= 0")


def _check_beam_batch(batch: BeamBatch) -> None:
    _require(batch.token_dtype in TOKEN_DTYPES, ".token_dtype", f"must be one of {sorted(TOKEN_DTYPES)}")
    _check_request_ids(batch.requests)
    _require(batch.num_beams >= 1, ".num_beams", "must be >= 1")
    _require(batch.max_new_tokens >= 1, ".max_new_tokens", "must be >= 1")
    _require(1 <= batch.num_return_sequences <= batch.num_beams, ".num_return_sequences",
             "must be between 1 and num_beams")
    for i, req in enumerate(batch.requests):
        tokens = _token_count(req.prompt_ids, batch.token_dtype, f".requests[{i}].prompt_ids")
        _require(tokens >= 1, f".requests[{i}].prompt_ids", "a prompt needs at least one token")


def _check_results(message: ScoreResults | BeamResults) -> None:
    for i, result in enumerate(message.results):
        _require(result.status in (Status.OK, Status.EXPIRED, Status.ERROR), f".results[{i}].status",
                 f"unknown status {result.status!r}")
        _require(getattr(result, "cached_tokens", 0) >= 0, f".results[{i}].cached_tokens", "must be >= 0")


def _check_ready(ready: Ready) -> None:
    _require(all(t >= 0 for t in ready.static_prefix_ids), ".static_prefix_ids", "token ids must be >= 0")


def _no_check(message: Any) -> None:
    pass


_CHECKS: dict[type, Callable[[Any], None]] = {
    ScoreBatch: _check_score_batch,
    BeamBatch: _check_beam_batch,
    ScoreResults: _check_results,
    BeamResults: _check_results,
    Ready: _check_ready,
}
