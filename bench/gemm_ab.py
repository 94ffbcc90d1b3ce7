"""A/B of the build option model.gemm (compile/linear.py): the same node compiled with aten and with
oneDNN linears, timed interleaved in one process, outputs compared.

Scoring: requests of 15 samples of 32..480 tokens (as bench/score_node.py), label logits of both
builds against transformers (careful, same dtype as the node for fp32; float32 for bf16). Beam:
one 256-token prompt, W = 100, S = 4, k = 4 (as bench/beam_node.py), the two builds against each
other. Each round calls both builds back to back, the order alternating; the figure is the median
over rounds of aten's time / oneDNN's time. Records the load average at start and end.

    .venv/bin/python bench/gemm_ab.py [--node score|beam] [--dtype fp32|bf16] [--layers 4] [--rounds 6]
"""

from __future__ import annotations

import argparse
import os

import torch

from bench.harness import hf_baselines as hf_side
from bench.harness.common import MODELS, SCORE_BOUNDS, bench_config, build_nodes, emit, interleaved_round, median, shaped_checkpoint
from bench.harness.common import FLOAT_DTYPES as DTYPES
from bench.score_node import LABELS, PAD_ID, SAMPLES, make_requests

BACKENDS = ("aten", "onednn")
W, S, K, PROMPT_TOKENS = 100, 4, 4, 256


def build(checkpoint, node: str, dtype_name: str, gemm: str, name: str):
    """Compile one node with model.gemm = gemm (cached in bench/.cache/artifacts/name)."""
    config = bench_config(checkpoint, dtype_name, (node,), gemm, **SCORE_BOUNDS, max_beam_width=W, max_new_tokens=S,
                          max_prompt_tokens=512, max_beam_requests_per_batch=1)
    return getattr(build_nodes(config, name), node)


def calls(node_name: str, nodes: dict, vocab: int, rounds: int) -> list[dict]:
    """Per round: backend -> zero-argument call (the same inputs for both backends)."""
    if node_name == "score":
        requests = make_requests(rounds, SAMPLES, 32, 480, vocab)
        packed = [(torch.cat(r), torch.tensor([len(s) for s in r])) for r in requests]
        return [{b: (lambda b=b, p=p: nodes[b](*p, LABELS, 2)) for b in BACKENDS} for p in packed], requests
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (PROMPT_TOKENS,), generator=generator) for _ in range(rounds)]
    return [{b: (lambda b=b, p=p: nodes[b](p, torch.tensor([len(p)]), W, S, K)) for b in BACKENDS}
            for p in prompts], prompts


def time_rounds(rounds: list[dict]) -> tuple[list[float], dict, list[dict]]:
    """Interleaved timing, order alternating per round: aten/oneDNN ratios, seconds, outputs."""
    seconds, outputs, ratios = {b: [] for b in BACKENDS}, [], []
    for index, fns in enumerate(rounds):
        order = BACKENDS if index % 2 == 0 else BACKENDS[::-1]
        got = interleaved_round({b: fns[b] for b in order})
        for b in BACKENDS:
            seconds[b].append(got[b][0])
        ratios.append(got["aten"][0] / got["onednn"][0])
        outputs.append({b: got[b][1] for b in BACKENDS})
    return ratios, seconds, outputs


def score_diffs(outputs: list[dict], requests, checkpoint, dtype: torch.dtype) -> dict:
    """Largest |label logit| difference of each build against transformers careful (float32 for a
    bf16 node, so both builds' bf16 error is shown), and between the two builds."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32 if dtype == torch.bfloat16 else dtype)
    hf = hf.eval()
    diffs = {"aten_vs_hf": 0.0, "onednn_vs_hf": 0.0, "aten_vs_onednn": 0.0}
    for out, samples in zip(outputs, requests):
        reference = hf_side.careful(hf, samples, PAD_ID)[:, LABELS].float()
        a, o = out["aten"].label_logits.float(), out["onednn"].label_logits.float()
        diffs["aten_vs_hf"] = max(diffs["aten_vs_hf"], (a - reference).abs().max().item())
        diffs["onednn_vs_hf"] = max(diffs["onednn_vs_hf"], (o - reference).abs().max().item())
        diffs["aten_vs_onednn"] = max(diffs["aten_vs_onednn"], (a - o).abs().max().item())
    return diffs


def beam_diffs(outputs: list[dict]) -> dict:
    same_tokens = all(torch.equal(o["aten"][0], o["onednn"][0]) for o in outputs)
    score_diff = max((o["aten"][1].float() - o["onednn"][1].float()).abs().max().item() for o in outputs)
    return {"identical_tokens": same_tokens, "max_abs_score_diff": score_diff}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node", choices=("score", "beam"), default="score")
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds (one request each), after one warm-up")
    args = parser.parse_args()
    family, shape, depth = MODELS[args.model]
    dtype = DTYPES[args.dtype]
    checkpoint = shaped_checkpoint(family, shape, args.layers, dtype)
    dtype_name = str(dtype).removeprefix("torch.")
    nodes = {b: build(checkpoint, args.node, dtype_name, b, f"gemm-{args.node}-{args.model}-{args.dtype}-"
                      f"{args.layers}l-{b}") for b in BACKENDS}
    load_start = os.getloadavg()
    rounds, inputs = calls(args.node, nodes, shape["vocab_size"], args.rounds + 1)
    interleaved_round(rounds[0])  # warm-up
    ratios, seconds, outputs = time_rounds(rounds[1:])
    diffs = (score_diffs(outputs, inputs[1:], checkpoint, dtype) if args.node == "score" else beam_diffs(outputs))
    emit(f"gemm_ab_{args.node}_{args.dtype}_{args.layers}l", {
        "bench": "gemm_ab", "node": args.node, "model": args.model, "dtype": args.dtype, "layers": args.layers,
        "quick": args.layers != depth, "threads": torch.get_num_threads(), "rounds": args.rounds,
        "median_speedup_onednn_vs_aten": median(ratios), "ratios": [round(r, 3) for r in ratios],
        "median_ms": {b: 1e3 * median(s) for b, s in seconds.items()}, **diffs,
        "load_average_start": load_start, "load_average_end": os.getloadavg(),
    })


if __name__ == "__main__":
    main()
