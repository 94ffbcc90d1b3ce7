"""The artifacts' manifest (`manifest.json`), declared once: written by the build (compile/build.py),
read by `read_manifest` alone — in the worker, the gateway, loadgen and bench.

The manifest is the contract between the build and everything that serves or measures its packages:
the bounds they were compiled for, the model's facts, each node's package and facts, the weights
file and the machine they run on. Fields an older manifest lacks keep the defaults the readers
always tolerated (no max_prefix_tokens, no static prefix, no gemm). Pure Python: no torch.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from shared.bounds import Bounds
from shared.decode_errors import Style, locate

if TYPE_CHECKING:
    from shared.config import DeploymentConfig

MANIFEST = "manifest.json"
FORMAT_VERSION = 3
"""3: weights prepacked at load (`prepacked`); 2: attention in the graph, the CPU thread count
recorded (1 called Python operators)."""

JSON = Style(root="", whole="the manifest", field="key", object="an object")
"""How manifest errors name things: `bounds.max_top_k`, `nodes.score.sha256`."""


class ManifestError(ValueError):
    """A manifest that is missing, not JSON, or not the declared shape; the message names the key."""


class Fact(msgspec.Struct, frozen=True, kw_only=True):
    """A record inside the manifest: JSON keys are the field names."""


class ModelFacts(Fact):
    """The checkpoint's shapes and options (compile/checkpoint.ModelSpec) and where it came from."""

    vocab_size: int | None = None
    """None only in a hand-written manifest (the gateway then takes its tokenizer's)."""
    family: str = ""
    hidden_size: int = 0
    intermediate_size: int = 0
    num_layers: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    rms_norm_eps: float = 0.0
    rope: dict[str, Any] = {}
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    dtype: str = ""
    """The checkpoint's own dtype (the packages' is Manifest.dtype)."""
    max_position_embeddings: int = 0
    path: str = ""
    sha256: str = ""


class NodeFacts(Fact):
    """One compiled node: its package file and hash, and the attention block its token axis is
    padded to (compile/attention.py)."""

    package: str = ""
    sha256: str = ""
    attention_block: int = 0
    gemm: str = ""
    """The kernel its linear layers call (compile/linear.py; each node its own: "auto" may differ by
    node); "": not recorded (a manifest from before it was per node, or hand-written)."""


class ScoreNodeFacts(NodeFacts):
    """The scoring node: its outputs and the static prefix whose keys/values the package holds."""

    outputs: tuple[str, ...] = ()
    static_prefix_ids: tuple[int, ...] = ()
    """The template header's tokens (empty: none); the gateway marks samples that start with them."""


class BeamNodeFacts(NodeFacts):
    """The beam node: the generation config it was compiled under and its catalogue table sizes."""

    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    max_steps: int = 0
    eos_ids: tuple[int, ...] = ()
    pad_id: int = 0
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    repetition_penalty: float = 1.0
    constrained: bool = False
    """The node takes catalogue tables as inputs (compile/beam/module.py's CATALOG_INPUT_NAMES)."""
    max_catalog_nodes: int = 0
    """Trie nodes its tables hold, every loaded catalogue together ([beam] max_catalog_nodes)."""
    max_catalog_fanout: int = 0
    """Most children of any trie node it scans ([beam] max_catalog_fanout)."""


class NodeTable(Fact, omit_defaults=True):
    """The nodes built, by workload (an absent one was not built)."""

    score: ScoreNodeFacts | None = None
    beam: BeamNodeFacts | None = None

    def workloads(self) -> tuple[str, ...]:
        return tuple(w for w in ("score", "beam") if getattr(self, w) is not None)

    def items(self) -> list[tuple[str, NodeFacts]]:
        return [(w, getattr(self, w)) for w in self.workloads()]


class WeightsFile(Fact):
    """The one weights file every node of the folder shares."""

    file: str
    sha256: str


class KernelLibrary(Fact):
    """The C++ kernel library the folder's CPU packages call (worker/runtime/kernels), loaded before them."""

    file: str
    sha256: str
    operators: tuple[str, ...] = ()
    """The operators the packages call, e.g. boundserve::packed_attention."""


class Manifest(Fact):
    """What one artifacts folder holds and was built for."""

    model: ModelFacts = ModelFacts()
    bounds: Bounds | None = None
    """The bounds the packages were compiled for (None: a hand-written manifest without them, which the
    gateway refuses to serve: the compiled bounds are the only ones at run time). A max_prefix_tokens
    over a sample is read as a sample's length (Bounds.limit), as readers always did."""
    nodes: NodeTable | None = None
    """None or empty: a hand-written manifest that names no nodes (every configured workload is served)."""
    format_version: int = 0
    """What the build wrote (FORMAT_VERSION); 0: not recorded (a hand-written manifest)."""
    name: str = ""
    build_key: str = ""
    built_at: str = ""
    dtype: str = ""
    prepacked: dict[str, str] = {}
    """Weights the runtime packs once at load into their kernel's layout, by name: the packing kind
    (worker/runtime/packing.py); absent: none packed."""
    machine: dict[str, str] = {}
    """torch version, device type, machine, CPU ISA or GPU architecture (worker/runtime/machine.py)."""
    cpu_threads: int | None = None
    """The intra-op threads a CPU package was compiled for (None: a CUDA package, or a manifest from
    before the attention kernel sized its buffers by them)."""
    fp8: dict[str, Any] | None = None
    quantize: dict[str, Any] | None = None
    """[quantize] int8: the layers made int8, the calibration and the drift the gate measured
    (compile/quantize/build_step.py); None: no int8 layer."""
    weights: WeightsFile | None = None
    kernels: KernelLibrary | None = None
    """None: the packages call no kernel of ours (a GPU or AMX build, float32, or an older manifest)."""
    runner: KernelLibrary | None = None
    """The library the CPU packages are run through (worker/runtime/package_runner.py), loaded before them;
    None: torch's own loader runs them (a GPU build, or one from before the runner)."""
    tokenizer_files: tuple[str, ...] = ()
    config: dict[str, Any] = {}
    """The deployment config the build ran with, as built-ins."""

    def serves(self, workload: str) -> bool:
        """Whether the folder holds `workload`'s node (a manifest naming no nodes holds every one)."""
        return self.nodes is None or not self.nodes.workloads() or getattr(self.nodes, workload) is not None

    def node_table(self) -> NodeTable:
        return self.nodes or NodeTable()


def parse_manifest(raw: bytes | str, source: str = MANIFEST) -> Manifest:
    """Decode and check manifest JSON; ManifestError names `source` and the bad key."""
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ManifestError(f"{source}: not valid JSON: {exc}") from None
    try:
        manifest = msgspec.convert(data, Manifest)
    except msgspec.ValidationError as exc:
        raise ManifestError(f"{source}: {locate(exc, Manifest, data).message(JSON)}") from None
    return manifest


def read_manifest(folder: str | Path) -> Manifest:
    """The manifest of an artifacts folder: the one place a manifest is read."""
    path = Path(folder) / MANIFEST
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError(f"{path} not found: build the artifacts first with "
                            f"`python -m compile --config ... --out {folder}`") from None
    return parse_manifest(raw, str(path))


def bounds_differences(manifest: Manifest, config: DeploymentConfig) -> list[str]:
    """Each bound of `config` that differs from what the packages were compiled for, in words (empty:
    they agree, the config leaves [bounds] out, or the manifest records no bounds). The compiled bounds are
    the only ones at run time: gateway and worker refuse a config that says otherwise, rather than let an
    edited [bounds] seem to take effect without a rebuild."""
    if manifest.bounds is None or config.bounds is None:
        return []
    wanted = config.bounds.resolved()
    return [f"bounds.{f.name} = {getattr(wanted, f.name)}, compiled for {getattr(manifest.bounds, f.name)}"
            for f in dataclasses.fields(Bounds) if getattr(wanted, f.name) != getattr(manifest.bounds, f.name)]


def threads_difference(manifest: Manifest, config: DeploymentConfig) -> str | None:
    """Why a CPU worker of `config` cannot run these packages, when its thread count is not the one they
    were compiled for (compile/build.py sizes their buffers by it); None when it is."""
    if manifest.cpu_threads == config.worker.cpu_threads:
        return None
    return (f"the artifacts were compiled for {manifest.cpu_threads} CPU thread(s) per call but [worker] "
            f"cpu_threads = {config.worker.cpu_threads}; set cpu_threads = {manifest.cpu_threads} or rebuild the "
            "artifacts with this config")


def manifest_json(manifest: Manifest) -> bytes:
    """The manifest as the build writes it: indented JSON."""
    return msgspec.json.format(msgspec.json.encode(manifest), indent=2)
