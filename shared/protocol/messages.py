"""The wire messages, each declared once as a msgspec Struct (shared/protocol/__init__.py says how
they travel); the raw little-endian id arrays they carry. Constructing a message checks nothing:
shared/protocol/codec.py validates what crosses the process boundary."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Annotated, ClassVar, Generic, Literal, TypeVar

import msgspec
import numpy as np
from msgspec import Meta

from shared.bounds import Bounds
from shared.latency_model import LatencyModel
from shared.work import WorkSize

PROTOCOL_VERSION = 9
"""3: msgspec codec; Ready.latency values travel as maps {alpha, beta, gamma, delta}.
4: Ready.bounds is a Bounds (every bound present); Ready and Heartbeat lose the fields no gateway read.
5: a Ready that leaves out a bound is refused, naming it (4 took the Bounds default in its place).
6: Heartbeat.prefix_cache: what the worker's prefix cache holds and its counters.
7: ScoreRequest.traceparent and BeamRequest.traceparent: the request's W3C trace context (may be empty).
8: BeamRequest.catalog names the catalogue a constrained request is decoded in; BeamResult.catalog_version
   says which version of the worker's catalogues served it; CatalogSwap / CatalogState load catalogues.
9: ScoreRequest.prompt_logprobs asks for per-token prompt log-probs, ScoreResult.token_* carry them."""
TOKEN_DTYPES = {"int32": np.dtype("<i4"), "int64": np.dtype("<i8")}
FLOAT32 = np.dtype("<f4")
INT32 = np.dtype("<i4")
MAX_ID_CHARS = 256
MAX_CATALOG_NAME_CHARS = 64
MAX_ITEMS = 1 << 16
"""Longest array a message may hold (requests, samples, label ids, results)."""

Scalar = int | float | str | bool
RequestId = Annotated[str, Meta(min_length=1, max_length=MAX_ID_CHARS)]
NonNegative = Annotated[int, Meta(ge=0)]
Positive = Annotated[int, Meta(ge=1)]
TokenIds = Annotated[tuple[NonNegative, ...], Meta(max_length=MAX_ITEMS)]
TokenDtype = Literal[tuple(TOKEN_DTYPES)]
TraceParent = Annotated[str, Meta(pattern=r"^(|[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2})$")]
"""A W3C traceparent (version-trace id-span id-flags, lower-case hex), or empty: not traced."""


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
    gateway_id: RequestId  # a name for logs, as short as a request id


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
    """The bounds the artifacts were compiled with: a map of every Bounds field, none left out
    (max_prefix_tokens may be nil: an older manifest's unset one)."""
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
    traceparent: TraceParent = ""
    """The trace context of the gateway's span for this request's batch (gateway/telemetry.py), so work
    on the worker can be placed in the request's trace; empty when tracing is off."""
    prompt_logprobs: NonNegative | None = None
    """None: none. n: per-token prompt log-probs (ScoreResult.token_*): at every position of every
    sample but its last, the log-prob of the sample's next token and the n most likely (n <= the
    bound max_top_k). Every token of such a request is computed: no static prefix or cache reused."""

    def work(self) -> WorkSize:
        """What this request sends (shared/work.py); which tokens the node reuses is the node's to find."""
        return WorkSize(self.prefix_len, self.sample_lens)


class ScoreBatch(Record):
    """Gateway -> worker: scoring requests to run as one packed forward pass."""

    TYPE: ClassVar[int] = 3
    batch_id: int
    token_dtype: TokenDtype
    requests: Annotated[tuple[ScoreRequest, ...], Meta(min_length=1, max_length=MAX_ITEMS)]


class RequestAnswer(Record):
    """What every request's answer starts with (ScoreResult, BeamResult add their arrays after it)."""

    request_id: str
    status: ResultStatus
    error: str = ""


class ScoreResult(RequestAnswer):
    """One request's answer. Arrays are float32 / int32 little-endian, row-major [samples, ...]."""

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
    token_logprobs: bytes = b""  # float32 [P]: P = sum over samples of (tokens - 1), only with prompt_logprobs
    token_topk_ids: bytes = b""  # int32 [P, n]
    token_topk_logprobs: bytes = b""  # float32 [P, n]

    def arrays(self) -> dict[str, np.ndarray]:
        """The non-empty arrays, shaped [num_samples, -1]."""
        out = {}
        for name, dtype in _SCORE_ARRAYS.items():
            raw = getattr(self, name)
            if raw and self.num_samples:
                out[name] = np.frombuffer(raw, dtype).reshape(self.num_samples, -1)
        return out

    def token_arrays(self) -> dict[str, np.ndarray]:
        """The per-token prompt log-probs: token_logprobs [P], token_topk_ids and token_topk_logprobs
        [P, n]; each sample's L - 1 positions in turn (empty dict when not asked for)."""
        if not self.token_logprobs:
            return {}
        logprobs = np.frombuffer(self.token_logprobs, FLOAT32)
        return {"token_logprobs": logprobs,
                "token_topk_ids": np.frombuffer(self.token_topk_ids, INT32).reshape(len(logprobs), -1),
                "token_topk_logprobs": np.frombuffer(self.token_topk_logprobs, FLOAT32).reshape(len(logprobs), -1)}


_SCORE_ARRAYS = {
    "label_logits": FLOAT32, "label_logprobs": FLOAT32, "label_probs": FLOAT32,
    "topk_ids": INT32, "topk_logprobs": FLOAT32, "hidden": FLOAT32, "head": FLOAT32,
}


AnswerT = TypeVar("AnswerT", bound=RequestAnswer)


class BatchAnswer(Record, Generic[AnswerT]):
    """Worker -> gateway: one answer per request of a batch, in the same order, and what the batch cost."""

    batch_id: int
    results: Annotated[tuple[AnswerT, ...], Meta(max_length=MAX_ITEMS)]
    queue_ms: float
    """Time the batch waited in the worker before compute."""
    compute_ms: float
    """Time of the model call (0 when every request expired)."""


class ScoreResults(BatchAnswer[ScoreResult]):
    """The answer to a ScoreBatch."""

    TYPE: ClassVar[int] = 4


class BeamRequest(Record):
    """One beam-search request inside a BeamBatch."""

    request_id: RequestId
    deadline_ms: float
    prompt_ids: bytes
    """Little-endian in the batch's token_dtype."""
    traceparent: TraceParent = ""
    """As ScoreRequest.traceparent."""
    catalog: Annotated[str, Meta(max_length=MAX_CATALOG_NAME_CHARS)] = ""
    """The loaded catalogue (e.g. a market) a constrained node decodes it in; "": the default one.
    A name the worker has not loaded gets this request alone an error result."""


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


class BeamResult(RequestAnswer):
    """One request's best k continuations: int32 [k, S] tokens (pad after EOS), float32 [k] scores."""

    sequences: bytes = b""  # int32 [k, S], new tokens only
    scores: bytes = b""  # float32 [k]
    lengths: bytes = b""  # int32 [k], new tokens per candidate
    catalog_version: NonNegative = 0
    """The version of the worker's catalogues that served it (worker/catalog_store.py); 0: unconstrained."""

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


class BeamResults(BatchAnswer[BeamResult]):
    """The answer to a BeamBatch."""

    TYPE: ClassVar[int] = 6


class WorkerCounters(Record):
    """Monotone counters since the worker started."""

    batches_computed: int = 0
    requests_computed: int = 0
    requests_expired: int = 0
    errors: int = 0
    """Batches or frames answered with Error (malformed, out of bounds, internal)."""
    overloaded: int = 0
    """Batches refused because the queue was full or the worker was draining."""


class PrefixCacheReport(Record):
    """A worker's prefix cache (worker/prefix_cache.py): the prefixes it holds now and its counters
    since start. A cache that is off (`[score] prefix_cache_mb = 0`) reports budget_bytes 0."""

    held: tuple[tuple[int, NonNegative], ...] = ()
    """(prefix_key, tokens) of every entry held (shared/prefix.prefix_key of its token ids)."""
    budget_bytes: NonNegative = 0
    bytes_held: NonNegative = 0
    hits: NonNegative = 0
    misses: NonNegative = 0
    insertions: NonNegative = 0
    evictions: NonNegative = 0
    hit_tokens: NonNegative = 0
    """Prompt tokens read from the cache instead of computed."""


class Heartbeat(Record):
    """Worker -> every known gateway, every heartbeat_interval_ms: liveness and load."""

    TYPE: ClassVar[int] = 7
    worker_id: str
    queue_depth: int
    """Batches queued, not yet computing (with in_flight: whether a stalled worker has caught up)."""
    in_flight: int
    draining: bool
    counters: WorkerCounters
    prefix_cache: PrefixCacheReport = PrefixCacheReport()


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


CatalogName = Annotated[str, Meta(min_length=1, max_length=MAX_CATALOG_NAME_CHARS)]


class CatalogSwap(Record):
    """Gateway -> worker: load catalogues from files the worker can read, as one new version (the
    others stay loaded), or unload some; answered by CatalogState. The current version serves until
    the new one is complete; a batch runs on the version current when it starts."""

    TYPE: ClassVar[int] = 11
    request_id: RequestId
    """Echoed in the answer."""
    load: Annotated[dict[CatalogName, Annotated[str, Meta(min_length=1, max_length=4096)]], Meta(max_length=1024)] = {}
    """Catalogue name -> path of its trie file (.npz) or sequences file, on the worker's file system."""
    unload: Annotated[tuple[CatalogName, ...], Meta(max_length=1024)] = ()


class CatalogState(Record):
    """Worker -> gateway: the answer to a CatalogSwap: the version now current and what it holds, or
    why nothing changed (error: a bad file, a set beyond the compiled tables, an unconstrained node)."""

    TYPE: ClassVar[int] = 12
    request_id: str
    version: NonNegative
    """The current version after the swap (unchanged when error is set)."""
    items: dict[str, NonNegative] = {}
    """Valid sequences per loaded catalogue."""
    nodes: NonNegative = 0
    """Trie nodes of all of them together, of max_nodes compiled into the beam node."""
    max_nodes: NonNegative = 0
    load_s: float = 0.0
    error: str = ""


Message = (Hello | Ready | ScoreBatch | ScoreResults | BeamBatch | BeamResults | Heartbeat | Error | Shutdown | Goodbye
           | CatalogSwap | CatalogState)
MESSAGE_TYPES: dict[int, type] = {
    cls.TYPE: cls for cls in (Hello, Ready, ScoreBatch, ScoreResults, BeamBatch, BeamResults,
                              Heartbeat, Error, Shutdown, Goodbye, CatalogSwap, CatalogState)
}


# ---- Raw array helpers ------------------------------------------------------------------------

def pack_ids(ids: Sequence[int] | np.ndarray, token_dtype: str = "int32") -> bytes:
    """Token ids as little-endian bytes of `token_dtype` (int32 or int64)."""
    return np.ascontiguousarray(ids, dtype=TOKEN_DTYPES[token_dtype]).tobytes()


def unpack_ids(raw: bytes, token_dtype: str) -> np.ndarray:
    """Inverse of pack_ids; a read-only 1-D view when possible."""
    return np.frombuffer(raw, dtype=TOKEN_DTYPES[token_dtype])
