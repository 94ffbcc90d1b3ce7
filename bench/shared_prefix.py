"""Shared-prefix scoring on the workload users send: one context x many items.

Model: Qwen2.5-0.5B's shapes (or --model qwen3-0.6b) at the real depth (or --layers N), random weights
written by transformers. Requests: a context of 200..400 tokens followed by 15 items of 16..64 tokens,
one sample per item (fixed seed). Contenders, timed interleaved request by request, same threads:
  shared      our node, the request as its context once + 15 suffixes (what the gateway sends);
  unshared    our node, the 15 full samples packed (no padding computed; the context 15 times);
  hf_careful  transformers on the 15 full samples as one left-padded batch, last position projected.
Outputs must agree (bench/harness/parity.py tolerances; shared against unshared 1e-4 in fp32; in bf16 each
against transformers in float32 within the bf16 bound; in int8 shared against unshared, and each one's top-1
against transformers in float32, within the quantized sanity bound every quantized contender is held to:
bench/harness/parity.py) or the run exits non-zero. flop_bound = FLOPs executed unshared / FLOPs
executed shared on the same requests: the speed-up a perfect implementation would reach (bench/harness/flops.py
counts). executed_mfu is the shared node's executed FLOPs / time / the matmul peak of the dtype measured in
the same run.

--e2e adds the gain through the real stack: one `python -m worker` serving two gateways, one with
sharing (the default threshold) and one that never shares; requests sent one at a time, alternating,
as token ids over HTTP. It also reports the worker's fitted latency model's error on the shared
batches it served (predicted from their computed tokens, against the worker's measured compute_ms).

--dtype int8 quantizes the --int8-base model (default: bf16 where oneDNN multiplies bfloat16 on this CPU, else
fp32; bench/harness/common.default_int8_base) with `[quantize] int8` (random-id calibration, the default gate, or with
--int8-budget N a selection budget of N nats and a gate loosened to match, as bench/score_node.py's;
compile/quantize/); transformers runs the base.

    .venv/bin/python bench/shared_prefix.py [--dtype fp32|bf16|int8] [--int8-base bf16|fp32] [--int8-budget NATS]
                                            [--layers N]
                                            [--requests R] [--e2e] [--quick]
"""

from __future__ import annotations

import argparse
import random

import torch

from bench.harness import hf_baselines as hf_side
from bench.harness import parity
from bench.harness.common import (CACHE, FLOAT_DTYPES, MODELS, SCORE_BOUNDS, add_int8_base, add_int8_budget, bench_config,
                          build_nodes, emit, int8_report, interleaved_round, matmul_peak_flops, model_gemm_shapes,
                          run_dtype, run_name, run_quantize, settle_int8_base, shaped_checkpoint)
from bench.harness.flops import executed_mfu, score_flops, shared_score_flops
from shared.manifest import read_manifest

ITEMS = 15
LABELS = torch.tensor([9454, 2152])  # two label ids ("yes"/"no" in Qwen's vocabulary)
PAD_ID = 0
SHARED_ABS = 1e-4  # fp32: sharing changes where keys/values come from, never which are attended to


def make_requests(count: int, vocab: int, context: tuple[int, int], item: tuple[int, int], seed: int = 0):
    """[(context ids, [item ids] * ITEMS)] with uniform lengths (fixed seed)."""
    rng = random.Random(seed)
    ids = lambda n: torch.tensor([rng.randrange(vocab) for _ in range(n)])  # noqa: E731
    return [(ids(rng.randint(*context)), [ids(rng.randint(*item)) for _ in range(ITEMS)]) for _ in range(count)]


def build_config(checkpoint, dtype_name: str, quantize=None):
    """The scoring node's config; `quantize` an int8 run's [quantize] (bench/harness/common.int8_config)."""
    return bench_config(checkpoint, dtype_name, quantize=quantize, **SCORE_BOUNDS)


def build_node(config, name: str):
    return build_nodes(config, name).score


def contenders(node, hf, context: torch.Tensor, items: list[torch.Tensor]) -> dict:
    full = [torch.cat([context, item]) for item in items]
    compact = torch.cat([context, *items])
    item_lens, full_lens = torch.tensor([len(i) for i in items]), torch.tensor([len(f) for f in full])
    one_group = (torch.tensor([len(context)]), torch.tensor([ITEMS]))
    return {
        "shared": lambda: node(compact, item_lens, LABELS, 1, *one_group),
        "unshared": lambda: node(torch.cat(full), full_lens, LABELS, 1),
        "hf_careful": lambda: hf_side.careful(hf, full, PAD_ID),
    }


def time_requests(node, hf, requests) -> tuple[dict, list[dict]]:
    """Per request one interleaved round (order rotated): name -> mean seconds, outputs per request."""
    seconds, outputs = {}, []
    for index, (context, items) in enumerate(requests):
        fns = contenders(node, hf, context, items)
        names = list(fns)[index % 3:] + list(fns)[: index % 3]
        round_ = interleaved_round({n: fns[n] for n in names})
        for name, (s, _) in round_.items():
            seconds.setdefault(name, []).append(s)
        outputs.append({name: value for name, (_, value) in round_.items()})
    return {name: sum(s) / len(s) for name, s in seconds.items()}, outputs


def checks_for(outputs: list[dict], dtype: str, reference: list[torch.Tensor] | None,
               quantized_abs: float = parity.QUANTIZED_ABS) -> list[dict]:
    """fp32: shared equals unshared (SHARED_ABS, same top-1) and transformers (FP32_ABS). bf16: a changed
    summation order moves bf16 results by more than any fixed bound, so shared and unshared are each
    held to the bf16 bound against transformers in float32 (1.5x transformers' own bf16 error + 0.02).
    int8: shared against unshared and each top-1 against transformers in float32 within `quantized_abs`
    (parity.QUANTIZED_ABS, the bound of every quantized contender, whatever the build's gate allowed)."""
    checks = []
    for r, out in enumerate(outputs):
        shared, unshared, careful = out["shared"], out["unshared"], out["hf_careful"][:, LABELS]
        if dtype == "int8":
            checks.append(parity.close_check(f"shared_vs_unshared_label_logits[{r}]", shared.label_logits,
                                             unshared.label_logits, quantized_abs))
            for name, side in (("shared", shared), ("unshared", unshared)):
                checks.append(parity.top1_check(f"{name}_top1_vs_fp32[{r}]", side.topk_ids[:, 0],
                                                side.topk_logprobs[:, 0], reference[r], quantized_abs))
            continue
        if dtype == "bf16":
            for name, side in (("shared", shared), ("unshared", unshared)):
                checks.append(parity.bf16_check(f"{name}_label_logits_vs_fp32[{r}]", side.label_logits, careful,
                                                reference[r][:, LABELS]))
            continue
        checks.append(parity.close_check(f"shared_vs_unshared_label_logits[{r}]", shared.label_logits,
                                         unshared.label_logits, SHARED_ABS))
        checks.append({"check": f"shared_vs_unshared_top1[{r}]", "ok": torch.equal(shared.topk_ids, unshared.topk_ids)})
        checks.append(parity.close_check(f"shared_vs_hf_careful_label_logits[{r}]", shared.label_logits, careful,
                                         parity.FP32_ABS))
    return checks


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
    parser.add_argument("--dtype", choices=(*sorted(FLOAT_DTYPES), "int8"), default="fp32")
    add_int8_base(parser)
    add_int8_budget(parser)
    parser.add_argument("--layers", type=int, help="decoder layers (default: the real model's depth; quick 2)")
    parser.add_argument("--requests", type=int, help="timed requests (default 2, quick 1)")
    parser.add_argument("--e2e", action="store_true", help="also measure through the gateway (real worker)")
    parser.add_argument("--e2e-requests", type=int, default=2, help="requests per gateway in --e2e")
    parser.add_argument("--quick", action="store_true", help="a smoke test: 2 layers, 1 request")
    parser.add_argument("--threads", type=int, help="threads for every contender (default: one per core)")
    return settle_int8_base(parser, parser.parse_args())


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    family, shape, depth = MODELS[args.model]
    layers = args.layers or (2 if args.quick else depth)
    quick = args.quick or layers != depth
    dtype = run_dtype(args)
    from compile.checkpoint import read_spec
    from transformers import AutoModelForCausalLM

    checkpoint = shaped_checkpoint(family, shape, layers, dtype)
    spec = read_spec(checkpoint)
    config = build_config(checkpoint, str(dtype).removeprefix("torch."), run_quantize(args))
    artifacts_name = f"shared-{run_name(args, layers)}"
    node = build_node(config, artifacts_name)
    hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype).eval()
    requests = make_requests(1 + (args.requests or (1 if args.quick else 2)), spec.vocab_size, (200, 400), (16, 64))
    warmup, timed = requests[0], requests[1:]
    peak_shapes = ((2048, 2048, 2048), *model_gemm_shapes(spec))
    peak_before = matmul_peak_flops(dtype, peak_shapes)
    interleaved_round(contenders(node, hf, *warmup))
    seconds, outputs = time_requests(node, hf, timed)
    peak = max(peak_before, matmul_peak_flops(dtype, peak_shapes))
    reference = None
    if args.dtype != "fp32":
        hf32 = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
        reference = [hf_side.careful(hf32, [torch.cat([c, i]) for i in items], PAD_ID) for c, items in timed]
    quantized = read_manifest(CACHE / "artifacts" / artifacts_name).quantize if args.dtype == "int8" else None
    checks = checks_for(outputs, args.dtype, reference)
    flops_shared = sum(shared_score_flops(spec, len(c), [len(i) for i in items]) for c, items in timed)
    flops_unshared = sum(score_flops(spec, [len(c) + len(i) for i in items]) for c, items in timed)
    result = {
        "model": args.model, "layers": layers, "dtype": args.dtype, "int8_base": args.int8_base,
        "int8_budget": args.int8_budget if args.dtype == "int8" else None, "quick": quick,
        "items": ITEMS,
        "context_tokens": [len(c) for c, _ in timed], "requests": len(timed),
        "batched": "one request per call on every side (15 samples)",
        "shared_s_per_request": seconds["shared"], "unshared_s_per_request": seconds["unshared"],
        "hf_careful_s_per_request": seconds["hf_careful"],
        "speedup_vs_unshared": seconds["unshared"] / seconds["shared"],
        "speedup_vs_hf": seconds["hf_careful"] / seconds["shared"],
        "flop_bound": flops_unshared / flops_shared,
        # int8 layers run integer dot products against a float peak: no single peak to divide by
        "executed_mfu": None if args.dtype == "int8" else executed_mfu(flops_shared / len(timed),
                                                                       seconds["shared"], peak),
        "executed_mfu_unshared": None if args.dtype == "int8" else executed_mfu(flops_unshared / len(timed),
                                                                                 seconds["unshared"], peak),
        "peak_gflops": peak / 1e9,
        "max_abs_diff_vs_hf": max(float((o["shared"].label_logits - o["hf_careful"][:, LABELS]).abs().max())
                                  for o in outputs),
        "max_abs_diff_vs_unshared": max(float((o["shared"].label_logits - o["unshared"].label_logits).abs().max())
                                        for o in outputs),
        "cached_tokens_per_request": [int(o["shared"].cached_tokens.sum()) for o in outputs],
        **int8_report(quantized), "int8_sanity_bound": parity.QUANTIZED_ABS if args.dtype == "int8" else None,
        "parity": checks,
    }
    if args.e2e:
        from bench.harness.shared_prefix_e2e import measure_e2e

        result["e2e"] = measure_e2e(config, CACHE / "artifacts" / artifacts_name, timed[: args.e2e_requests]
                                    if len(timed) >= args.e2e_requests else requests[: args.e2e_requests])
    threads = f"-{args.threads}t" if args.threads else ""
    emit(f"shared_prefix-{run_name(args, layers)}{threads}{'-quick' if args.quick else ''}", result)
    failed = [c["check"] for c in checks if not c["ok"]]
    if failed:
        raise SystemExit(f"parity failed: {failed}")


if __name__ == "__main__":
    main()
