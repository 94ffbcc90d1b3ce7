"""Deployment configuration: TOML in configs/ decoded into frozen, validated dataclasses.

Every process reads the same file. Bounds are declared once, in [bounds], and flow to the compiler,
the worker and the gateway. Facts found at run time (a worker's latency profile) never come back
into config: they travel in messages.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path


class ConfigError(ValueError):
    """A configuration value is missing, unknown or out of range; the message names the field."""


DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda")
ACTIVATIONS = ("relu", "gelu", "silu", "tanh", "sigmoid", "identity")


@dataclass(frozen=True)
class ModelConfig:
    """Which checkpoint to serve and in what numeric format."""

    path: str = "models/demo"
    """Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer files)."""
    dtype: str = "auto"
    """float32 | bfloat16 | float16 | auto (the checkpoint's own torch_dtype)."""
    device: str = "cpu"
    """cpu | cuda: the device the packages are compiled for."""
    fp8: bool = False
    """Selective FP8 (compile/fp8.py): linear layers chosen at build time by measured accuracy loss
    run torch._scaled_mm in float8 e4m3 with offline scales. Off by default."""
    fp8_max_prob_change: float = 0.01
    """FP8 budget: largest change of any label probability allowed on the calibration set."""

    def validate(self) -> None:
        _check_choice("model.dtype", self.dtype, DTYPES)
        _check_choice("model.device", self.device, DEVICES)
        _check_range("model.fp8_max_prob_change", self.fp8_max_prob_change, 0.0, 1.0)


@dataclass(frozen=True)
class BoundsConfig:
    """The deployment's limits, compiled into the packages and enforced by worker and gateway."""

    max_samples_per_batch: int = 16
    """Scoring: samples (sequences) in one packed batch."""
    max_tokens_per_sample: int = 512
    """Scoring: tokens in one sample."""
    max_tokens_per_batch: int = 4096
    """Scoring: tokens in one packed batch, all samples together."""
    max_labels: int = 32
    """Scoring: label token ids per batch."""
    max_top_k: int = 20
    """Scoring: largest top_k a request may ask for."""
    max_prompt_tokens: int = 512
    """Beam search: tokens in one prompt."""
    max_beam_width: int = 400
    """Beam search: beams per request (W)."""
    max_new_tokens: int = 4
    """Beam search: decode steps per request (S), at most 5."""
    max_beam_requests_per_batch: int = 4
    """Beam search: requests (prompts) in one batch."""
    max_prefix_tokens: int | None = None
    """Scoring: tokens of a request's shared prefix, computed once for all its samples (unset = the
    same as max_tokens_per_sample). A longer common prefix is computed unshared, never cut."""

    def resolved(self) -> dict[str, int]:
        """Every bound as a plain int (unset ones resolved): what the manifest and the wire carry."""
        values = dataclasses.asdict(self)
        if self.max_prefix_tokens is None:
            values["max_prefix_tokens"] = self.max_tokens_per_sample
        return values

    def validate(self) -> None:
        for name, value in self.resolved().items():
            _check_range(f"bounds.{name}", value, 1, None)
        _check_range("bounds.max_prefix_tokens", self.resolved()["max_prefix_tokens"], 1, self.max_tokens_per_sample)
        _check_range("bounds.max_samples_per_batch", self.max_samples_per_batch, 2, None)
        _check_range("bounds.max_new_tokens", self.max_new_tokens, 1, 5)
        _check_range("bounds.max_beam_width", self.max_beam_width, 1, 400)
        if self.max_tokens_per_sample > self.max_tokens_per_batch:
            raise ConfigError(
                "bounds.max_tokens_per_sample must not exceed bounds.max_tokens_per_batch "
                f"({self.max_tokens_per_sample} > {self.max_tokens_per_batch})"
            )


@dataclass(frozen=True)
class MlpHeadConfig:
    """An optional classification head on the last-token hidden state, weights supplied by the user."""

    weights: str
    """safetensors file with tensors layers.{i}.weight [out, in] and layers.{i}.bias [out]."""
    layer_sizes: tuple[int, ...]
    """Widths from the model's hidden size to the number of outputs, e.g. [896, 256, 2]."""
    activation: str = "relu"
    """Between layers (not after the last): relu | gelu | silu | tanh | sigmoid | identity."""

    def validate(self) -> None:
        _check_choice("score.mlp_head.activation", self.activation, ACTIVATIONS)
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
    min_shared_prefix_tokens: int = 4
    """A request's samples share their longest common token prefix (computed once, exactly) when it
    is at least this long and the request has two or more samples."""

    def validate(self) -> None:
        _check_range("score.min_shared_prefix_tokens", self.min_shared_prefix_tokens, 1, None)
        if self.mlp_head is not None:
            self.mlp_head.validate()


@dataclass(frozen=True)
class BeamConfig:
    """The bounded beam-search workload."""

    enabled: bool = True
    constraints: str | None = None
    """Optional file of valid output sequences (constrained decoding for generative retrieval)."""

    def validate(self) -> None:
        pass


@dataclass(frozen=True)
class WorkerConfig:
    """Worker processes: one per device, reachable over ZeroMQ."""

    endpoints: tuple[str, ...] = ("ipc:///tmp/boundserve-worker-0",)
    """One ZeroMQ endpoint per worker (tcp://host:port or ipc://path)."""
    devices: tuple[str, ...] = ("cpu",)
    """Device of each worker, same order as endpoints: cpu or cuda:N."""
    cpu_threads: int = 2
    """Intra-op threads of a CPU worker."""
    num_streams: int = 2
    """CUDA streams per worker, one per in-flight batch."""
    max_queued_batches: int = 8
    """Batches a worker holds before answering `overloaded`."""
    heartbeat_interval_ms: int = 100
    """Heartbeats to every gateway that said Hello, this often."""
    warmup_runs: int = 2
    """Untimed calls of each node at its smallest shape before profiling (plus one at its largest)."""
    profile_budget_s: float = 3.0
    """Wall time for measuring the latency profile at start (the grid is cut short when spent)."""
    profile_repeats: int = 3
    """Timed calls per grid point; the median is fitted."""
    max_message_bytes: int = 64 << 20
    """Largest message a worker accepts; ZeroMQ drops a peer that sends more."""

    def validate(self) -> None:
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
        _check_range("worker.cpu_threads", self.cpu_threads, 1, None)
        _check_range("worker.num_streams", self.num_streams, 1, 64)
        _check_range("worker.max_queued_batches", self.max_queued_batches, 1, None)
        _check_range("worker.heartbeat_interval_ms", self.heartbeat_interval_ms, 10, 10_000)
        _check_range("worker.warmup_runs", self.warmup_runs, 0, 100)
        _check_range("worker.profile_budget_s", self.profile_budget_s, 0.01, 600)
        _check_range("worker.profile_repeats", self.profile_repeats, 1, 100)
        _check_range("worker.max_message_bytes", self.max_message_bytes, 1 << 16, 1 << 31)


@dataclass(frozen=True)
class GatewayConfig:
    """The HTTP face: listening address, deadlines, batching and admission."""

    host: str = "127.0.0.1"
    port: int = 8000
    score_deadline_ms: int = 100
    """Route default when a request carries no deadline."""
    generate_deadline_ms: int = 200
    max_batch_wait_ms: float = 2.0
    """Lead time: a partial batch goes to a busy worker this long before it is predicted to be free
    (until then queued requests gather companions); an idle worker gets work at once."""
    admission_margin_ms: float = 1.0
    """Safety margin added to every predicted finish time."""
    max_queue_tokens: int = 65536
    """Token budget of the queue per worker pool; beyond it requests get 429."""
    worker_timeout_ms: int = 1000
    """Liveness bound: a worker whose connection stops answering ZeroMQ's own heartbeats (libzmq
    answers them, not Python, so a long compiled call does not count) is declared lost within this
    long; a request sent to a worker that never answers gets 504 this long after its deadline."""
    max_body_bytes: int = 4 << 20
    auth_token_env: str | None = None
    """Name of an environment variable holding a bearer token; unset means no auth."""
    max_samples_per_request: int = 64
    """Scoring: samples one request may carry; a request larger than a batch is split across batches."""
    max_deadline_ms: int = 60_000
    """Largest deadline a request may ask for (body or header)."""
    max_inflight_batches_per_worker: int = 2
    """Batches the gateway keeps in flight on one worker; the rest wait in the deadline-ordered queue."""
    tokenize_offload_chars: int = 16_384
    """Requests with more characters than this are tokenized on a thread, off the event loop (so are
    all requests while several are in progress: the tokenizer then runs beside the loop)."""
    drain_timeout_ms: int = 10_000
    """On SIGTERM, how long to wait for queued and in-flight requests before stopping."""
    access_log: bool = True
    """One JSON line per request (id, route, status, milliseconds) on stderr."""
    admission: bool = True
    """false: no deadline predictions (no deadline_unmeetable, no predicted-late drop): first come first
    served within max_queue_tokens, requests still expire at their deadline; for baselines."""

    def validate(self) -> None:
        _check_range("gateway.port", self.port, 0, 65535)
        _check_range("gateway.max_samples_per_request", self.max_samples_per_request, 1, 4096)
        _check_range("gateway.max_deadline_ms", self.max_deadline_ms, 1, None)
        _check_range("gateway.max_inflight_batches_per_worker", self.max_inflight_batches_per_worker, 1, 64)
        _check_range("gateway.tokenize_offload_chars", self.tokenize_offload_chars, 0, None)
        _check_range("gateway.drain_timeout_ms", self.drain_timeout_ms, 0, None)
        _check_range("gateway.score_deadline_ms", self.score_deadline_ms, 1, None)
        _check_range("gateway.generate_deadline_ms", self.generate_deadline_ms, 1, None)
        _check_range("gateway.worker_timeout_ms", self.worker_timeout_ms, 10, None)
        _check_range("gateway.max_body_bytes", self.max_body_bytes, 1024, None)
        _check_range("gateway.max_queue_tokens", self.max_queue_tokens, 1, None)
        if self.max_batch_wait_ms < 0 or self.admission_margin_ms < 0:
            raise ConfigError("gateway.max_batch_wait_ms and gateway.admission_margin_ms must be >= 0")


@dataclass(frozen=True)
class DeploymentConfig:
    """One deployment: the model, its bounds, the workloads and the processes that serve them."""

    name: str = "demo"
    model: ModelConfig = field(default_factory=ModelConfig)
    bounds: BoundsConfig = field(default_factory=BoundsConfig)
    score: ScoreConfig = field(default_factory=ScoreConfig)
    beam: BeamConfig = field(default_factory=BeamConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if hasattr(value, "validate"):
                value.validate()
        if not (self.score.enabled or self.beam.enabled):
            raise ConfigError("at least one of score.enabled and beam.enabled must be true")

    def replace(self, **sections: typing.Any) -> DeploymentConfig:
        """A copy with whole sections or fields replaced, validated again."""
        config = dataclasses.replace(self, **sections)
        config.validate()
        return config


def load_config(path: str | Path) -> DeploymentConfig:
    """Read and validate a TOML deployment config."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(raw, source=str(path))


def parse_config(raw: dict[str, typing.Any], source: str = "<config>") -> DeploymentConfig:
    """Decode a TOML-shaped dict into a validated DeploymentConfig."""
    try:
        config = _decode(DeploymentConfig, raw, prefix="")
        config.validate()
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return config


def _decode(cls: type, raw: typing.Any, prefix: str) -> typing.Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix or 'config'} must be a table, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        where = prefix.rstrip(".") or "top level"
        raise ConfigError(
            f"unknown key(s) {', '.join(prefix + k for k in unknown)} in {where}; "
            f"known keys: {', '.join(sorted(fields))}"
        )
    values = {}
    for name, value in raw.items():
        values[name] = _coerce(hints[name], value, prefix + name)
    missing = [
        n for n, f in fields.items()
        if n not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"missing required key(s): {', '.join(prefix + n for n in missing)}")
    return cls(**values)


def _coerce(hint: typing.Any, value: typing.Any, name: str) -> typing.Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, name)
    if dataclasses.is_dataclass(hint):
        return _decode(hint, value, name + ".")
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(f"{name} must be a list, got {value!r}")
        return tuple(_coerce(args[0], v, f"{name}[{i}]") for i, v in enumerate(value))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, bool) or not isinstance(value, hint):
        raise ConfigError(f"{name} must be {hint.__name__}, got {value!r}")
    return value


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} = {value!r} is not one of {', '.join(choices)}")


def _check_range(name: str, value: float, low: float | None, high: float | None) -> None:
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        raise ConfigError(f"{name} = {value} must be {bounds}")
