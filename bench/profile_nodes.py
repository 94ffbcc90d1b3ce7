"""Where the time of one scoring request and one beam request goes, against the machine's peak.

Scoring: the compiled scoring node itself, built with kernel profiling (every generated CPU kernel
reports itself to torch.profiler), one request profiled: time per family (attention = the
FlexAttention kernels or our operator, gemm = the matmul library calls, other = the fused pointwise
kernels, the block mask's construction, copies), each family's share of the profiled time and its executed FLOPs
(bench/harness/flops.py terms) over its time against the peak, the kernels or operators each family ran (family_kernels:
e.g. boundserve::packed_attention_amx, AMX tiles, or FlexAttention's template for attention), and the node's time
without profiling. Of three profiled calls the one with the fewest minor
page faults counts, its faults reported (profiled_call_minor_faults; compiled_profile says why). Every
distinct matmul shape of the request is also timed alone on each matmul library (bench/harness/common.gemm_calls):
what the library reaches on exactly those shapes.
Beam: the eager building blocks of one request timed piece by piece (prefill, a decode step, the
vocabulary projection, log-softmax + top-k), each with its FLOP rate; eager attention is
FlexAttention's unfused reference, so its prefill is an upper bound of the compiled one.

int8 (--dtype int8, the model in its --int8-base precision with the layers `[quantize] int8` chose, as
bench/score_node.py builds it, --int8-base and --int8-budget as there, the same build folders): oneDNN's int8
GEMMs are a family of their own (gemm_int8), and each shape is also timed alone on the int8 kernel
(activations already quantized, weight prepacked) against the best int8 rate measured here (int8_peak_gops),
beside the base precision against its peak.

    .venv/bin/python bench/profile_nodes.py [--model qwen2.5-0.5b] [--dtype fp32|bf16|int8] [--layers N]
                                            [--int8-base bf16|fp32] [--int8-budget NATS] [--no-beam]
                                            [--machine-class amx]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from bench.harness.common import (FLOAT_DTYPES, MODELS, add_int8_base, add_int8_budget, emit, gemm_calls, gemm_libraries,
                          matmul_peak_flops, median, minor_faults, model_gemm_shapes, run_dtype, run_name,
                          run_quantize, settle_int8_base, shaped_checkpoint, time_calls)
from bench.harness.flops import _attention, _head, _kv, _q_o_mlp, score_flops

FAMILIES = {  # kernel or operator name part -> family (self time, so nested events are not counted twice)
    # FlexAttention's template, or worker/runtime/kernels' packed_attention / packed_attention_amx
    "attention": ("flex_attention", "boundserve::packed_attention"),
    "gemm_int8": ("qlinear",),  # before gemm: its op name holds "linear_pointwise" too
    "gemm": ("linear_pointwise", "addmm", "_mm", "bmm", "aten::mm", "aten::matmul"),
}


def family_of(name: str) -> str:
    return next((family for family, parts in FAMILIES.items() if any(p in name for p in parts)), "other")


PROFILED_CALLS = 3
KERNELS_PER_FAMILY = 4


def family_kernels(events) -> tuple[dict[str, float], dict[str, list[dict]]]:
    """From (name, self ms) pairs: ms per family, and per family the kernels or operators that ran it, the
    KERNELS_PER_FAMILY with the most self time first ({"kernel", "ms"}): which attention ran (FlexAttention's
    template or worker/runtime/kernels' operator, AMX or not), which GEMM library call, which fused kernels."""
    totals: dict[str, float] = {}
    by_kernel: dict[str, dict[str, float]] = {}
    for name, ms in events:
        family = family_of(name)
        totals[family] = totals.get(family, 0.0) + ms
        kernels = by_kernel.setdefault(family, {})
        kernels[name] = kernels.get(name, 0.0) + ms
    top = {family: [{"kernel": name, "ms": round(ms, 2)}
                    for name, ms in sorted(kernels.items(), key=lambda kv: -kv[1])[:KERNELS_PER_FAMILY] if ms > 0]
           for family, kernels in by_kernel.items()}
    return totals, top


def grow_heap_top() -> None:
    """Leave the C heap a free top of touched pages just short of the size at which a heap that keeps freed
    memory trims it (worker/runtime/allocator.KEEP): a block allocated, written and freed. Outside glibc, nothing."""
    from worker.runtime.allocator import KEEP, free_top_bytes

    top = free_top_bytes()
    if top is None:
        return
    room = KEEP - top - (64 << 20)
    if room > 0:
        block = torch.ones(room, dtype=torch.uint8)
        del block


def compiled_profile(call) -> tuple[dict[str, float], int, dict[str, list[dict]]]:
    """Self CPU ms per family for one call of a package built with kernel profiling, the minor page faults
    that call took, and the kernels each family ran (family_kernels): of PROFILED_CALLS profiled calls (after
    a warm-up), the one with the fewest faults.

    The profiler's records are small blocks allocated while the node runs. In a heap that keeps freed memory
    (worker/runtime/allocator.py) they land in the holes the node's large buffers left, those buffers no longer fit
    there, and the heap grows: the profiled call faults fresh pages in that an unprofiled call does not.
    Measured (Qwen3-0.6B, float32, 28 layers, one 4,285-token request, 2 threads): unprofiled calls 0 faults
    and 18.2-18.7 s; profiled calls 128,640-668,929 faults and 18.5-22.3 s, the time lost in the gate/up GEMMs
    (whose 105 MB outputs took about 390 instead of 250 ms in the calls that faulted). So each profiled call
    runs after grow_heap_top, which left 2 and 1 faults in two of three calls (25,751 in the first)."""
    from torch.profiler import profile

    call()
    best: tuple[dict[str, float], int, dict[str, list[dict]]] | None = None
    for _ in range(PROFILED_CALLS):
        grow_heap_top()
        before = minor_faults()
        with profile() as prof:
            call()
        faults = minor_faults() - before
        if best is None or faults < best[1]:
            totals, kernels = family_kernels((e.key, e.self_cpu_time_total / 1e3) for e in prof.key_averages())
            best = totals, faults, kernels
    return best


def score_gemm_shapes(spec, lengths: list[int]) -> dict[tuple[int, int, int], int]:
    """(M, K, N) -> how many times the scoring pass runs it (per layer shapes, the last layer pruned)."""
    t, b, h = sum(lengths), len(lengths), spec.hidden_size
    q, kv, i = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, spec.intermediate_size
    full = spec.num_layers - 1
    return {(t, h, q + 2 * kv): full, (t, q, h): full, (t, h, 2 * i): full, (t, i, h): full,
            (t, h, 2 * kv): 1, (b, h, q): 1, (b, q, h): 1, (b, h, 2 * i): 1, (b, i, h): 1, (b, h, spec.vocab_size): 1}


def int8_kernel(layer, x: torch.Tensor):
    """One call of oneDNN's int8 GEMM as the int8 `layer` (compile/quantize/int8.Int8Linear) makes it on `x`, the
    activations quantized beforehand and the weight prepacked: the kernel alone, without the per-row
    quantization and rescaling around it (in a package those are fused pointwise kernels, family "other")."""
    from compile.quantize.int8 import quantize_rows

    u, scale = quantize_rows(x, layer.levels)
    top = scale.amax()
    return lambda: layer.int8_gemm(u, top, x.dtype)


def random_int8_kernel(m: int, k: int, n: int, dtype: torch.dtype = torch.bfloat16):
    """int8_kernel at (m, k, n) on random weights and activations in `dtype` (the int8 node's float precision)."""
    from compile.quantize.int8 import Int8Linear

    return int8_kernel(Int8Linear(torch.nn.Linear(k, n, bias=False)), torch.randn(m, k, dtype=dtype))


def int8_peak_ops(shapes, dtype: torch.dtype) -> float:
    """The best int8 rate (multiply-adds x 2 per second) of random_int8_kernel over `shapes` with activations in
    `dtype`: min of 5 calls each."""
    return max(2 * m * k * n / min(time_calls(random_int8_kernel(m, k, n, dtype), repeats=5)) for m, k, n in shapes)


def gemm_table(shapes: dict, dtype: torch.dtype, peak: float, int8_peak: float | None = None
               ) -> tuple[list[dict], dict[str, float], dict[str, float]]:
    """Each shape timed alone on every library this machine has for `dtype` (bench/harness/common.gemm_libraries:
    torch.mm, i.e. MKL for float32; oneDNN; oneDNN on a weight prepacked as the worker packs it, what our node's
    linears call), with `int8_peak` also on the int8 kernel (random_int8_kernel): ms per call and the fraction of
    the peak each reaches; the request's total GEMM ms per library; the peaks those fractions are of. A peak is
    the best rate measured on this machine: where a shape alone runs faster than the `peak` (or `int8_peak`)
    measured beforehand, that rate is the peak, so no fraction passes 1."""
    rows, totals = [], dict.fromkeys(gemm_libraries(dtype), 0.0)
    if int8_peak is not None:
        totals["onednn_int8_prepacked"] = 0.0
    rates = []  # (row, library, FLOP/s)
    for (m, k, n), count in shapes.items():
        calls = gemm_calls(torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype))
        if int8_peak is not None:
            calls["onednn_int8_prepacked"] = random_int8_kernel(m, k, n, dtype)
        row = {"m": m, "k": k, "n": n, "calls": count}
        for lib, fn in calls.items():
            seconds = min(time_calls(fn, repeats=5))
            row[f"{lib}_ms"] = 1e3 * seconds
            totals[lib] += 1e3 * seconds * count
            rates.append((row, lib, 2 * m * k * n / seconds))
        rows.append(row)
    peaks = {"float": max([peak] + [rate for _, lib, rate in rates if "int8" not in lib])}
    if int8_peak is not None:
        peaks["int8"] = max([int8_peak] + [rate for _, lib, rate in rates if "int8" in lib])
    for row, lib, rate in rates:
        row[f"{lib}_of_peak"] = rate / peaks["int8" if "int8" in lib else "float"]
    return rows, totals, peaks


def profiled_nodes(checkpoint, dtype_name: str, name: str, quantize=None):
    """The nodes of bench/score_node.py's build, compiled with kernel profiling (their manifest says which layers
    an int8 build made int8)."""
    from bench.harness.common import SCORE_BOUNDS, bench_config, build_nodes

    config = bench_config(checkpoint, dtype_name, quantize=quantize, **SCORE_BOUNDS)
    return build_nodes(config, f"{name}-kernel-profile", kernel_profile=True)


def linear_flops(spec, lengths: list[int]) -> dict[str, float]:
    """Executed FLOPs of each linear layer of one scoring call, by compile/fp8.candidate_linears' names
    ("layers.{i}.attn.o", ...): every layer on the call's T tokens, the pruned last one on its B last tokens
    (its k/v on T: its q/k/v stay float, so they are not named here)."""
    t, b, h = sum(lengths), len(lengths), spec.hidden_size
    q, kv, i = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, spec.intermediate_size
    shapes = {"attn.qkv": (h, q + 2 * kv), "attn.o": (q, h), "mlp.gate": (h, i), "mlp.up": (h, i), "mlp.down": (i, h)}
    last = spec.num_layers - 1
    return {f"layers.{n}.{name}": 2 * (b if n == last else t) * k * out
            for n in range(spec.num_layers) for name, (k, out) in shapes.items() if not (n == last and name == "attn.qkv")}


def machine_class(given: str | None) -> tuple[str, str]:
    """(the run's machine class, where it came from): --machine-class, else as bench/harness/result_files reads a
    file without one, from the CPU's features (amx, else the vector ISA torch dispatches to)."""
    if given:
        return given, "--machine-class"
    return ("amx" if torch.cpu._is_amx_tile_supported() else torch.backends.cpu.get_cpu_capability().lower(),
            "CPU features")


def score_profile(checkpoint, spec, dtype, lengths: list[int], peak_shapes, name: str, quantize=None) -> dict:
    """The peak measured on `peak_shapes` before the profile and after it, and raised to the best rate of the GEMM
    table's shapes, so every fraction of it is of the best rate this run saw; with `quantize` (an int8 run): the
    node built with it, and the GEMM table and the peak with the int8 kernel too."""
    from bench.score_node import LABELS, build_node

    peak = matmul_peak_flops(dtype, peak_shapes)
    int8_peak = int8_peak_ops(peak_shapes, dtype) if quantize is not None else None
    ids, lens = torch.randint(0, spec.vocab_size, (sum(lengths),)), torch.tensor(lengths)
    dtype_name = str(dtype).removeprefix("torch.")
    nodes = profiled_nodes(checkpoint, dtype_name, name, quantize)
    profiled = nodes.score
    families, profiled_faults, kernels = compiled_profile(lambda: profiled(ids, lens, LABELS, 2))
    node = build_node(checkpoint, dtype_name, name, quantize)  # the same node without profiling hooks
    node_ms = 1e3 * median(time_calls(lambda: node(ids, lens, LABELS, 2), repeats=3))
    t, b = sum(lengths), len(lengths)
    gemm_flops = (spec.num_layers - 1) * (_q_o_mlp(spec) + _kv(spec)) * t + _kv(spec) * t + _q_o_mlp(spec) * b \
        + _head(spec, b)
    attention_flops = (spec.num_layers - 1) * _attention(spec, sum(n * n for n in lengths) / 2)
    peak = max(peak, matmul_peak_flops(dtype, peak_shapes))
    if int8_peak is not None:
        int8_peak = max(int8_peak, int8_peak_ops(peak_shapes, dtype))
    rows, gemm_alone_ms, table_peaks = gemm_table(score_gemm_shapes(spec, lengths), dtype, peak, int8_peak)
    peak, int8_peak = table_peaks["float"], table_peaks.get("int8")
    rates = {"gemm": gemm_flops, "attention": attention_flops}
    peaks = {"gemm": peak, "attention": peak}
    total_ms = sum(families.values())
    int8_layers = (nodes.manifest.quantize or {}).get("int8_layers", [])
    if quantize is not None:  # the int8 layers' FLOPs against the int8 peak, the float layers' against the float one
        per_layer = linear_flops(spec, lengths)
        rates["gemm_int8"] = sum(per_layer[name] for name in int8_layers)
        rates["gemm"] -= rates["gemm_int8"]
        peaks["gemm_int8"] = int8_peak
    return {
        "tokens": t, "samples": b, "executed_gflop": score_flops(spec, lengths) / 1e9,
        "peak_gflops": peak / 1e9, **({"int8_peak_gops": int8_peak / 1e9} if int8_peak is not None else {}),
        "node_ms": node_ms, "profiled_ms": total_ms, "profiled_call_minor_faults": profiled_faults,
        "families_ms": {k: round(v, 1) for k, v in sorted(families.items(), key=lambda kv: -kv[1])},
        "families_share": {k: round(v / total_ms, 3) for k, v in families.items()},
        "family_of_peak": {k: flops / (families[k] / 1e3) / peaks[k] for k, flops in rates.items() if families.get(k)},
        "family_gflop": {k: round(flops / 1e9, 1) for k, flops in rates.items()},
        "family_of_peak_means": "each family's executed GFLOP (family_gflop) over its profiled time, against the "
                                "run's peak of its precision (gemm_int8: int8_peak_gops); `other` (norms, rotary, "
                                "SiLU.mul and residuals where not GEMM epilogues, quantization, copies) does no "
                                "matmul work: its share is what it costs",
        "family_kernels": kernels,
        **({"int8_layers": len(int8_layers), "linear_layers": len(linear_flops(spec, lengths))}
           if quantize is not None else {}),
        "gemm_shapes_alone": rows, "gemm_alone_ms": gemm_alone_ms,
        "gemm_alone_of_peak": {lib: gemm_flops / (ms / 1e3) / (int8_peak if "int8" in lib else peak)
                               for lib, ms in gemm_alone_ms.items()},
    }


def beam_profile(checkpoint, spec, length: int, width: int, peak: float) -> dict:
    """One request's pieces, timed alone on the eager blocks (ms) with their FLOP rates."""
    from compile.attention import KeyPool, pool_mask
    from worker.runtime.layout import CPU_BLOCK, padded
    from compile.beam.decode import decode, prompt_kv
    from compile.checkpoint import load_checkpoint
    from compile.linear import resolve_gemm, use_gemm
    from compile.model import build_model, prefill

    loaded = load_checkpoint(checkpoint, "float32")
    model = build_model(loaded.spec, loaded.state_dict, torch.float32)
    use_gemm(model, resolve_gemm("auto", "cpu", torch.float32, "beam"))  # the kernel a default build compiles in
    rows = padded(length, CPU_BLOCK)  # the prompt, then its block padding (a segment of its own)
    ids, positions = torch.randint(0, spec.vocab_size, (rows,)), torch.arange(rows)
    cu = torch.tensor([0, length], dtype=torch.int32)
    mask = pool_mask(KeyPool.fitting(rows, 2, CPU_BLOCK), cu, torch.tensor([-1]), rows, rows)
    index, valid = torch.arange(length)[None], torch.ones(1, length, dtype=torch.bool)
    with torch.inference_mode():
        _, keys, values = prefill(model, ids, positions, mask)
        prompt = (prompt_kv(keys, index), prompt_kv(values, index), valid)
        tokens, pos = torch.randint(0, 1000, (1, width)), torch.full((1, width), length)
        hidden, logits = torch.randn(width, spec.hidden_size), torch.randn(1, width, spec.vocab_size)
        suffix = decode(model, tokens, pos, prompt, None)[1]
        parts = {
            "prefill": lambda: prefill(model, ids, positions, mask),
            "decode_step_incl_head": lambda: decode(model, tokens, pos + 1, prompt, suffix),
            "head_only": lambda: model.logits(hidden),
            "log_softmax_topk": lambda: torch.topk(torch.topk(F.log_softmax(logits, -1), 2 * width)[0].reshape(1, -1),
                                                   2 * width),
        }
        ms = {name: 1e3 * median(time_calls(fn, repeats=3)) for name, fn in parts.items()}
    body = spec.num_layers * (_q_o_mlp(spec) + _kv(spec))
    flops = {"prefill": body * length + spec.num_layers * _attention(spec, length * length / 2),
             "decode_step_incl_head": body * width + spec.num_layers * _attention(spec, width * (length + 2))
             + _head(spec, width), "head_only": _head(spec, width)}
    return {"prompt_tokens": length, "W": width, "ms": ms,
            "of_peak": {k: f / (ms[k] / 1e3) / peak for k, f in flops.items()},
            "request_estimate_ms": ms["prefill"] + 3 * ms["decode_step_incl_head"] + 4 * ms["log_softmax_topk"]}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
    parser.add_argument("--dtype", choices=(*sorted(FLOAT_DTYPES), "int8"), default="fp32")
    parser.add_argument("--layers", type=int)
    add_int8_base(parser)
    add_int8_budget(parser)
    parser.add_argument("--no-beam", action="store_true")
    parser.add_argument("--machine-class", help="appended to the result file's name and recorded (e.g. amx)")
    return settle_int8_base(parser, parser.parse_args())


def main() -> None:
    args = parse_args()
    family, shape, depth = MODELS[args.model]
    layers, dtype = args.layers or depth, run_dtype(args)
    from compile.checkpoint import read_spec
    from bench.score_node import SAMPLES, make_requests

    checkpoint = shaped_checkpoint(family, shape, layers, dtype)
    spec = read_spec(checkpoint)
    lengths = [len(s) for s in make_requests(1, SAMPLES, 32, 480, spec.vocab_size)[0]]
    start = time.perf_counter()
    peak_shapes = ((2048, 2048, 2048), *model_gemm_shapes(spec, sum(lengths)))  # the request's own shapes
    int8 = args.dtype == "int8"
    name = run_name(args, layers)  # as score_node names its builds: the same build folders
    machine, machine_from = machine_class(args.machine_class)
    score = score_profile(checkpoint, spec, dtype, lengths, peak_shapes, f"score-{name}", run_quantize(args))
    result = {"bench": "profile_nodes", "model": args.model, "layers": layers, "dtype": args.dtype,
              "machine_class": machine, "machine_class_from": machine_from,
              "quick": layers != depth, "peak_gflops": score["peak_gflops"],
              **({"int8_base": args.int8_base, "int8_peak_gops": score["int8_peak_gops"],
                  "int8_budget": args.int8_budget} if int8 else {}),
              "score": score}
    if not args.no_beam and args.dtype == "fp32":
        result["beam"] = beam_profile(checkpoint, spec, 256, 100, score["peak_gflops"] * 1e9)
    result["seconds"] = time.perf_counter() - start
    emit(f"profile_nodes-{name}" + (f"-{args.machine_class}" if args.machine_class else ""), result)


if __name__ == "__main__":
    main()
