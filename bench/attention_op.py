"""The attention operator alone (worker/runtime/kernels: torch.ops.boundserve.packed_attention) on one layer of
each model, against the attention torch itself offers for the same work, in the same process.

The work: one scoring request of the benchmarks' mix (bench/score_node.py's first request: 15 causal
samples of 32–480 tokens, 4,285 in all), packed into one key pool as the scoring node lays it out
(worker/runtime/layout.lay_out: rows padded to the CPU block, the padding a segment of its own), random
q, k and v of the model's head shapes (Qwen2.5-0.5B: 14 query heads and 2 K/V heads of 64; Qwen3-0.6B: 16
and 8 of 128). The sides:

  ours        the operator on the pool that a package calls here (worker/runtime/kernels.attention_kernel: in
              bfloat16 on a CPU with AMX packed_attention_amx, q·k and p·v on AMX tiles; else
              packed_attention), named in the result as ours_operator;
  ours_avx512 in bfloat16 on a CPU with AMX, also packed_attention (AVX512-BF16 dot products): what ran
              before the AMX operator, and what a CPU without AMX runs;
  sdpa        torch.nn.functional.scaled_dot_product_attention once per sample (is_causal, enable_gqa),
              each output copied into its rows of the pool's output: ATen's CPU flash-attention kernel,
              which computes no padding and nothing across samples;
  flex        flex_attention compiled by Inductor with the pool's block mask (compile/attention.pool_mask),
              what a package runs where our operator does not apply: in bfloat16 on a CPU without AMX its
              float32 kernel on upcast q/k/v (compile/attention.kernel_dtype); skipped with --no-flex.

Calls are interleaved (ours, sdpa, flex, ours, ...), the process's allocator set as a worker's
(worker/runtime/allocator.py); each side's median, min and max ms are reported (a shared machine's load moves them: the
spread says by how much), and its median process CPU time per call (cpu_ms: both threads' work, which other
processes on the cores inflate less than the wall time). of_peak = FLOPs / median time / the dtype's matmul
peak measured in the same run (before and after the timed calls, the larger),
FLOPs as bench/harness/flops.py counts attention (4 · heads · head_dim · L² / 2 per causal sample: softmax,
masking, the operator's repacking of k and v not counted). Parity: every side against attention computed
in float64 from the same inputs; ours within FP32_ABS (float32) or within 1.5x SDPA's own error plus
0.02 (bfloat16: bench/harness/parity.py's rule, SDPA in the place of transformers).

    .venv/bin/python bench/attention_op.py [--model qwen2.5-0.5b|qwen3-0.6b] [--dtype fp32|bf16] [--calls 30]
        [--no-flex] [--quick] [--machine-class amx]

Last line JSON; bench/results/attention_op-<model>-<dtype>[-<machine class>].json.
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from bench.harness.common import (FLOAT_DTYPES, MODELS, emit, interleaved_times, matmul_peaks, median,
                                  model_gemm_shapes, peak_by_library, timed_part)
from bench.harness.parity import BF16_ABS, BF16_FACTOR, FP32_ABS
from bench.score_node import SAMPLES, make_requests

QUICK_SAMPLES = 3


def head_shapes(shape: dict) -> tuple[int, int, int]:
    """(query heads, K/V heads, head dim) of a benchmark model's layer shapes (bench/harness/common.MODELS)."""
    heads = shape["num_attention_heads"]
    return heads, shape["num_key_value_heads"], shape.get("head_dim", shape["hidden_size"] // heads)


def sample_lengths(samples: int, vocab: int) -> list[int]:
    """The token counts of bench/score_node.py's first request (its first `samples` samples)."""
    return [len(s) for s in make_requests(1, SAMPLES, 32, 480, vocab)[0][:samples]]


def pool_layout(lengths: list[int]):
    """(cu_seqlens, parents, rows) of a scoring call of these samples as the node lays it out
    (worker/runtime/layout.lay_out: each sample unshared, no static prefix; rows padded to the CPU block by a
    filler segment)."""
    from worker.runtime.layout import lay_out

    layout = lay_out(torch.zeros(sum(lengths), dtype=torch.int64), lengths, prefix_lens=[0] * len(lengths),
                     group_sizes=[1] * len(lengths), static_ids=torch.zeros(0, dtype=torch.int64))
    return layout.cu_seqlens, layout.parents, int(layout.cu_seqlens[-1])


def float64_attention(q, k, v, lengths: list[int]) -> torch.Tensor:
    """Causal attention per sample in float64: q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D] (padding rows 0)."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    start = 0
    for n in lengths:
        rows = slice(start, start + n)
        qs, ks, vs = (t[rows].double().transpose(0, 1) for t in (q, k, v))
        group = qs.shape[0] // ks.shape[0]
        ks, vs = ks.repeat_interleave(group, 0), vs.repeat_interleave(group, 0)
        scores = qs @ ks.transpose(1, 2) / qs.shape[-1] ** 0.5
        scores.masked_fill_(torch.ones(n, n, dtype=torch.bool).triu(1), -float("inf"))
        out[rows] = (scores.softmax(-1) @ vs).transpose(0, 1)
        start += n
    return out


def sides(q, k, v, lengths: list[int], cu_seqlens, parents, rows: int, flex: bool) -> dict:
    """name -> zero-argument call returning [T, Hq, D] in q's dtype."""
    from worker.runtime import kernels
    from compile.attention import KeyPool, kernel_dtype, pool_mask
    from worker.runtime.layout import CPU_BLOCK

    kernels.build_library()
    pool = KeyPool.fitting(rows, len(parents), CPU_BLOCK)
    mask = pool_mask(pool, cu_seqlens, parents, rows, rows)
    operator = kernels.attention_kernel(q.dtype, q.device, q.shape[-1])
    op = getattr(torch.ops.boundserve, operator)
    starts = cu_seqlens.tolist()

    def sdpa():
        out = torch.zeros_like(q)
        for s, n in zip(starts, lengths):
            heads = [t[s:s + n].transpose(0, 1)[None] for t in (q, k, v)]
            out[s:s + n] = F.scaled_dot_product_attention(*heads, is_causal=True, enable_gqa=True)[0].transpose(0, 1)
        return out

    fns = {"ours": lambda: op(q, k, v, mask.table)}
    if operator == "packed_attention_amx":
        fns["ours_avx512"] = lambda: torch.ops.boundserve.packed_attention(q, k, v, mask.table)
    fns["sdpa"] = sdpa
    if flex:
        from torch.nn.attention.flex_attention import flex_attention

        dtype = kernel_dtype(q.dtype, q.device)
        block_mask = mask.block_mask

        # compile/attention.packed_attention's FlexAttention path, epilogue fusion off as in a CPU build
        @torch.compile(fullgraph=True, dynamic=False, options={"epilogue_fusion": False})
        def flex_side(q, k, v):
            heads = [t.transpose(0, 1)[None].contiguous().to(dtype) for t in (q, k, v)]
            out = flex_attention(*heads, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1])
            return out[0].transpose(0, 1).to(q.dtype)

        fns["flex"] = lambda: flex_side(q, k, v)
    return fns


def parity(outputs: dict, reference: torch.Tensor, dtype: torch.dtype) -> tuple[list[dict], dict]:
    """The checks on ours (the baselines' errors recorded beside it) and every side's error."""
    errors = {name: float((out.double() - reference).abs().max()) for name, out in outputs.items()}
    if dtype == torch.float32:
        bound = FP32_ABS
    else:
        bound = BF16_FACTOR * errors["sdpa"] + BF16_ABS
    checks = [{"check": f"{name}_vs_float64", "max_abs_diff": errors[name], "tolerance": bound,
               "ok": errors[name] <= bound} for name in errors if name.startswith("ours")]
    return checks, errors


def cpu_times(fns: dict, repeats: int) -> dict[str, list[float]]:
    """Process CPU seconds (every thread's) per call of each fn, calls interleaved."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.process_time()
            fn()
            times[name].append(time.process_time() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3-0.6b")
    parser.add_argument("--dtype", choices=sorted(FLOAT_DTYPES), default="bf16")
    parser.add_argument("--calls", type=int, default=30, help="timed calls per side, interleaved")
    parser.add_argument("--no-flex", action="store_true", help="leave out FlexAttention (its compile takes minutes)")
    parser.add_argument("--quick", action="store_true", help=f"smoke test: {QUICK_SAMPLES} samples, 3 calls")
    parser.add_argument("--machine-class", help="appended to the result file's name and recorded (e.g. amx)")
    args = parser.parse_args()

    from worker.runtime.allocator import keep_freed_memory
    from worker.runtime.kernels import attention_applies, attention_kernel

    keep_freed_memory()
    _, shape, _ = MODELS[args.model]
    dtype = FLOAT_DTYPES[args.dtype]
    hq, hkv, d = head_shapes(shape)
    if not attention_applies(dtype, torch.device("cpu"), d):
        parser.error(f"the operator does not run {args.dtype} on this CPU (worker/runtime/kernels.attention_applies)")
    lengths = sample_lengths(QUICK_SAMPLES if args.quick else SAMPLES, shape["vocab_size"])
    cu_seqlens, parents, rows = pool_layout(lengths)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(rows, heads, d, generator=generator).to(dtype) for heads in (hq, hkv, hkv))
    fns = sides(q, k, v, lengths, cu_seqlens, parents, rows, flex=not args.no_flex)
    outputs = {name: fn() for name, fn in fns.items()}  # also the warm-up (FlexAttention compiles here)
    tokens = sum(lengths)  # the rows past them are padding
    checks, errors = parity({name: out[:tokens] for name, out in outputs.items()},
                            float64_attention(q, k, v, lengths)[:tokens], dtype)

    layer = SimpleNamespace(hidden_size=shape["hidden_size"], intermediate_size=shape["intermediate_size"],
                            num_heads=hq, num_kv_heads=hkv, head_dim=d)
    peak_shapes = ((2048, 2048, 2048), *model_gemm_shapes(layer, tokens))  # as bench/score_node.py's peak
    peaks = [matmul_peaks(dtype, peak_shapes)]
    repeats = 3 if args.quick else args.calls
    with timed_part():
        times = interleaved_times(fns, repeats=repeats)
        cpu = cpu_times(fns, repeats=max(3, repeats // 3))
    peaks.append(matmul_peaks(dtype, peak_shapes))
    peak = max(max(p.values()) for p in peaks)
    flops = 4 * hq * d * sum(n * n / 2 for n in lengths)  # bench/harness/flops.py's attention count
    ms = {name: 1e3 * median(t) for name, t in times.items()}
    suffix = f"-{args.machine_class}" if args.machine_class else ""
    emit(f"attention_op-{args.model}-{args.dtype}{suffix}", {
        "bench": "attention_op", "model": args.model, "dtype": args.dtype, "quick": args.quick,
        "machine_class": args.machine_class, "ours_operator": attention_kernel(dtype, torch.device("cpu"), d),
        "heads": hq, "kv_heads": hkv, "head_dim": d, "sample_lengths": lengths, "tokens": tokens,
        "calls": len(times["ours"]), "median_ms": ms,
        "spread_ms": {name: {"min": 1e3 * min(t), "max": 1e3 * max(t)} for name, t in times.items()},
        "cpu_ms": {name: 1e3 * median(t) for name, t in cpu.items()},
        "of_peak": {name: flops / (t / 1e3) / peak for name, t in ms.items()},
        "speedup_vs": {name: t / ms["ours"] for name, t in ms.items() if name != "ours"},
        "gflop": flops / 1e9, "peak_gflops": peak / 1e9, "peak_gflops_by_library": peak_by_library(tuple(peaks)),
        "max_abs_error_vs_float64": errors, "parity": checks,
    })


if __name__ == "__main__":
    main()
