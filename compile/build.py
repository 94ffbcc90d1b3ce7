"""The offline build chain: checkpoint -> exported nodes -> AOTInductor packages + manifest.

Each enabled workload has a node builder that returns an exported program; every node holds the
same Transformer under the attribute `model`, so their constants share names and the worker loads
one weights file for all of them. Nothing here runs on the request path.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file

from worker.runtime import kernels, package_runner
from worker.runtime.artifacts import FORMAT_VERSION, MANIFEST, WEIGHTS, file_hash
from compile.beam import module as beam_module
from compile.beam.inputs import BeamInputs, read_inputs
from compile.context import BuildContext, NodeBuilder
from compile.checkpoint import (DTYPES, TOKENIZER_FILES, ModelSpec, checkpoint_hash, load_checkpoint,
                               read_spec)
from compile.fp8 import fp8_for_build
from compile.linear import onednn_bf16, resolve_gemm, use_gemm
from worker.runtime.machine import machine_facts
from compile.model import build_model
from worker.runtime.packing import combine, packable
from compile.quantize.build_step import int8_for_build
from compile.score import export as score_export
from shared.config import DeploymentConfig
from shared.manifest import Manifest, ManifestError, parse_manifest, read_manifest

NODE_BUILDERS: dict[str, NodeBuilder] = {"score": score_export.build, "beam": beam_module.build}


def enabled_workloads(config: DeploymentConfig) -> list[str]:
    return [name for name, on in (("score", config.score.enabled), ("beam", config.beam.enabled)) if on]


def check_positions(config: DeploymentConfig, spec: ModelSpec) -> None:
    """Refuse bounds that would place a token past the model's positions (its RoPE table ends there)."""
    bounds = config.build_bounds
    reach = [(bounds.max_tokens_per_sample, "bounds.max_tokens_per_sample")] if config.score.enabled else []
    if config.beam.enabled:
        reach.append((bounds.max_prompt_tokens + bounds.max_new_tokens,
                      "bounds.max_prompt_tokens + bounds.max_new_tokens"))
    for tokens, what in reach:
        if tokens > spec.max_position_embeddings:
            raise ValueError(f"{what} = {tokens} tokens, more than the model's max_position_embeddings "
                             f"({spec.max_position_embeddings}, {config.model.path}/config.json)")


def check_inputs(config: DeploymentConfig, spec: ModelSpec) -> BeamInputs | None:
    """Refuse bad input before any work: bounds past the model's positions, a workload without a builder,
    a missing input file of an enabled feature, a checkpoint without tokenizer.json, the beam node's
    generation config and constraints. Each would otherwise be found after minutes of compiling. Returns
    the beam node's inputs as read (None: beam off), for its builder."""
    check_positions(config, spec)
    missing = [w for w in enabled_workloads(config) if w not in NODE_BUILDERS]
    if missing:
        raise ValueError(f"workload(s) {', '.join(missing)} enabled in the config but no node builder exists")
    for setting, path in input_files(config).items():
        if path:
            input_file(setting, path)
    tokenizer_files(Path(config.model.path))
    return read_inputs(config, spec.vocab_size) if config.beam.enabled else None


def input_files(config: DeploymentConfig) -> dict[str, str | None]:
    """The files the build reads besides the checkpoint, by setting; None where unset or where the feature
    is off: a disabled feature's file is never read (nor counted in the build key), even when named."""
    head = config.score.mlp_head
    return {"score.mlp_head.weights": head.weights if head and config.score.enabled else None,
            "beam.constraints": config.beam.constraints if config.beam.enabled else None,
            "quantize.calibration": config.quantize.calibration if config.quantize.int8 else None}


RUN_TIME_FILES = ("beam.constraints",)
"""Input files the build only checks (the catalogue must fit the compiled tables); the worker loads them
and the artifacts do not depend on their content, so they are not in the build key."""


def input_file(setting: str, path: str) -> Path:
    """The file a setting names, refused naming the setting when it is not there."""
    file = Path(path)
    if not file.is_file():
        where = "" if file.is_absolute() else f" (a relative path: from {Path.cwd()})"
        problem = "is a folder, not a file" if file.is_dir() else "no such file"
        raise ValueError(f"{setting} = {path!r}: {problem}{where}")
    return file


def check_out(out: Path) -> None:
    """Refuse an artifacts folder that is an existing file, or inside one, before it is read as a folder."""
    existing = next(p for p in (out, *out.parents) if p.exists())
    if existing == out and not out.is_dir():
        raise ValueError(f"{out}: is a file, not an artifacts folder")
    if not existing.is_dir():
        raise ValueError(f"{out}: cannot be created as an artifacts folder: {existing} is a file")


class Progress:
    """Prints which stage runs and the elapsed time, to stderr."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def stage(self, message: str) -> None:
        print(f"[compile {time.monotonic() - self.start:6.1f}s] {message}", file=sys.stderr, flush=True)


STAGING = ".building"


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A fresh folder `out/.building` where a build writes every file; `install` moves them into out
    when all are written. Entered before the checkpoint loads, so an artifacts folder that cannot be
    written is refused up front.

    Why staging: a build that fails (bad input found late, a compiler error, Ctrl-C) leaves out as it
    was, the previous artifacts still whole and usable, instead of new packages next to old weights;
    the staging folder is removed on the way out (one left by a killed build is cleared by the next).
    It sits inside out, not beside it, so its files are on out's file system even when out is a mount
    point, and each move is one atomic rename. Files of the old build that the new one does not write
    (a node since disabled) stay, unused: the manifest names the files that count.
    """
    created = not out.exists()
    staging = out / STAGING
    try:
        out.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
    except OSError as exc:
        raise ValueError(f"{out}: cannot write the artifacts folder ({exc.strerror}: {exc.filename})") from None
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # a failed first build leaves no folder behind


def install(staging: Path, out: Path, stale: tuple[str, ...] = ()) -> None:
    """Move the staged files into out, the manifest last, and remove `stale` files of the old build. The
    old manifest goes first, so that no moment shows a manifest next to files it does not describe."""
    (out / MANIFEST).unlink(missing_ok=True)
    for name in stale:
        (out / name).unlink(missing_ok=True)
    for file in sorted(staging.iterdir()):
        if file.name != MANIFEST:
            os.replace(file, out / file.name)
    os.replace(staging / MANIFEST, out / MANIFEST)


def build(config: DeploymentConfig, out_dir: str | Path, force: bool = False, kernel_profile: bool = False,
          builders: dict[str, NodeBuilder] | None = None) -> Manifest:
    """Build every enabled node into out_dir; skip the work when the artifacts are up to date.
    Bad input is refused before any work (check_inputs); a failed build leaves out_dir as it was (staged).
    kernel_profile: the CPU kernels report themselves to torch.profiler (bench/profile_nodes.py).
    builders: node builders replacing NODE_BUILDERS' by workload (a benchmark's variant of a node; what
    they build is not in the build key: give such a build a folder of its own)."""
    builders = NODE_BUILDERS | (builders or {})
    out = Path(out_dir)
    progress = Progress()
    model_dir = Path(config.model.path)
    beam_inputs = check_inputs(config, read_spec(model_dir))  # an unsupported checkpoint, any bad input: first
    check_out(out)
    checkpoint_sha = checkpoint_hash(model_dir)
    key = build_key(config, checkpoint_sha, kernel_profile)
    if not force and is_up_to_date(out, key):
        progress.stage(f"artifacts in {out} are up to date (build key {key[:12]}); nothing to do")
        return read_manifest(out)
    with staged(out) as staging:
        progress.stage(f"loading checkpoint {model_dir}")
        checkpoint = load_checkpoint(model_dir, config.model.dtype, sha256=checkpoint_sha)
        dtype = DTYPES[checkpoint.spec.dtype if config.model.dtype == "auto" else config.model.dtype]
        device = config.model.device
        model = build_model(checkpoint.spec, checkpoint.state_dict, dtype).to(device)
        workloads = enabled_workloads(config)
        gemms = {w: resolve_gemm(config.model.gemm, device, dtype, w) for w in workloads}  # per node (linear.py)
        if device == "cpu" and dtype == torch.bfloat16 and not onednn_bf16():
            progress.stage("warning: this CPU has no bfloat16 instructions; bfloat16 matmuls convert on the fly "
                           "(6.5x slower than float32 on an AVX2 machine); model.dtype = 'float32' serves faster here")
        use_gemm(model, gemms[workloads[0]])  # before fp8 calibration, so it measures kernels that will run
        fp8 = fp8_for_build(config, model, progress.stage)  # [model] fp8: swaps chosen layers in place
        int8 = int8_for_build(config, model, progress.stage)  # [quantize] int8: the same, or refuses the build
        ctx = BuildContext(config, checkpoint, model, dtype, device, beam_inputs)
        nodes, weights, packings, operators = {}, {}, [], set()
        for workload in workloads:
            progress.stage(f"exporting the {workload} node")
            use_gemm(model, gemms[workload])
            module, program, facts = builders[workload](ctx)
            weights.update(module.state_dict())
            packings.append(packable(program))
            operators |= kernels_called(program)
            progress.stage(f"compiling the {workload} node with AOTInductor (minutes on a small CPU)")
            package = staging / f"{workload}.pt2"
            aoti_compile(program, package, compiled_threads(config), kernel_profile)
            nodes[workload] = {"package": package.name, "sha256": file_hash(package), "gemm": gemms[workload],
                               **facts}
        progress.stage("writing weights and tokenizer files")
        save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, staging / WEIGHTS)
        copied = copy_tokenizer_files(model_dir, staging)
        library = None
        if operators:  # the packages call worker/runtime/kernels' operators: the runtime loads their library first
            path = kernels.build_library(staging)
            library = {"file": path.name, "sha256": file_hash(path), "operators": sorted(operators)}
        runner = None
        if torch.device(device).type == "cpu":  # the worker runs CPU packages through it (GIL released)
            path = package_runner.build(staging)
            runner = {"file": path.name, "sha256": file_hash(path)}
        manifest = {
            "format_version": FORMAT_VERSION,
            "name": config.name,
            "build_key": key,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "dtype": str(dtype).removeprefix("torch."),
            "prepacked": combine(packings),  # weights the runtime packs at load (worker/runtime/packing.py)
            "machine": machine_facts(device),
            "cpu_threads": compiled_threads(config),
            "bounds": asdict(config.build_bounds.resolved()),
            "model": {**checkpoint.spec.to_dict(), "path": str(model_dir), "sha256": checkpoint.sha256},
            "nodes": nodes,
            "fp8": fp8,
            "quantize": int8,  # [quantize] int8: layers, calibration, drift measured (compile/quantize/build_step.py)
            "weights": {"file": WEIGHTS, "sha256": file_hash(staging / WEIGHTS)},
            "kernels": library,
            "runner": runner,
            "tokenizer_files": copied,
            "config": asdict(config),
        }
        text = json.dumps(manifest, indent=2)
        parsed = parse_manifest(text, str(out / MANIFEST))  # what every reader decodes (shared/manifest.py)
        (staging / MANIFEST).write_text(text)
        stale = (() if library else (kernels.LIBRARY,)) + (() if runner else (package_runner.LIBRARY,))
        install(staging, out, stale=stale)
    progress.stage(f"done: {', '.join(nodes)} in {out}")
    return parsed


def compiled_threads(config: DeploymentConfig) -> int | None:
    """The intra-op threads a CPU package is compiled for: the workers' [worker] cpu_threads (None on CUDA).

    Inductor fixes a CPU package's thread count at compile time: its kernels open OpenMP teams of
    that size, and the attention kernel sizes per-thread scratch buffers by it, so a call on more
    threads writes past them (seen: heap corruption). The manifest records it; the runtime refuses
    more (worker/runtime/machine.py) and a worker configured otherwise refuses to start.
    """
    return config.worker.cpu_threads if config.model.device.split(":")[0] == "cpu" else None


def aoti_compile(program: torch.export.ExportedProgram, package: Path, threads: int | None,
                 kernel_profile: bool = False) -> None:
    package.unlink(missing_ok=True)
    # Weights stay outside the .so: all nodes share one copy, loaded by the runtime.
    options = {"aot_inductor.package_constants_in_so": False, "cpp.enable_kernel_profile": kernel_profile}
    if threads is not None:  # a CPU build (see compiled_threads)
        # The C++ FlexAttention template cannot take an epilogue (compile/attention.py); without
        # max-autotune it is the only template on a CPU, so this changes nothing else.
        options.update({"cpp.threads": threads, "epilogue_fusion": False})
    torch._inductor.aoti_compile_and_package(program, package_path=str(package), inductor_configs=options)


def kernels_called(program: torch.export.ExportedProgram) -> set[str]:
    """The worker/runtime/kernels operators (namespace boundserve) a node's graph calls."""
    return {node.target.name() for node in program.graph.nodes
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and node.target.namespace == "boundserve"}


def tokenizer_files(model_dir: Path) -> list[str]:
    """The TOKENIZER_FILES the checkpoint has; refused without tokenizer.json."""
    names = [name for name in TOKENIZER_FILES if (model_dir / name).is_file()]
    if "tokenizer.json" not in names:
        raise ValueError(f"{model_dir}: no tokenizer.json (a fast tokenizer is required by the gateway)")
    return names


def copy_tokenizer_files(model_dir: Path, out: Path) -> list[str]:
    names = tokenizer_files(model_dir)
    for name in names:
        shutil.copyfile(model_dir / name, out / name)
    return names


def build_key(config: DeploymentConfig, checkpoint_sha: str, kernel_profile: bool = False) -> str:
    """Everything the artifacts depend on: checkpoint, config, torch, machine and this code."""
    digest = hashlib.sha256()
    full = asdict(config)  # fresh dicts: edited below, the config untouched
    relevant = {k: full[k] for k in ("model", "bounds", "score", "beam", "quantize")}
    relevant["cpu_threads"] = compiled_threads(config)
    relevant["kernel_profile"] = kernel_profile
    relevant["score"]["prefix_cache_mb"] = None  # a run-time budget, not the artifacts'
    # Of every input file the content counts, not the path: the same file elsewhere builds the same artifacts.
    relevant["model"]["path"] = None  # the checkpoint's content: checkpoint_sha
    if relevant["score"]["mlp_head"]:
        relevant["score"]["mlp_head"].pop("weights")
    relevant["beam"].pop("constraints")
    relevant["quantize"].pop("calibration")
    relevant["file_sha256"] = {setting: file_hash(input_file(setting, path)) if path else None
                               for setting, path in input_files(config).items() if setting not in RUN_TIME_FILES}
    digest.update(json.dumps(relevant, sort_keys=True).encode())
    digest.update(checkpoint_sha.encode())
    digest.update(json.dumps(machine_facts(config.model.device), sort_keys=True).encode())
    for source in build_sources():
        digest.update(source.read_bytes())
    return digest.hexdigest()


def build_sources() -> list[Path]:
    """The code a package's content depends on: the build chain (compile/) and the runtime it compiles in
    (worker/runtime/: the kernels' C++ and headers, the layout and packing the graph is exported with)."""
    roots = (Path(__file__).parent, Path(__file__).parents[1] / "worker" / "runtime")
    return [source for root in roots for pattern in ("*.py", "*.cpp", "*.h") for source in sorted(root.rglob(pattern))]


def is_up_to_date(out: Path, key: str) -> bool:
    try:
        manifest = read_manifest(out)
    except ManifestError:
        return False
    if manifest.weights is None:
        return False
    files = [(n.package, n.sha256) for _, n in manifest.node_table().items()]
    files.append((manifest.weights.file, manifest.weights.sha256))
    files += [(library.file, library.sha256) for library in (manifest.kernels, manifest.runner) if library is not None]
    return manifest.build_key == key and all(
        (out / name).is_file() and file_hash(out / name) == sha for name, sha in files
    )
