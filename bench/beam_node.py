"""Bounded beam search: our compiled beam node against transformers generate() and CTranslate2, in one run.

Model: Qwen2.5-0.5B's shapes at its real depth (or --layers N), random weights, float32 (so that
"identical" can be checked to the last token). Each request: one prompt of 256 tokens, W = 100
beams, S = 4 new tokens, k = 4 candidates returned. Two figures per contender, timed interleaved:
  single   one request per call: latency;
  batched  requests per second at the contender's best batching, swept: our node with 1, 2 or 4
           prompts per call (its compiled bound), CTranslate2 with 1, 2 or 4 (max_batch_size =
           the batch), transformers with 1 or 2 (a batch of 2 already expands to 2·W·256 tokens).
transformers' generate() repeats the prompt for every beam before prefill; our node prefills it
once and shares its K/V with all beams; CTranslate2 runs its own beam search (beam_size = W).
Every output is checked (bench/parity.py); the run exits non-zero on a disagreement.
--int8 adds our node built with `[quantize] int8` (random-id calibration, the default gate, or with --int8-budget N
a selection budget of N nats and a gate loosened to match, as bench/score_node.py's) as `ours_int8`,
timed interleaved with the others: `int8` reports its speed-up over our float32 node and how many of the
returned top-k candidates differ from our float32 node's on the same prompts (not held to parity: int8
changes scores).

    .venv/bin/python bench/beam_node.py [--model qwen2.5-0.5b|qwen3-0.6b] [--layers N] [--quick] [--no-ct2]
                                         [--int8 [--int8-budget NATS]]
"""

from __future__ import annotations

import argparse
import sys

import torch

from bench import hf_baselines as hf_side
from bench import parity
from bench.common import (MODELS, Clock, add_int8_budget, bench_config, budget_label, build_nodes, emit, int8_config,
                          interleaved_round, matmul_peaks, median, model_gemm_shapes, peak_by_library,
                          shaped_checkpoint, time_calls)
from bench.flops import beam_flops, executed_mfu

W, S, K = 100, 4, 4
PAD_ID = 0
IDENTICAL_ABS, PEER_ABS = 1e-4, 1e-3  # score tolerance: our node against generate(); CTranslate2 against it


def build_node(checkpoint, name: str, max_width: int, quantize=None):
    """Our beam node in float32; `quantize` an int8 build's [quantize] (bench/common.int8_config)."""
    return build_nodes(bench_config(checkpoint, "float32", ("beam",), quantize=quantize,
                                    max_beam_width=max_width, max_new_tokens=S, max_prompt_tokens=512,
                                    max_beam_requests_per_batch=4), name)


class Contenders:
    """Callables for a batch of prompts, each returning (tokens [R, k, S], scores [R, k], lens or None)."""

    def __init__(self, node, hf, ct2, int8_node=None):
        self.node, self.hf, self.ct2, self.int8_node = node, hf, ct2, int8_node

    def ours(self, prompts, width: int = W, node=None):
        ids, lens, node = torch.cat(prompts), torch.tensor([len(p) for p in prompts]), node or self.node
        return lambda: node(ids, lens, width, S, K)

    def hf_call(self, prompts):
        return lambda: (*hf_side.beams(self.hf, prompts, PAD_ID, W, S, K), None)

    def ct2_call(self, prompts):
        rows = self.ct2.strings(prompts)
        return lambda: (*self.ct2.beams("float32", rows, W, S, K, len(rows), PAD_ID), None)

    def batch(self, prompts) -> dict:
        fns = {"ours": self.ours(prompts), "hf": self.hf_call(prompts)}
        if self.ct2 is not None:
            fns["ct2"] = self.ct2_call(prompts)
        if self.int8_node is not None:
            fns["ours_int8"] = self.ours(prompts, node=self.int8_node)
        return fns


def warm_up(contenders: Contenders, prompt) -> None:
    contenders.ours([prompt])()
    if contenders.int8_node is not None:
        contenders.ours([prompt], node=contenders.int8_node)()
    hf_side.beams(contenders.hf, [prompt[:8]], PAD_ID, 2, S, 2)
    if contenders.ct2 is not None:
        contenders.ct2.beams("float32", contenders.ct2.strings([prompt[:8]]), 2, S, 2, 1, PAD_ID)


def run_singles(contenders: Contenders, prompts) -> tuple[dict, list[dict]]:
    """One request per call, interleaved (order rotated): name -> seconds per call, outputs per prompt."""
    seconds, outputs = {}, []
    for i, prompt in enumerate(prompts):
        fns = contenders.batch([prompt])
        names = list(fns)[i % len(fns):] + list(fns)[: i % len(fns)]
        for name, (s, value) in interleaved_round({n: fns[n] for n in names}).items():
            seconds.setdefault(name, []).append(s)
            outputs.append({"name": name, "prompts": [i], "value": value})
    return {name: median(s) for name, s in seconds.items()}, outputs


def run_batched(contenders: Contenders, prompts, sizes: dict[str, tuple[int, ...]]) -> tuple[dict, list[dict]]:
    """Each contender's batch sizes above 1, interleaved: (name, size) -> seconds per call, outputs."""
    fns, outputs = {}, []
    for name, batch_sizes in sizes.items():
        for size in batch_sizes:
            fns[(name, size)] = contenders.batch(prompts[:size])[name]
    timed = interleaved_round(fns)
    for (name, size), (_, value) in timed.items():
        outputs.append({"name": name, "prompts": list(range(size)), "value": value})
    return {key: s for key, (s, _) in timed.items()}, outputs


def references(outputs: list[dict]) -> dict[int, dict]:
    """prompt -> the output it is checked against: transformers' single-request output where it
    ran that prompt alone, else the first output of our node that holds it."""
    ref = {}
    for o in outputs:
        if o["name"] == "hf" and len(o["prompts"]) == 1:
            ref.setdefault(o["prompts"][0], o)
    for o in outputs:
        if o["name"] == "ours":
            for p in o["prompts"]:
                ref.setdefault(p, o)
    return ref


def row(output: dict, prompt: int):
    """One prompt's (tokens [1, k, S], scores [1, k], lens [1, k] or None) out of a batched output."""
    i = output["prompts"].index(prompt)
    tokens, scores, lens = output["value"]
    return tokens[i:i + 1], scores[i:i + 1], None if lens is None else lens[i:i + 1]


def checks(outputs: list[dict]) -> list[dict]:
    """Every output row against its prompt's reference; CTranslate2 within PEER_ABS, ours and
    transformers' batched calls within IDENTICAL_ABS."""
    ref, found = references(outputs), []
    for o in outputs:
        if o["name"] == "ours_int8":  # int8 changes scores: counted by int8_changes, not held to parity
            continue
        for p in o["prompts"]:
            r = ref[p]
            if r is o:
                continue
            tolerance = PEER_ABS if "ct2" in (o["name"], r["name"]) else IDENTICAL_ABS
            tokens, scores, lens = row(o, p)
            ref_tokens, ref_scores, _ = row(r, p)
            found.append(parity.beams_check(f"{o['name']}[batch {len(o['prompts'])}] prompt {p} vs {r['name']}",
                                            tokens, scores, lens, ref_tokens, ref_scores, tolerance))
    return found


def int8_changes(outputs: list[dict]) -> dict:
    """How many of our int8 node's returned candidates are not among our float32 node's for the same prompt."""
    ours = {p: o for o in outputs if o["name"] == "ours" for p in o["prompts"]}
    changed = total = 0
    for o in outputs:
        if o["name"] != "ours_int8":
            continue
        for p in o["prompts"]:
            tokens, ref_tokens = row(o, p)[0][0].tolist(), row(ours[p], p)[0][0].tolist()
            changed += sum(candidate not in ref_tokens for candidate in tokens)
            total += len(tokens)
    return {"candidates_changed": changed, "candidates": total}


def sweep_ours(node, vocab: int, widths, lengths) -> list[dict]:
    """Our node alone, one request per call: how the latency grows with W and prompt length."""
    g = torch.Generator().manual_seed(1)
    points = []
    for length in lengths:
        prompt = torch.randint(0, vocab, (length,), generator=g)
        for width in widths:
            seconds = median(time_calls(lambda: node(prompt, torch.tensor([length]), width, S, K), repeats=1))
            points.append({"W": width, "prompt_tokens": length, "latency_ms": 1e3 * seconds})
    return points


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, help="decoder layers (default: the real model's depth; quick 2)")
    parser.add_argument("--prompt-tokens", type=int, help="prompt length (default 256, quick 64)")
    parser.add_argument("--singles", type=int, default=2, help="prompts timed one per call on every side")
    parser.add_argument("--quick", action="store_true", help="2 layers, 64-token prompts")
    parser.add_argument("--threads", type=int, help="threads for every contender (default: torch's, one per core)")
    parser.add_argument("--no-ct2", action="store_true", help="leave CTranslate2 out")
    parser.add_argument("--int8", action="store_true", help="add our node built with [quantize] int8")
    add_int8_budget(parser)
    parser.add_argument("--sweep", action="store_true", help="add our node's latency over W x prompt length")
    parser.add_argument("--build-only", action="store_true", help="write the checkpoint, compile the node, convert "
                        "it for CTranslate2 (all cached in bench/.cache) and stop")
    args = parser.parse_args()
    if args.int8_budget is not None and not args.int8:
        parser.error("--int8-budget goes with --int8")
    return args


def int8_name(args) -> str:
    """An --int8 run's part of the build folder and result file names: `-int8`, then its budget (`-int8-1nats`)."""
    return f"-int8{budget_label(args.int8_budget)}" if args.int8 else ""


def speedups(sides: dict) -> dict:
    """Latency ratios of single requests, and throughput ratios at each side's best batching."""
    ours, out = sides["ours"], {}
    for name in ("hf", "ct2"):
        side = sides.get(name)
        out[f"speedup_vs_{name}_single"] = side and side["single_ms"] / ours["single_ms"]
        out[f"speedup_vs_{name}_batched"] = side and ours["best_requests_per_s"] / side["best_requests_per_s"]
    return out


def int8_summary(sides: dict, changes: dict) -> dict:
    """Our int8 node against our float32 node: single latency and best-batching throughput ratios."""
    ours, int8 = sides["ours"], sides["ours_int8"]
    return {"speedup_vs_fp32_single": ours["single_ms"] / int8["single_ms"],
            "speedup_vs_fp32_batched": int8["best_requests_per_s"] / ours["best_requests_per_s"], **changes}


def summary(singles: dict, batched: dict) -> dict:
    """Per contender: single latency, and the best requests/s over its batch sizes (1 = singles)."""
    out = {}
    for name, single_s in singles.items():
        rates = {1: 1 / single_s} | {size: size / s for (n, size), s in batched.items() if n == name}
        best = max(rates, key=rates.get)
        out[name] = {"single_ms": 1e3 * single_s, "requests_per_s_by_batch": rates, "best_batch": best,
                     "best_requests_per_s": rates[best]}
    return out


def prepare(args):
    """(spec, compiled nodes, transformers or None with --build-only, CTranslate2 or None, layers, the int8
    beam node or None)."""
    from compile.checkpoint import read_spec
    from transformers import AutoModelForCausalLM

    from bench.ct2_baseline import Ct2Model

    family, shape, depth = MODELS[args.model]
    layers = args.layers or (2 if args.quick else depth)
    checkpoint = shaped_checkpoint(family, shape, layers, torch.float32)
    nodes = build_node(checkpoint, f"beam-{args.model}-{layers}l", 400)
    int8 = build_node(checkpoint, f"beam-{args.model}{int8_name(args)}-{layers}l", 400,
                      int8_config(args.int8_budget)).beam if args.int8 else None
    ct2 = None if args.no_ct2 else Ct2Model(checkpoint, torch.get_num_threads())
    hf = None if args.build_only else AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    return read_spec(checkpoint), nodes, hf, ct2, layers, int8


def measure(contenders: Contenders, prompts, singles: int, spec) -> dict:
    """Singles then batched calls, interleaved, with the fp32 peak measured before and after."""
    peak_shapes, clock = ((2048, 2048, 2048), *model_gemm_shapes(spec, tokens=W)), Clock()
    peak_before = matmul_peaks(torch.float32, peak_shapes)
    warm_up(contenders, prompts[0])
    clock.lap("peak_before_and_warm_up")
    single_s, single_outputs = run_singles(contenders, prompts[:singles])
    clock.lap("singles")
    sizes = {"ours": (2, 4), "hf": (2,)} | ({"ct2": (2, 4)} if contenders.ct2 is not None else {}) \
        | ({"ours_int8": (2, 4)} if contenders.int8_node is not None else {})
    batched_s, batched_outputs = run_batched(contenders, prompts, sizes)
    clock.lap("batched")
    peak_after = matmul_peaks(torch.float32, peak_shapes)
    clock.lap("peak_after")
    outputs = single_outputs + batched_outputs
    return {"sides": summary(single_s, batched_s), "checks": checks(outputs), "int8": int8_changes(outputs)
            if contenders.int8_node is not None else None,
            "peaks": (peak_before, peak_after), "phase_seconds": clock.laps}


def report(args, spec, layers: int, length: int, m: dict) -> dict:
    """The result JSON: the stable keys first, then what they were computed from."""
    sides, found, peak = m["sides"], m["checks"], max(max(p.values()) for p in m["peaks"])
    ours_vs_hf = [c for c in found if c["check"].startswith("ours") and c["check"].endswith("vs hf")]
    best = sides["ours"]["best_batch"]
    return {
        "bench": "beam_node", "model": args.model, "layers": layers, "dtype": "fp32", "prompt_tokens": length,
        "quick": args.quick or layers != MODELS[args.model][2] or length != 256, **speedups(sides),
        "identical_to_hf": bool(ours_vs_hf) and all(c["identical"] for c in ours_vs_hf),
        "executed_mfu_single": executed_mfu(beam_flops(spec, [length], W, S), 1e-3 * sides["ours"]["single_ms"], peak),
        "executed_mfu_batched": executed_mfu(beam_flops(spec, [length] * best, W, S),
                                             best / sides["ours"]["best_requests_per_s"], peak),
        "int8": m["int8"] and int8_summary(sides, m["int8"]), "int8_budget": args.int8_budget,
        "parity_ok": parity.all_ok(found), "W": W, "S": S, "k": K, "singles": args.singles, "sides": sides,
        "batching": {name: f"single: 1 prompt per call; batched: {side['best_batch']} prompts per call (best of "
                           f"{sorted(side['requests_per_s_by_batch'])})" for name, side in sides.items()},
        "executed_gflop_per_request": beam_flops(spec, [length], W, S) / 1e9, "peak_gflops": peak / 1e9,
        "peak_gflops_by_library": peak_by_library(m["peaks"]), "phase_seconds": m["phase_seconds"], "parity": found,
    }


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = Clock()
    spec, nodes, hf, ct2, layers, int8 = prepare(args)
    if args.build_only:
        return
    clock.lap("prepare")
    length = args.prompt_tokens or (64 if args.quick else 256)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, spec.vocab_size, (length,), generator=g) for _ in range(4)]
    measured = measure(Contenders(nodes.beam, hf, ct2, int8), prompts, args.singles, spec)
    measured["phase_seconds"] = clock.laps | measured["phase_seconds"]
    result = report(args, spec, layers, length, measured)
    if args.sweep:
        result["sweep"] = sweep_ours(nodes.beam, spec.vocab_size, (8, 32, 100, 400), (64, 256, 480))
    emit(f"beam_node-{args.model}-{layers}l-{length}t{int8_name(args)}" + ("-quick" if args.quick else ""), result)
    if not result["parity_ok"]:
        sys.exit("parity failed: " + ", ".join(c["check"] for c in result["parity"] if not c["ok"]))


if __name__ == "__main__":
    main()
