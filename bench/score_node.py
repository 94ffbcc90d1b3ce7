"""Prefill-only scoring: our compiled node against transformers eager, in one process and one run.

Model: Qwen2.5-0.5B's layer shapes with fewer layers, random weights. Requests: 15 samples each,
lengths uniform in 32..480 (fixed seed). Baselines:
  hf        careful transformers use: same dtype, inference mode, left-padded batch with position
            ids, logits_to_keep=1 (only the last position projected);
  hf_naive  right-padded batch, full logits, last valid token read afterwards.
Effective MFU counts only valid tokens (DESIGN.md): 2·non-embedding params·tokens + attention
4·layers·hidden·Σ Lᵢ²/2 + the full-vocabulary head at the last tokens, over a large matmul's
measured FLOP/s in the same run.

    .venv/bin/python bench/score_node.py [--quick] [--dtype fp32|bf16] [--layers 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import random

import torch

from common import (CACHE, QWEN25_05B, ROOT, emit, interleaved_times, matmul_peak_flops, median, shaped_checkpoint,
                    time_calls)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def make_requests(count: int, samples: int, low: int, high: int, vocab: int, seed: int = 0):
    rng = random.Random(seed)
    requests = []
    for _ in range(count):
        lengths = [rng.randint(low, high) for _ in range(samples)]
        requests.append([torch.tensor([rng.randrange(vocab) for _ in range(n)]) for n in lengths])
    return requests


def build_node(checkpoint, dtype_name: str, name: str):
    from compile.build import build
    from compile.runtime import load_nodes
    from shared.config import load_config

    config = load_config(ROOT / "configs/test.toml")
    bounds = dataclasses.replace(config.bounds, max_samples_per_batch=16, max_tokens_per_sample=512,
                                 max_tokens_per_batch=8192)
    model = dataclasses.replace(config.model, path=str(checkpoint), dtype=dtype_name)
    build(config.replace(model=model, bounds=bounds), CACHE / "artifacts" / name)
    return load_nodes(CACHE / "artifacts" / name).score


def hf_careful(model, samples, pad_id: int) -> torch.Tensor:
    """Left-padded batch, position ids from the mask, only the last position projected."""
    width = max(len(s) for s in samples)
    ids = torch.full((len(samples), width), pad_id)
    mask = torch.zeros((len(samples), width), dtype=torch.long)
    for row, s in enumerate(samples):
        ids[row, width - len(s):] = s
        mask[row, width - len(s):] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1)
    return out.logits[:, -1].float()


@torch.inference_mode()
def hf_naive(model, samples, pad_id: int) -> torch.Tensor:
    """Right-padded batch, logits for every position, last valid token read afterwards."""
    width = max(len(s) for s in samples)
    ids = torch.full((len(samples), width), pad_id)
    mask = torch.zeros((len(samples), width), dtype=torch.long)
    for row, s in enumerate(samples):
        ids[row, : len(s)] = s
        mask[row, : len(s)] = 1
    logits = model(input_ids=ids, attention_mask=mask).logits
    return logits[torch.arange(len(samples)), mask.sum(-1) - 1].float()


def profile_breakdown(checkpoint, dtype: torch.dtype, samples, labels) -> dict:
    """Where the time of one request goes, by operator family, on the eager ScoreModule (the
    compiled package calls the same matmul and attention kernels; its fused pointwise code is not
    visible to the profiler)."""
    from torch.profiler import profile

    from compile.checkpoint import load_checkpoint
    from compile.model import build_model
    from compile.score.module import ScoreModule, pack_inputs

    ck = load_checkpoint(checkpoint, str(dtype).removeprefix("torch."))
    module = ScoreModule(build_model(ck.spec, ck.state_dict, dtype), 5)
    args = pack_inputs(torch.cat(samples), torch.tensor([len(s) for s in samples]), labels, label_slots=8)
    with torch.inference_mode():
        module(*args)
        with profile() as prof:
            module(*args)
    families = {"matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear"),
                "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::einsum")}
    totals = {name: 0.0 for name in (*families, "other")}
    for event in prof.key_averages():
        family = next((f for f, ops in families.items() if event.key in ops), "other")
        totals[family] += event.self_cpu_time_total / 1e3
    total = sum(totals.values())
    return {f"{name}_share": round(ms / total, 3) for name, ms in totals.items()} | {"eager_ms": round(total, 1)}


def request_flops(spec, lengths: list[int]) -> float:
    tokens = sum(lengths)
    attention = 4 * spec.num_layers * spec.hidden_size * sum(n * n for n in lengths) / 2
    head = 2 * len(lengths) * spec.hidden_size * spec.vocab_size
    return 2 * spec.non_embedding_params * tokens + attention + head


def executed_flops(spec, lengths: list[int]) -> float:
    """FLOPs our node actually runs: its last layer computes keys/values for every token but
    queries, output projection and MLP for the last tokens only (effective MFU counts the nominal
    work of DESIGN.md; this counts the work done)."""
    kv = 2 * spec.hidden_size * 2 * spec.num_kv_heads * spec.head_dim
    per_layer = spec.non_embedding_params // spec.num_layers
    tokens, samples = sum(lengths), len(lengths)
    body = 2 * per_layer * (spec.num_layers - 1) * tokens + kv * tokens + 2 * per_layer * samples
    attention = 4 * (spec.num_layers - 1) * spec.hidden_size * sum(n * n for n in lengths) / 2
    return body + attention + 2 * samples * spec.hidden_size * spec.vocab_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 layers, shorter samples, fewer repeats")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--requests", type=int)
    parser.add_argument("--profile", action="store_true", help="add an operator breakdown of one request")
    parser.add_argument("--threads", type=int, help="intra-op threads (default: torch's, one per core)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    layers = args.layers or (2 if args.quick else 4)
    high = 160 if args.quick else 480
    count = args.requests or (2 if args.quick else 4)
    dtype = DTYPES[args.dtype]
    torch.manual_seed(0)

    from compile.checkpoint import read_spec
    from transformers import AutoModelForCausalLM

    checkpoint = shaped_checkpoint("qwen2", QWEN25_05B, layers, dtype)
    spec = read_spec(checkpoint)
    node = build_node(checkpoint, str(dtype).removeprefix("torch."), f"score-{args.dtype}-{layers}l")
    hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype).eval()
    requests = make_requests(count, 15, 32, high, spec.vocab_size)
    labels = torch.tensor([9454, 2152])  # two label ids ("yes"/"no" in Qwen's vocabulary)
    pad_id = 0

    def ours(samples):
        return lambda: node(torch.cat(samples), torch.tensor([len(s) for s in samples]), labels, top_k=5)

    def hf_call(samples):
        def call():
            with torch.inference_mode():
                hf_careful(hf, samples, pad_id)
        return call

    with torch.inference_mode():  # parity on the first request before timing anything
        expected = hf_careful(hf, requests[0], pad_id)[:, labels]
        got = node(torch.cat(requests[0]), torch.tensor([len(s) for s in requests[0]]), labels, 5).label_logits
    max_abs_diff = (got - expected).abs().max().item()

    repeats = 1 if args.quick else 2
    ours_times, hf_times = [], []
    for index, samples in enumerate(requests):  # per request: ours and transformers back to back
        times = interleaved_times({"ours": ours(samples), "hf": hf_call(samples)}, repeats, warmup=int(index == 0))
        ours_times.append(median(times["ours"]))
        hf_times.append(median(times["hf"]))
    ours_s, hf_s = sum(ours_times) / count, sum(hf_times) / count
    # the naive variant projects every position onto the 152k vocabulary: one request is enough
    naive_s = median(time_calls(lambda: [hf_naive(hf, requests[0], pad_id)], 1, warmup=0))
    naive_tokens = sum(len(s) for s in requests[0])
    peak = matmul_peak_flops(dtype)
    tokens = sum(len(s) for r in requests for s in r) / count
    flops = sum(request_flops(spec, [len(s) for s in r]) for r in requests) / count
    executed = sum(executed_flops(spec, [len(s) for s in r]) for r in requests) / count
    breakdown = profile_breakdown(checkpoint, dtype, requests[0], labels) if args.profile else None
    emit(f"score_node_{args.dtype}", {
        "bench": "score_node", "dtype": args.dtype, "quick": args.quick,
        "model": {"shape": "Qwen2.5-0.5B", "layers": layers, "hidden": spec.hidden_size,
                  "intermediate": spec.intermediate_size, "vocab": spec.vocab_size},
        "samples_per_request": 15, "sample_tokens": [32, high], "requests": count,
        "mean_tokens_per_request": tokens,
        "ours_ms_per_request": ours_s * 1e3, "hf_ms_per_request": hf_s * 1e3,
        "ours_tokens_per_s": tokens / ours_s, "hf_tokens_per_s": tokens / hf_s,
        "hf_naive_tokens_per_s": naive_tokens / naive_s,
        "speedup": hf_s / ours_s, "speedup_vs_naive": (tokens / ours_s) / (naive_tokens / naive_s),
        "peak_gflops": peak / 1e9, "ours_gflops": flops / ours_s / 1e9,
        "effective_mfu": flops / ours_s / peak, "hf_effective_mfu": flops / hf_s / peak,
        "executed_mfu": executed / ours_s / peak,
        "max_abs_diff_vs_hf": max_abs_diff, "threads": torch.get_num_threads(),
        "profile": breakdown,
    })


if __name__ == "__main__":
    main()
