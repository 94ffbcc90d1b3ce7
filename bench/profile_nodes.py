"""Where the time of one scoring request and one beam request goes, against the machine's peak.

Scoring: the eager ScoreModule (the same layers, matmuls and attention kernel the compiled package
calls; the package fuses the pointwise work around them) under torch.profiler, operators grouped
into families, each family's executed FLOPs (bench/flops.py terms) over its time, next to the
compiled node's time for the same request. Every distinct matmul shape of the request is also
timed alone with torch.mm: what the matmul library reaches on exactly those shapes.
Beam: the eager building blocks of one request timed piece by piece (prefill, a decode step, the
vocabulary projection, log-softmax + top-k), each with its FLOP rate.

    .venv/bin/python bench/profile_nodes.py [--model qwen2.5-0.5b] [--dtype fp32|bf16] [--layers N] [--no-beam]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from bench.common import MODELS, emit, matmul_peak_flops, median, model_gemm_shapes, shaped_checkpoint, time_calls
from bench.flops import _attention, _head, _kv, _q_o_mlp, score_flops

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
FAMILIES = {  # profiler operator -> family (self time, so nested operators are not counted twice)
    "gemm": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "mkldnn::_linear_pointwise"),
    "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu",),
    "last_layer_attention": ("aten::einsum",),
    "copies": ("aten::copy_", "aten::cat", "aten::index_select", "aten::contiguous", "aten::clone",
               "aten::slice_scatter", "aten::index", "aten::embedding"),
    "head_softmax_topk": ("aten::_log_softmax", "aten::topk", "aten::_softmax"),
}


def family_of(op: str) -> str:
    return next((name for name, ops in FAMILIES.items() if op in ops), "pointwise_and_other")


def eager_profile(module, args) -> dict[str, float]:
    """Self CPU ms per operator family for one call (after a warm-up call)."""
    from torch.profiler import profile

    with torch.inference_mode():
        module(*args)
        with profile() as prof:
            module(*args)
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        family = family_of(event.key)
        totals[family] = totals.get(family, 0.0) + event.self_cpu_time_total / 1e3
    return totals


def score_gemm_shapes(spec, lengths: list[int]) -> dict[tuple[int, int, int], int]:
    """(M, K, N) -> how many times the scoring pass runs it (per layer shapes, the last layer pruned)."""
    t, b, h = sum(lengths), len(lengths), spec.hidden_size
    q, kv, i = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, spec.intermediate_size
    full = spec.num_layers - 1
    return {(t, h, q + 2 * kv): full, (t, q, h): full, (t, h, 2 * i): full, (t, i, h): full,
            (t, h, 2 * kv): 1, (b, h, q): 1, (b, q, h): 1, (b, h, 2 * i): 1, (b, i, h): 1, (b, h, spec.vocab_size): 1}


def gemm_table(shapes: dict, dtype: torch.dtype, peak: float) -> tuple[list[dict], dict[str, float]]:
    """Each shape timed alone with torch.mm (MKL for float32) and oneDNN: ms per call and the
    fraction of the peak each reaches; the request's total GEMM ms per library."""
    rows, totals = [], {"torch.mm": 0.0, "onednn": 0.0}
    for (m, k, n), count in shapes.items():
        a, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
        a_dnn, w_dnn = a.to_mkldnn(), w.to_mkldnn()
        calls = {"torch.mm": lambda: torch.mm(a, w.t()),
                 "onednn": lambda: torch._C._nn.mkldnn_linear(a_dnn, w_dnn, None)}
        row = {"m": m, "k": k, "n": n, "calls": count}
        for lib, fn in calls.items():
            seconds = min(time_calls(fn, repeats=5))
            row[f"{lib}_ms"], row[f"{lib}_of_peak"] = 1e3 * seconds, 2 * m * k * n / seconds / peak
            totals[lib] += 1e3 * seconds * count
        rows.append(row)
    return rows, totals


def node_ms(checkpoint, spec, dtype_name: str, name: str, lengths: list[int]) -> float:
    """The compiled scoring node's time (ms, median of 3) on a request of these lengths."""
    from bench.score_node import LABELS, build_node

    node = build_node(checkpoint, dtype_name, name)
    ids, lens = torch.randint(0, spec.vocab_size, (sum(lengths),)), torch.tensor(lengths)
    return 1e3 * median(time_calls(lambda: node(ids, lens, LABELS, 2), repeats=3))


def same_kernels(model, dtype):
    """The eager model on the linear kernel a default build compiles in (model.gemm = auto)."""
    from compile.linear import resolve_gemm, use_gemm

    return use_gemm(model, resolve_gemm("auto", "cpu", dtype))


def score_profile(checkpoint, spec, dtype, lengths: list[int], peak: float) -> dict:
    from compile.checkpoint import load_checkpoint
    from compile.model import build_model
    from compile.score.module import ScoreModule, pack_inputs

    loaded = load_checkpoint(checkpoint, str(dtype).removeprefix("torch."))
    module = ScoreModule(same_kernels(build_model(loaded.spec, loaded.state_dict, dtype), dtype), 5)
    ids = torch.randint(0, spec.vocab_size, (sum(lengths),))
    args = pack_inputs(ids, torch.tensor(lengths), torch.tensor([9454, 2152]), label_slots=8)
    families = eager_profile(module, args)
    t, b = sum(lengths), len(lengths)
    gemm_flops = (spec.num_layers - 1) * (_q_o_mlp(spec) + _kv(spec)) * t + _kv(spec) * t + _q_o_mlp(spec) * b \
        + _head(spec, b)
    attention_flops = (spec.num_layers - 1) * _attention(spec, sum(n * n for n in lengths) / 2)
    rates = {"gemm": gemm_flops, "attention": attention_flops}
    total_ms = sum(families.values())
    rows, gemm_alone_ms = gemm_table(score_gemm_shapes(spec, lengths), dtype, peak)  # per library
    return {
        "tokens": t, "samples": b, "executed_gflop": score_flops(spec, lengths) / 1e9, "eager_ms": total_ms,
        "families_ms": {k: round(v, 1) for k, v in sorted(families.items(), key=lambda kv: -kv[1])},
        "families_share": {k: round(v / total_ms, 3) for k, v in families.items()},
        "family_of_peak": {k: flops / (families[k] / 1e3) / peak for k, flops in rates.items() if families.get(k)},
        "gemm_shapes_alone": rows, "gemm_alone_ms": gemm_alone_ms,
        "gemm_alone_of_peak": {lib: gemm_flops / (ms / 1e3) / peak for lib, ms in gemm_alone_ms.items()},
    }


def beam_profile(checkpoint, spec, length: int, width: int, peak: float) -> dict:
    """One request's pieces, timed alone on the eager blocks (ms) with their FLOP rates."""
    from compile.beam.decode import decode, prompt_kv
    from compile.model import prefill
    from compile.checkpoint import load_checkpoint
    from compile.model import build_model

    loaded = load_checkpoint(checkpoint, "float32")
    model = same_kernels(build_model(loaded.spec, loaded.state_dict, torch.float32), torch.float32)
    ids = torch.randint(0, spec.vocab_size, (length,))
    cu = torch.tensor([0, length], dtype=torch.int32)
    index, valid = torch.arange(length)[None], torch.ones(1, length, dtype=torch.bool)
    with torch.inference_mode():
        _, keys, values = prefill(model, ids, torch.arange(length), cu)
        prompt = (prompt_kv(keys, index), prompt_kv(values, index), valid)
        tokens, pos = torch.randint(0, 1000, (1, width)), torch.full((1, width), length)
        hidden, logits = torch.randn(width, spec.hidden_size), torch.randn(1, width, spec.vocab_size)
        suffix = decode(model, tokens, pos, prompt, None)[1]
        parts = {
            "prefill": lambda: prefill(model, ids, torch.arange(length), cu),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--no-beam", action="store_true")
    parser.add_argument("--node", action="store_true", help="also time the compiled scoring node (built if missing)")
    args = parser.parse_args()
    family, shape, depth = MODELS[args.model]
    layers, dtype = args.layers or depth, DTYPES[args.dtype]
    from compile.checkpoint import read_spec
    from bench.score_node import SAMPLES, make_requests

    checkpoint = shaped_checkpoint(family, shape, layers, dtype)
    spec = read_spec(checkpoint)
    lengths = [len(s) for s in make_requests(1, SAMPLES, 32, 480, spec.vocab_size)[0]]
    start = time.perf_counter()
    peak = matmul_peak_flops(dtype, ((2048, 2048, 2048), *model_gemm_shapes(spec)))
    result = {"bench": "profile_nodes", "model": args.model, "layers": layers, "dtype": args.dtype,
              "quick": layers != depth, "peak_gflops": peak / 1e9,
              "score": score_profile(checkpoint, spec, dtype, lengths, peak)}
    if args.node:
        result["score"]["node_ms"] = node_ms(checkpoint, spec, str(dtype).removeprefix("torch."),
                                             f"score-{args.model}-{args.dtype}-{layers}l", lengths)
    if not args.no_beam and args.dtype == "fp32":
        result["beam"] = beam_profile(checkpoint, spec, 256, 100, peak)
    result["peak_gflops"] = max(peak, matmul_peak_flops(dtype, ((2048, 2048, 2048), *model_gemm_shapes(spec)))) / 1e9
    result["seconds"] = time.perf_counter() - start
    emit(f"profile_nodes-{args.model}-{args.dtype}-{layers}l", result)


if __name__ == "__main__":
    main()
