"""Shared benchmark helpers: real-shape checkpoints, the one node builder, the machine's measured
peak, timing, JSON output."""

from __future__ import annotations

import dataclasses
import resource
import statistics
import threading
import time
from pathlib import Path

import torch

from bench.harness.provenance import RESULTS, ROOT, timed_part, write_result

CACHE = ROOT / "bench" / ".cache"

__all__ = ["CACHE", "FLOAT_DTYPES", "SCORE_BOUNDS", "Clock", "MODELS", "QWEN25_05B", "QWEN3_06B", "RESULTS", "ROOT",
           "add_int8_base", "add_int8_budget", "bench_config", "budget_label", "build_artifacts", "build_nodes",
           "default_int8_base", "dtype_label", "emit", "float_dtype_name", "gemm_calls", "gemm_libraries",
           "int8_config", "int8_report", "interleaved_round", "interleaved_times", "load_built", "matmul_peak_flops",
           "matmul_peaks", "median", "model_gemm_shapes", "node_device", "peak_by_library", "run_dtype", "run_name",
           "run_quantize", "run_together", "settle_int8_base", "shaped_checkpoint", "these_threads", "time_calls",
           "timed_part"]

SCORE_BOUNDS = dict(max_samples_per_batch=16, max_tokens_per_sample=512, max_tokens_per_batch=8192)
"""The scoring benchmarks' bounds: 15 samples of up to 480 tokens in one call."""

FLOAT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
"""The benchmarks' float precisions; --dtype int8 quantizes one of them, its --int8-base (add_int8_base)."""


def default_int8_base() -> str:
    """The float precision a user of this CPU would quantize: bf16 where oneDNN multiplies bfloat16, else fp32
    (on AVX2 alone bfloat16 takes aten's slow path and a user picks float32)."""
    from compile.linear import onednn_bf16

    return "bf16" if onednn_bf16() else "fp32"


def add_int8_base(parser) -> None:
    """--int8-base on a benchmark's parser (checked by settle_int8_base)."""
    parser.add_argument("--int8-base", choices=sorted(FLOAT_DTYPES), default=None,
                        help="--dtype int8: the float precision quantized (default: bf16 where oneDNN multiplies "
                        "bfloat16 on this CPU, else fp32)")


def add_int8_budget(parser) -> None:
    """--int8-budget on a benchmark's parser (int8_config reads it)."""
    parser.add_argument("--int8-budget", type=float, help="int8: selection budget in nats (default: [quantize]'s "
                        "defaults), the gate loosened to match (bench/harness/common.int8_config)")


def int8_config(budget: float | None):
    """[quantize] for an int8 run: the product's defaults, or with --int8-budget a selection budget of that many
    nats and a gate loosened to match (max drift 2x the budget, mean drift the budget, agreements 0.5), so that a
    run can trade drift for int8 coverage up to, say, CTranslate2 int8's own drift."""
    from shared.config import QuantizeConfig

    if budget is None:
        return QuantizeConfig(int8=True)
    return QuantizeConfig(int8=True, selection_max_drift=budget, max_label_logprob_drift=2 * budget,
                          mean_label_logprob_drift=budget, min_top1_agreement=0.5, min_rank_agreement=0.5)


def int8_report(quantized: dict | None) -> dict:
    """An int8 run's record of its build in the result JSON, from the manifest's `quantize` (None for a float run):
    how many linears the selection put in int8, the gate's figures on the held-out batches and its limits."""
    if quantized is None:
        return {"int8_layers": None, "int8_gate": None, "int8_limits": None}
    chosen, total = len(quantized["int8_layers"]), len(quantized["int8_layers"]) + len(quantized["float_layers"])
    return {"int8_layers": f"{chosen} of {total}", "int8_gate": quantized["gate"], "int8_limits": quantized["limits"]}


def run_quantize(args):
    """A scoring run's [quantize]: int8_config of its --int8-budget for --dtype int8, else None (none)."""
    return int8_config(args.int8_budget) if args.dtype == "int8" else None


def run_name(args, layers: int) -> str:
    """A scoring run's name in build folders and result files: model, dtype (`int8-fp32` for int8 on a float32
    base), depth, and an int8 run's selection budget when one was given (`-1nats`)."""
    budget = budget_label(args.int8_budget) if args.dtype == "int8" else ""
    return f"{args.model}-{dtype_label(args)}-{layers}l{budget}"


def budget_label(budget: float | None) -> str:
    """An int8 build's selection budget in its build folder's and result file's name: `-1nats`, or nothing for
    [quantize]'s defaults."""
    return "" if budget is None else f"-{budget:g}nats"


def settle_int8_base(parser, args):
    """args with --int8-base checked (only with --dtype int8) and, for int8, defaulted (default_int8_base)."""
    if args.int8_base is not None and args.dtype != "int8":
        parser.error("--int8-base goes with --dtype int8")
    if args.dtype == "int8":
        args.int8_base = args.int8_base or default_int8_base()
    return args


def float_dtype_name(args) -> str:
    """The run's float precision: --dtype, or for int8 its base."""
    return args.int8_base if args.dtype == "int8" else args.dtype


def run_dtype(args) -> torch.dtype:
    """The torch dtype of the run's float side (the checkpoint, transformers, our float node)."""
    return FLOAT_DTYPES[float_dtype_name(args)]


def dtype_label(args) -> str:
    """The run's precision in build folders and result files: --dtype, `int8-fp32` for int8 on a float32 base
    (int8 on bfloat16 keeps the plain `int8` of the files written before there was a choice)."""
    return "int8-fp32" if args.dtype == "int8" and args.int8_base == "fp32" else args.dtype


# Qwen2.5-0.5B's layer shapes (hidden 896, 14 heads of 64, 2 KV heads, MLP 4864, vocab 151936,
# tied embeddings, q/k/v bias); the number of layers is the benchmark's choice.
QWEN25_05B = dict(
    hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
    vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=32768,
)
# Qwen3-0.6B's layer shapes (hidden 1024, 16 heads of 128, 8 KV heads, MLP 3072, q/k norm).
QWEN3_06B = dict(
    hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8,
    head_dim=128, vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=40960,
)
# name -> (transformers family, layer shapes, the real model's depth)
MODELS = {"qwen2.5-0.5b": ("qwen2", QWEN25_05B, 24), "qwen3-0.6b": ("qwen3", QWEN3_06B, 28)}


def shaped_checkpoint(family: str, shape: dict, num_layers: int, dtype: torch.dtype) -> Path:
    """A random-weight checkpoint of the given shape written by transformers (cached)."""
    from compile.demo import write_checkpoint

    name = f"{family}-{shape['hidden_size']}-{num_layers}l-{str(dtype).removeprefix('torch.')}"
    folder = CACHE / "checkpoints" / name
    if not (folder / "config.json").is_file():
        write_checkpoint(folder, family, dtype=dtype, num_hidden_layers=num_layers, **shape)
    return folder


def these_threads(config):
    """config with its CPU packages compiled for this process's intra-op threads (a CPU package
    refuses to run on more threads than it was compiled for: compile/build.py)."""
    return config.replace(worker=dataclasses.replace(config.worker, cpu_threads=torch.get_num_threads()))


def node_device(device: str) -> str:
    """Where a node of a config for `device` (cpu or cuda) is loaded: the CPU, or the first GPU."""
    return "cpu" if device == "cpu" else "cuda:0"


def bench_config(checkpoint: Path, dtype: str, workloads: tuple[str, ...] | None = None, gemm: str | None = None,
                 quantize=None, device: str = "cpu", base: str = "test", fp8_budget: float | None = None,
                 **bounds: int):
    """configs/<base>.toml (default test.toml) serving `checkpoint` in `dtype` on `device` (cpu or
    cuda) with these bounds, one worker on that device; `workloads` (score, beam) narrows what is
    built (default: the config's own), `gemm` forces the linear layers' kernel, `quantize` replaces
    the [quantize] section (shared.config.QuantizeConfig; default: none), `fp8_budget` builds with
    `[model] fp8` under that label-probability budget."""
    from shared.config import QuantizeConfig, load_config

    config = load_config(ROOT / f"configs/{base}.toml")
    model = dataclasses.replace(config.model, path=str(checkpoint), dtype=dtype, device=device,
                                **({"gemm": gemm} if gemm else {}),
                                **({"fp8": True, "fp8_max_prob_change": fp8_budget} if fp8_budget is not None else {}))
    worker = dataclasses.replace(config.worker, endpoints=config.worker.endpoints[:1], devices=(node_device(device),))
    config = config.replace(model=model, bounds=dataclasses.replace(config.build_bounds, **bounds), worker=worker,
                            quantize=quantize or QuantizeConfig())
    if workloads is not None:
        config = config.replace(score=dataclasses.replace(config.score, enabled="score" in workloads),
                                beam=dataclasses.replace(config.beam, enabled="beam" in workloads))
    return config


def build_artifacts(config, name: str, kernel_profile: bool = False) -> Path:
    """The artifacts of `config`, compiled for this process's threads (these_threads) once into
    bench/.cache/artifacts/<name> (a rebuild with nothing changed is skipped); their folder."""
    from compile.build import build

    folder = CACHE / "artifacts" / name
    build(these_threads(config), folder, kernel_profile=kernel_profile)
    return folder


def load_built(folder: Path, config, runners: int = 1):
    """The nodes in `folder` (built by build_artifacts from `config`) on config's device, each
    package able to serve `runners` threads at once. The process's allocator keeps freed memory, as
    a CPU worker's does (worker/runtime/allocator.py): every engine in this process runs with it."""
    from worker.runtime.allocator import keep_freed_memory
    from worker.runtime.loader import load_nodes

    keep_freed_memory()
    return load_nodes(folder, node_device(config.model.device), runners=runners)


def build_nodes(config, name: str, runners: int = 1, kernel_profile: bool = False):
    """The nodes of `config`: build_artifacts, then load_built."""
    return load_built(build_artifacts(config, name, kernel_profile), config, runners)


def model_gemm_shapes(spec, tokens: int = 4096) -> tuple[tuple[int, int, int], ...]:
    """(M, K, N) of every linear of one of the model's layers at `tokens` rows: q/k/v, the output projection,
    MLP gate-up and down. A peak measured over the large MLP shapes alone is not the machine's best: on AMX the
    small projections, whose weights stay in cache, ran faster than it (a fraction of the peak above 1)."""
    h, i = spec.hidden_size, spec.intermediate_size
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    return (tokens, h, q + 2 * kv), (tokens, q, h), (tokens, h, 2 * i), (tokens, i, h)


def _best_rate(fn, flops: float, bursts: int, seconds: float) -> float:
    """The best FLOP/s of fn over `bursts` bursts of `seconds` each (after one untimed call)."""
    fn()
    best = 0.0
    for _ in range(bursts):
        runs, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            fn()
            runs += 1
        best = max(best, flops * runs / (time.perf_counter() - start))
    return best


def gemm_libraries(dtype: torch.dtype) -> tuple[str, ...]:
    """The libraries this machine multiplies `dtype` matrices with, as the benchmarks name them: torch.mm
    always; oneDNN where it takes the dtype (bfloat16 needs AVX512-BF16 / AVX-NE-CONVERT; on AVX2 alone
    oneDNN raises instead), both on the plain weight and on one prepacked as a build with `model.gemm =
    onednn` packs it (worker/runtime/packing.py), whether or not "auto" takes oneDNN here."""
    from compile.linear import onednn_bf16

    onednn = torch.backends.mkldnn.is_available() and (dtype != torch.bfloat16 or onednn_bf16())
    return ("torch.mm",) + ("onednn", "onednn_prepacked") * onednn


def gemm_calls(a: torch.Tensor, w: torch.Tensor) -> dict:
    """library -> a call of a @ w.T on it, for each of gemm_libraries(a.dtype); `a`'s rows size the prepacked
    weight as a worker sizes it."""
    calls = {"torch.mm": lambda: torch.mm(a, w.t())}
    libraries = gemm_libraries(a.dtype)
    if "onednn" in libraries:
        a_dnn, w_dnn = a.to_mkldnn(), w.to_mkldnn()
        calls["onednn"] = lambda: torch._C._nn.mkldnn_linear(a_dnn, w_dnn, None)
    if "onednn_prepacked" in libraries:
        w_packed = torch.ops.mkldnn._reorder_linear_weight(w, a.shape[0])
        calls["onednn_prepacked"] = lambda: torch.ops.mkldnn._linear_pointwise(a, w_packed, None, "none", [None], "")
    return calls


def matmul_peaks(dtype: torch.dtype, shapes=((2048, 2048, 2048), (4096, 896, 4096)), bursts: int = 5,
                 seconds: float = 0.3) -> dict[str, float]:
    """This machine's best FLOP/s on large matrix multiplies of `dtype`, per library (gemm_libraries):
    torch.mm (MKL for float32 on x86), oneDNN (what torch uses for bfloat16, and on AMD CPUs the faster
    float32 GEMM: MKL runs an AVX2 path there) and oneDNN on a weight prepacked as the worker packs it
    (worker/runtime/packing.py: what our nodes' linears call), which ran up to 9 % above the unpacked rate on the
    bfloat16 shapes of a profile (bench/profile_nodes.py): without it, a GEMM's fraction of the peak could
    pass 1. The best of several short bursts over a few shapes (pass the model's own GEMM shapes too), so
    that a moment of contention from other processes does not pass for the peak."""
    peaks = dict.fromkeys(gemm_libraries(dtype), 0.0)
    for m, k, n in shapes:
        flops = 2 * m * k * n
        for lib, fn in gemm_calls(torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)).items():
            peaks[lib] = max(peaks[lib], _best_rate(fn, flops, bursts, seconds))
    return peaks


def matmul_peak_flops(dtype: torch.dtype, shapes=((2048, 2048, 2048), (4096, 896, 4096)), bursts: int = 5,
                      seconds: float = 0.3) -> float:
    """The peak MFU is measured against: the best of matmul_peaks over its libraries."""
    return max(matmul_peaks(dtype, shapes, bursts, seconds).values())


def peak_by_library(measurements: tuple[dict[str, float], ...]) -> dict[str, list[float]]:
    """library -> GFLOP/s of each peak measurement (before and after the timed part)."""
    return {lib: [round(m[lib] / 1e9, 1) for m in measurements] for lib in measurements[0]}


class Clock:
    """Wall seconds of a run's phases, for scheduling runs: lap(name) records the time since the last lap."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._last, 1)
        self._last = now


def interleaved_round(fns: dict) -> dict[str, tuple[float, object]]:
    """Call each fn once, back to back: name -> (seconds, what it returned)."""
    out = {}
    for name, fn in fns.items():
        start = time.perf_counter()
        value = fn()
        out[name] = (time.perf_counter() - start, value)
    return out


def interleaved_times(fns: dict, repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each fn, calls interleaved (a, b, a, b, ...) so that slow moments of a
    shared machine fall on every contender alike."""
    for _ in range(warmup):
        interleaved_round(fns)
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, (seconds, _) in interleaved_round(fns).items():
            times[name].append(seconds)
    return times


def minor_faults() -> int:
    """The minor page faults this process has taken so far (pages the kernel mapped in, zeroed first)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_calls(fn, repeats: int, warmup: int = 1) -> list[float]:
    """Wall-clock seconds of `repeats` calls of fn(), after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def run_together(calls) -> float:
    """Run each of `calls` (no-argument callables) on a thread of its own, all started together;
    the wall seconds until the last one finished."""
    threads = [threading.Thread(target=call) for call in calls]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    return statistics.median(values)


def emit(name: str, result: dict, threads: int | dict | None = None) -> None:
    """Write the result, with its provenance, to bench/results/<name>.json and print it as the last line
    (never when its parity failed: bench/harness/provenance.py). `threads`: each side's intra-op threads, when
    they differ; by default torch's, which every side used."""
    write_result(name, result, quick=bool(result.get("quick", False)),
                 threads=torch.get_num_threads() if threads is None else threads)
