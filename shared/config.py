"""Deployment configuration: TOML in configs/ decoded by msgspec into frozen, validated dataclasses.

Every process reads the same file. Bounds are declared once, in [bounds], and flow to the compiler,
the worker and the gateway. Facts found at run time (a worker's latency profile) never come back
into config: they travel in messages.

Each field declares its type, its range (`Meta(ge=..., le=...)`) or its choices (`Literal`); msgspec
checks them in C and shared/decode_errors.py words its errors from the same declarations
("bounds.max_beam_width = 401 must be an integer between 1 and 400"). The `validate` methods hold only rules that span fields. Sections
stay dataclasses (not msgspec Structs) so that `dataclasses.replace` on a section keeps working;
msgspec ignores keys a dataclass does not declare, so unknown keys are refused before decoding.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import string
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from shared.bounds import Bounds, InvalidBounds
from shared.decode_errors import Style, locate


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range; the message names the field."""


Dtype = Literal["auto", "float32", "bfloat16", "float16"]
Device = Literal["cpu", "cuda"]
Activation = Literal["relu", "gelu", "silu", "tanh", "sigmoid", "identity"]
Positive = Annotated[int, Meta(ge=1)]
NonNegative = Annotated[int, Meta(ge=0)]


@dataclass(frozen=True)
class ModelConfig:
    """Which checkpoint to serve and in what numeric format."""

    path: str = "models/demo"
    """Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer files)."""
    dtype: Dtype = "auto"
    """float32 | bfloat16 | float16 | auto (the checkpoint's own torch_dtype)."""
    device: Device = "cpu"
    """cpu | cuda: the device the packages are compiled for."""
    gemm: Literal["auto", "aten", "onednn"] = "auto"
    """Kernel of the linear layers (compile/linear.py): onednn (CPU only: oneDNN's matmul, the faster
    float32 kernel on AVX-512 CPUs; docs/design/compilation.md), aten (torch's default: MKL sgemm for
    float32 on a CPU), or auto, chosen per node: onednn for float32 on a CPU with AVX-512 and for
    bfloat16 on one with bfloat16 instructions (weights prepacked at load, worker/runtime/packing.py), aten
    otherwise, but for the beam node's float32 on AVX2 alone (there MKL's sgemm beat prepacked oneDNN
    on the scoring node's thousands of rows and lost on the beam node's hundreds)."""
    fp8: bool = False
    """Selective FP8 (compile/fp8.py): linear layers chosen at build time by measured accuracy loss run
    torch._scaled_mm in float8 e4m3 with offline scales; for GPUs (CUDA, compute capability 8.9+). Off by
    default. A CPU build is accepted, to check an FP8 package's numbers without a GPU: torch runs _scaled_mm on
    the CPU too, but slowly (the build warns); [quantize] int8 is the CPU's fast quantization."""
    fp8_max_prob_change: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.01
    """FP8 budget: largest change of any label probability allowed on the calibration set."""


Nats = Annotated[float, Meta(ge=0.0)]
Share = Annotated[float, Meta(ge=0.0, le=1.0)]


@dataclass(frozen=True)
class QuantizeConfig:
    """Selective int8 for CPU builds (compile/quantize/): the layers, how they are chosen, the gate they must pass."""

    int8: bool = False
    """W8A8 linear layers (int8 weights per channel, int8 activations per token, oneDNN's VNNI GEMM), chosen at
    build time by their measured effect on the label log-probabilities; CPU builds only. Off by default."""
    calibration: str = ""
    """A file of calibration samples, one per line as space-separated token ids (the deployment's own texts,
    tokenized as the gateway does); half of its batches choose the layers, the other half is held out for the
    gate. Empty: random token ids, a last resort the manifest says it used."""
    selection_max_drift: Nats = 0.1
    """Selection budget: the chosen layers together change no label log-probability of the calibration half by
    more than this (nats)."""
    max_label_logprob_drift: Nats = 0.25
    """Gate, on the held-out half: largest change of any label log-probability (nats)."""
    mean_label_logprob_drift: Nats = 0.05
    """Gate: mean change of the label log-probabilities (nats)."""
    min_top1_agreement: Share = 0.9
    """Gate: share of samples whose most likely next token is unchanged."""
    min_rank_agreement: Share = 0.95
    """Gate: share of the pairs of items within a request kept in the same order by the first label."""

    def validate(self) -> None:
        """Refuse limits that switch the gate off (each named, with its ceiling or floor and why)."""
        for name, ceiling in GATE_MAX_NATS.items():
            value = getattr(self, name)
            if value > ceiling:
                raise ConfigError(f"quantize.{name} = {value:g} nats switches the int8 gate off: at most {ceiling:g} "
                                  f"(a label's probability changed {math.exp(ceiling):.1f}x; a wrong model misses by "
                                  f"several nats), default {getattr(QuantizeConfig, name):g}")
        for name, floor in GATE_MIN_SHARES.items():
            value = getattr(self, name)
            if value < floor:
                raise ConfigError(f"quantize.{name} = {value:g} switches the int8 gate off: at least {floor:g} (below, "
                                  f"most samples or pairs may change), default {getattr(QuantizeConfig, name):g}")

    def looser_than_defaults(self) -> list[str]:
        """Each gate limit or budget looser than its default, as a line for the build's warnings."""
        looser = [name for name in GATE_MAX_NATS if getattr(self, name) > getattr(QuantizeConfig, name)]
        looser += [name for name in GATE_MIN_SHARES if getattr(self, name) < getattr(QuantizeConfig, name)]
        return [f"quantize.{name} = {getattr(self, name):g} is looser than the default "
                f"{getattr(QuantizeConfig, name):g}" for name in looser]


GATE_MAX_NATS = {"selection_max_drift": 2.0, "max_label_logprob_drift": 2.0, "mean_label_logprob_drift": 1.0}
"""Ceilings of the int8 budget and gate's drifts (nats): beyond them the gate no longer tells a quantized model
from a broken one (bench/harness/parity.py: a wrong model misses a top-1 log-probability by several nats)."""
GATE_MIN_SHARES = {"min_top1_agreement": 0.5, "min_rank_agreement": 0.5}
"""Floors of the gate's agreements: below half, a model that changes most answers (or orders most pairs of a
request's items otherwise than the float model does) would pass."""


@dataclass(frozen=True)
class MlpHeadConfig:
    """An optional classification head on the last-token hidden state, weights supplied by the user."""

    weights: str
    """safetensors file with tensors layers.{i}.weight [out, in] and layers.{i}.bias [out]."""
    layer_sizes: tuple[int, ...]
    """Widths from the model's hidden size to the number of outputs, e.g. [896, 256, 2]."""
    activation: Activation = "relu"
    """Between layers (not after the last): relu | gelu | silu | tanh | sigmoid | identity."""

    def validate(self) -> None:
        if len(self.layer_sizes) < 2 or any(n < 1 for n in self.layer_sizes):
            raise ConfigError(
                "score.mlp_head.layer_sizes needs at least two positive widths "
                f"(input = hidden size, ..., outputs); got {list(self.layer_sizes)}"
            )


@dataclass(frozen=True)
class ScoreConfig:
    """The prefill-only scoring workload."""

    enabled: bool = True
    mlp_head: MlpHeadConfig | None = None
    prompt_template: str | None = None
    """Optional format string applied by the gateway to each sample, e.g. "Query: {query}\\nDoc: {text}".
    Literal text before its first field is a static prefix: its keys/values are computed once at build
    time and reused by every sample that starts with its tokens."""
    min_shared_prefix_tokens: Positive = 4
    """A request's samples share their longest common token prefix (computed once, exactly) when it
    is at least this long and the request has two or more samples."""
    prefix_cache_mb: Annotated[int, Meta(ge=0, le=1 << 20)] = 256
    """MiB of prefix keys/values each worker keeps across requests (worker/prefix_cache.py; 0: off).
    A run-time setting: it never changes the artifacts' build key."""

    def validate(self) -> None:
        if self.mlp_head is not None:
            self.mlp_head.validate()
        if self.prompt_template is not None:
            try:
                self.prompt_template.format_map({"text": "", "query": ""})
            except (KeyError, IndexError, ValueError) as exc:
                raise ConfigError(f"score.prompt_template {self.prompt_template!r} may only use {{text}} and "
                                  f"{{query}} (a literal brace doubled: {{{{ }}}}): {exc}") from None


@dataclass(frozen=True)
class BeamConfig:
    """The bounded beam-search workload."""

    enabled: bool = True
    constraints: str | None = None
    """Optional catalogue the worker loads at start as the "default" one (constrained decoding for
    generative retrieval): a sequences file (token ids per line, or a .npy padded with -1) or a trie
    file (`python -m shared.catalog convert`). Data, not code: the worker swaps catalogues without a
    rebuild, within the two bounds below."""
    max_catalog_nodes: Annotated[int, Meta(ge=0, le=(1 << 31) - 2)] = 0
    """Trie nodes of every loaded catalogue together that the beam node's tables hold (compiled; its
    inputs have this many rows + 1). 0: no constrained decoding. A catalogue set beyond it is refused."""
    max_catalog_fanout: NonNegative = 0
    """Most children of any trie node (compiled: the edges scanned per beam and step; the node's work
    grows with it). Semantic ids with codebooks of C codes need C."""
    watch_constraints_ms: NonNegative = 2000
    """How often a worker looks at the `constraints` file; when it has changed (rewritten, or replaced by a
    rename), the worker loads it as its new default catalogue between batches. 0: never (updates come
    only through POST /admin/constraints)."""

    def validate(self) -> None:
        nodes, fanout = self.max_catalog_nodes, self.max_catalog_fanout
        if (nodes > 0) != (fanout > 0):
            raise ConfigError(f"beam.max_catalog_nodes = {nodes} and beam.max_catalog_fanout = {fanout}: set both "
                              "(constrained decoding) or neither")
        if nodes == 1:
            raise ConfigError("beam.max_catalog_nodes = 1 holds only a root: a catalogue needs at least 2 nodes")
        if self.constraints and not nodes:
            raise ConfigError(f"beam.constraints = {self.constraints!r} needs beam.max_catalog_nodes and "
                              "beam.max_catalog_fanout, the catalogue table sizes compiled into the beam node "
                              "(`python -m shared.catalog convert` prints a catalogue's nodes and fan-out; "
                              "leave room for the catalogues to come)")


@dataclass(frozen=True)
class WorkerConfig:
    """Worker processes: one per device, reachable over ZeroMQ."""

    endpoints: tuple[str, ...] = ("ipc:///tmp/boundserve-worker-0",)
    """One ZeroMQ endpoint per worker (tcp://host:port or ipc://path); the gateways' workers when
    discovery is static."""
    discovery: Literal["static", "dns"] = "static"
    """How a gateway finds its workers: static (the `endpoints` list) or dns (every address the name
    `service` resolves to, on `service_port`, looked up again every `resolve_interval_ms` and when a
    worker is lost: a scaled StatefulSet behind a headless Service is found without a restart)."""
    service: str = ""
    """discovery = "dns": the DNS name whose A/AAAA records are the workers, e.g. a headless Service's
    boundserve-worker.default.svc.cluster.local (a name without dots goes through the resolver's search list)."""
    service_port: Annotated[int, Meta(ge=1, le=65535)] = 5555
    """discovery = "dns": the port every worker listens on."""
    resolve_interval_ms: Annotated[int, Meta(ge=100, le=3_600_000)] = 5000
    """discovery = "dns": how often the name is looked up again."""
    nameservers: tuple[str, ...] = ()
    """discovery = "dns": the DNS servers asked, each "ip" or "ip:port" ("[ip6]:port"); empty: the
    system's (/etc/resolv.conf)."""
    devices: tuple[str, ...] = ("cpu",)
    """Device of each worker, same order as endpoints: cpu or cuda:N."""
    cpu_threads: Positive = 2
    """Intra-op threads of a CPU worker."""
    num_streams: Annotated[int, Meta(ge=1, le=64)] = 2
    """CUDA streams per worker, one per in-flight batch."""
    max_queued_batches: Positive = 8
    """Batches a worker holds before answering `overloaded`."""
    heartbeat_interval_ms: Annotated[int, Meta(ge=10, le=10_000)] = 100
    """Heartbeats to every gateway that said Hello, this often."""
    warmup_runs: Annotated[int, Meta(ge=0, le=100)] = 2
    """Untimed calls of each node at its smallest shape before profiling (plus one at its largest)."""
    profile_budget_s: Annotated[float, Meta(ge=0.01, le=600)] = 3.0
    """Wall time for measuring the latency profile at start (the grid is cut short when spent)."""
    profile_repeats: Annotated[int, Meta(ge=1, le=100)] = 3
    """Timed calls per grid point; the median is fitted."""
    drain_ack_timeout_ms: Annotated[int, Meta(ge=0, le=600_000)] = 2000
    """A draining worker (SIGTERM, Shutdown) exits once it has answered what it holds and every gateway
    has answered its Goodbye (nothing more is on its way), or this long after the drain began when a
    gateway does not answer (gone, or speaking an older protocol)."""
    max_message_bytes: Annotated[int, Meta(ge=1 << 16, le=1 << 31)] = 64 << 20
    """Largest message a worker accepts; ZeroMQ drops a peer that sends more."""
    resident_limit_mb: Annotated[int, Meta(ge=0)] | None = None
    """CPU worker: when its resident set is above this after a batch, it hands the C heap's free pages back
    to the kernel (worker/memory.py; its next calls fault in what they reuse). Unset: 80 % of the memory
    the process may use (its cgroup's limit, else the machine's); 0: never."""

    def validate(self) -> None:
        if not self.endpoints:
            raise ConfigError("worker.endpoints is empty: a deployment needs at least one worker")
        if len(self.endpoints) != len(self.devices):
            raise ConfigError(
                f"worker.endpoints ({len(self.endpoints)}) and worker.devices ({len(self.devices)}) "
                "must have one entry per worker"
            )
        for endpoint in self.endpoints:
            if not endpoint.startswith(("tcp://", "ipc://")):
                raise ConfigError(f"worker.endpoints: {endpoint!r} must start with tcp:// or ipc://")
        for device in self.devices:
            if device != "cpu" and not (device.startswith("cuda:") and device[5:].isdigit()):
                raise ConfigError(f"worker.devices: {device!r} must be cpu or cuda:N")
        self._validate_discovery()

    def _validate_discovery(self) -> None:
        if self.discovery == "static":
            for name in ("service", "nameservers"):
                if getattr(self, name):
                    raise ConfigError(f"worker.{name} is set but worker.discovery = \"static\" (the endpoints list): "
                                      f"set discovery = \"dns\" to find the workers by name, or remove {name}")
            return
        if not self.service:
            raise ConfigError('worker.discovery = "dns" needs worker.service: the DNS name whose records are the '
                              'workers, e.g. "boundserve-worker.default.svc.cluster.local"')
        if not _is_dns_name(self.service):
            raise ConfigError(f"worker.service = {self.service!r} is not a DNS name (labels of letters, digits and "
                              "hyphens, 63 characters at most, joined by dots; no scheme or port: the port is "
                              "worker.service_port)")
        for server in self.nameservers:
            nameserver_address(server)


def _is_dns_name(name: str) -> bool:
    labels = name.rstrip(".").split(".")
    return len(name) <= 253 and all(
        0 < len(label) <= 63 and label.replace("-", "").isalnum() and label.isascii()
        and not label.startswith("-") and not label.endswith("-") for label in labels)


def nameserver_address(server: str) -> tuple[str, int]:
    """("ip", port) of a worker.nameservers entry: "ip", "ip:port" or "[ip6]:port" (port 53 by default)."""
    host, port = server, "53"
    if server.startswith("["):
        host, _, rest = server[1:].partition("]")
        port = rest.removeprefix(":") if rest.startswith(":") else ("" if rest else "53")
    elif server.count(":") == 1:
        host, port = server.split(":")
    try:
        ipaddress.ip_address(host)
        number = int(port)
        if not 0 < number < 65536:
            raise ValueError(port)
    except ValueError:
        raise ConfigError(f"worker.nameservers: {server!r} must be an IP address, optionally with a port: "
                          '"10.0.0.10", "127.0.0.1:5353", "[::1]:53"') from None
    return host, number


@dataclass(frozen=True)
class GatewayConfig:
    """The HTTP face: listening address, deadlines, batching and admission."""

    host: str = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535)] = 8000
    score_deadline_ms: Positive = 100
    """Route default when a request carries no deadline."""
    generate_deadline_ms: Positive = 200
    max_batch_wait_ms: Annotated[float, Meta(ge=0)] = 2.0
    """Lead time: a partial batch goes to a busy worker this long before it is predicted to be free
    (until then queued requests gather companions), plus the event loop's present lag (the timer
    that sends it fires late by as much); an idle worker gets work at once."""
    admission_margin_ms: Annotated[float, Meta(ge=0)] = 1.0
    """Safety margin added to every predicted finish time."""
    max_queue_tokens: Positive = 65536
    """Token budget of the queue per worker pool; beyond it requests get 429."""
    worker_timeout_ms: Annotated[int, Meta(ge=10)] = 1000
    """Liveness bound: a worker whose connection stops answering ZeroMQ's own heartbeats (libzmq
    answers them, not Python, so a long compiled call does not count) is declared lost within this
    long; a request sent to a worker that never answers gets 504 this long after its deadline."""
    max_body_bytes: Annotated[int, Meta(ge=1024)] = 4 << 20
    auth_token_env: Annotated[str, Meta(min_length=1)] | None = None
    """Name of an environment variable holding a bearer token; unset means no auth (an empty name is
    refused rather than taken for unset)."""
    max_samples_per_request: Annotated[int, Meta(ge=1, le=4096)] = 64
    """Scoring: samples one request may carry; a request larger than a batch is split across batches."""
    max_deadline_ms: Positive = 60_000
    """Largest deadline a request may ask for (body or header)."""
    max_inflight_batches_per_worker: Annotated[int, Meta(ge=1, le=64)] = 2
    """Batches the gateway keeps in flight on one worker; the rest wait in the deadline-ordered queue."""
    tokenize_offload_chars: NonNegative = 16_384
    """Requests with more characters than this are tokenized on a thread, off the event loop (so are
    all requests while several are in progress: the tokenizer then runs beside the loop)."""
    drain_timeout_ms: NonNegative = 10_000
    """On SIGTERM, how long to wait for queued and in-flight requests before stopping."""
    access_log: bool = True
    """One JSON line per request (id, route, status, milliseconds) on stderr."""
    admission: bool = True
    """Refuse at once (503 deadline_unmeetable) a request predicted to finish past its deadline where
    it would run in the queue; false: only the queue budget refuses (for baselines)."""
    drop_predicted_late: bool = True
    """Drop before compute (504) queued work predicted to finish past its deadline, and pack a batch
    only with companions that keep every member in time; false: work is sent until its deadline
    passes in the queue (for baselines)."""
    shed_by_cost: bool = True
    """Under overload (with drop_predicted_late; admission's part with admission): when the queue,
    served in order, cannot finish every request in time, the one that costs the most predicted
    compute per answer is refused (503) or dropped before compute (504) first, not the latest in
    the order, so that more requests are answered in time with the same compute; while every queued
    request is predicted in time it changes nothing. The largest requests are the first shed under
    overload: they are served with the room the cheaper ones leave (docs/design/scheduling.md). False:
    deadline order alone decides what is given up."""
    min_priority: int = -10
    """Smallest `priority` a request may give (body field or X-Priority header); below it: 400."""
    max_priority: int = 10
    """Largest `priority` a request may give; above it: 400. Larger is more important: under
    overload the lower priorities are refused or shed first; a request without one has 0."""
    queue_order: Literal["deadline", "arrival"] = "deadline"
    """Serving order of the queue: deadline (earliest deadline first) or arrival (first come, first
    served; for baselines). Either way a request expires (504) when its deadline passes in the queue."""

    def validate(self) -> None:
        if not self.min_priority <= 0 <= self.max_priority:
            raise ConfigError(f"gateway.min_priority = {self.min_priority} and gateway.max_priority = "
                              f"{self.max_priority} must hold 0, the priority of a request that gives none")
        for name in ("score_deadline_ms", "generate_deadline_ms"):
            if getattr(self, name) > self.max_deadline_ms:
                raise ConfigError(f"gateway.{name} = {getattr(self, name)} is over gateway.max_deadline_ms = "
                                  f"{self.max_deadline_ms}: a route's default deadline must be one a request may ask for")


QWEN3_RERANKER_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"
    "<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
    "<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
"""The Qwen3-Reranker recipe's prompt (its model card: system message, instruction, query, document,
then an empty thinking block), as one str.format template; the answer is the next token, "yes" or "no"."""


@dataclass(frozen=True)
class RerankConfig:
    """The rerank routes (/v1/rerank, /v2/rerank, /rerank): a generative reranker. Each document is
    scored as `template` with its {query} and {document} filled in; its relevance is the probability of
    the first label at the prompt's last token: P(yes) under the whole vocabulary with one label, or
    P(yes) / (P(yes) + P(no)) with two. With the query before the document, every document's prompt
    starts with the same tokens, which the scoring path computes once per batch (gateway/sharing.py)."""

    template: str = QWEN3_RERANKER_TEMPLATE
    """A str.format template with exactly the fields {query} and {document} (a literal brace doubled)."""
    labels: tuple[str, ...] = ("yes", "no")
    """The relevant label, then optionally the irrelevant one; each one token of the checkpoint's tokenizer."""

    def validate(self) -> None:
        try:
            fields = {name for _, name, _, _ in string.Formatter().parse(self.template) if name is not None}
            self.template.format_map({"query": "", "document": ""})
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"rerank.template may only use {{query}} and {{document}} (a literal brace doubled: "
                              f"{{{{ }}}}): {exc}") from None
        if fields != {"query", "document"}:
            raise ConfigError(f"rerank.template must use both {{query}} and {{document}}; it uses "
                              f"{sorted(fields) or 'no field'}")
        if not 1 <= len(self.labels) <= 2 or len(set(self.labels)) != len(self.labels):
            raise ConfigError(f"rerank.labels must be one label (relevant) or two distinct ones (relevant, irrelevant); "
                              f"got {list(self.labels)}")


@dataclass(frozen=True)
class EmbeddingsConfig:
    """/v1/embeddings: the final-norm hidden state the scoring node returns for each input."""

    pooling: Literal["last", "mean"] = "last"
    """last: the hidden state at the last token (transformers' last_hidden_state[:, -1]). mean is
    refused: the compiled scoring node returns only each sample's last position (compile/score/module.py),
    so a mean over the tokens is not something it can provide."""

    def validate(self) -> None:
        if self.pooling == "mean":
            raise ConfigError("embeddings.pooling = \"mean\" is not available: the compiled scoring node returns the "
                              "hidden state at each sample's last token only (compile/score/module.py), not every "
                              "token's; use \"last\"")


@dataclass(frozen=True)
class TelemetryConfig:
    """OpenTelemetry traces of the gateway's requests (gateway/telemetry.py), exported over OTLP/HTTP.
    Off by default; off, no span is made and nothing is imported."""

    enabled: bool = False
    endpoint: str = "http://127.0.0.1:4318/v1/traces"
    """The OTLP/HTTP traces endpoint (protobuf), e.g. an OpenTelemetry Collector's or Jaeger's port 4318."""
    service_name: Annotated[str, Meta(min_length=1)] = "boundserve-gateway"
    export_timeout_ms: Annotated[int, Meta(ge=10, le=60_000)] = 2000
    max_queue_spans: Annotated[int, Meta(ge=16, le=1 << 20)] = 8192
    """Spans held for export; beyond it new spans are dropped (the exporter logs how many), never the serving."""
    sample_ratio: Annotated[float, Meta(ge=0.0, le=1.0)] = 1.0
    """The share of new traces recorded (gateway/trace_context.py RatioSampler: parent-based, so a request
    with a caller's traceparent follows the caller's sampled flag instead)."""

    def validate(self) -> None:
        if not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"telemetry.endpoint {self.endpoint!r} must be an http:// or https:// URL (OTLP/HTTP)")


@dataclass(frozen=True)
class DeploymentConfig:
    """One deployment: the model, its bounds, the workloads and the processes that serve them."""

    name: str = "demo"
    model: ModelConfig = field(default_factory=ModelConfig)
    bounds: Bounds | None = None
    """[bounds]: shared/bounds.py declares them. The build compiles them into the packages (the defaults
    where the table is left out: `build_bounds`); at run time the compiled bounds are the only ones, and a
    gateway or worker refuses a config whose [bounds] differ from them (leave [bounds] out to serve
    whatever the artifacts were compiled for)."""
    score: ScoreConfig = field(default_factory=ScoreConfig)
    beam: BeamConfig = field(default_factory=BeamConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    quantize: QuantizeConfig = field(default_factory=QuantizeConfig)
    rerank: RerankConfig = field(default_factory=RerankConfig)
    embeddings: EmbeddingsConfig = field(default_factory=EmbeddingsConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if hasattr(value, "validate"):
                try:
                    value.validate()
                except InvalidBounds as exc:
                    raise ConfigError(str(exc)) from None
        kinds = sorted({device.split(":")[0] for device in self.worker.devices})
        if kinds != [self.model.device]:
            raise ConfigError(f"worker.devices {list(self.worker.devices)} do not match model.device = "
                              f"{self.model.device!r}: the packages are compiled for one kind of device, the one every "
                              "worker runs them on")
        if not (self.score.enabled or self.beam.enabled):
            raise ConfigError("at least one of score.enabled and beam.enabled must be true")
        if self.quantize.int8 and self.model.device != "cpu":
            raise ConfigError(f"quantize.int8 = true is for CPU builds (oneDNN's int8 GEMMs); model.device is "
                              f"{self.model.device!r}: GPUs quantize with model.fp8 = true")
        if self.quantize.int8 and self.model.fp8:
            raise ConfigError("quantize.int8 and model.fp8 are both true: choose one quantization")

    @property
    def build_bounds(self) -> Bounds:
        """The bounds a build compiles: [bounds] as declared, the defaults where it is left out."""
        return self.bounds if self.bounds is not None else Bounds()

    def replace(self, **sections: typing.Any) -> DeploymentConfig:
        """A copy with whole sections or fields replaced, decoded and validated again (types and
        ranges too: a section built with dataclasses.replace has not been checked by msgspec)."""
        return _from_builtins(msgspec.to_builtins(dataclasses.replace(self, **sections)))


def load_config(path: str | Path) -> DeploymentConfig:
    """Read and validate a TOML deployment config."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: a folder, not a config file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text, as TOML must be: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(raw, source=str(path))


def parse_config(raw: dict[str, typing.Any], source: str = "<config>") -> DeploymentConfig:
    """Decode a TOML-shaped dict into a validated DeploymentConfig."""
    try:
        return _from_builtins(raw)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


TOML = Style(root="", whole="the config", field="key", object="a table")
"""How config errors name things: `bounds.max_top_k`, keys and tables."""


def _from_builtins(raw: typing.Any) -> DeploymentConfig:
    _refuse_unknown_keys(_SCHEMA, raw, "")
    try:
        config = msgspec.convert(raw, DeploymentConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(locate(exc, DeploymentConfig, raw).message(TOML)) from None
    config.validate()
    return config


Schema = msgspec.inspect.Type
_SCHEMA = msgspec.inspect.type_info(DeploymentConfig)


def _table(info: Schema) -> msgspec.inspect.DataclassType | None:
    """The section type of `info` (an optional section is a union with None), else None."""
    for option in getattr(info, "types", (info,)):
        if isinstance(option, msgspec.inspect.DataclassType):
            return option
    return None


def _refuse_unknown_keys(info: Schema, raw: typing.Any, prefix: str) -> None:
    """msgspec skips keys a dataclass does not declare; refuse them, naming them and the known ones."""
    table = _table(info)
    if table is None or not isinstance(raw, dict):
        return  # a value, or a non-table where a table belongs (msgspec names that)
    fields = {f.name: f.type for f in table.fields}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(prefix + k for k in unknown)} in {prefix.rstrip('.') or 'top level'}; "
            f"known keys: {', '.join(sorted(fields))}"
        )
    for name, value in raw.items():
        _refuse_unknown_keys(fields[name], value, f"{prefix}{name}.")

