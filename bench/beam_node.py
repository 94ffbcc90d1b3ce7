"""Bounded beam search: our compiled beam node against transformers generate() and CTranslate2, in one run.

Model: Qwen2.5-0.5B's shapes at its real depth (or --layers N), random weights, float32 (so that
"identical" can be checked to the last token). Each request: one prompt of 256 tokens, W = 100
beams, S = 4 new tokens, k = 4 candidates returned. Each contender is first called once, untimed, on one
prompt (its warm-up; bench/harness/memory.py measures how much memory the call needs). Then two figures per contender:
  single   one request per call, the contenders' calls interleaved (order rotated per prompt): latency;
  batched  requests per second at the contender's best batching, swept: our node with 1, 2 or 4
           prompts per call (its compiled bound), CTranslate2 with 1, 2 or 4 (max_batch_size =
           the batch), transformers with 1 or 2 (a batch of 2 already expands to 2·W·256 tokens).
           One call per size, each contender's sizes in turn. Each starts from a heap whose free pages
           went back to the kernel (its pages are faulted in inside the timed call, where a single call
           runs on the heap its earlier calls left: batched figures are, if anything, low), and a size
           whose projected memory does not fit the machine's free memory is skipped and named in
           `batched_skipped` (bench/harness/memory.py; CTranslate2's 4 prompts need ~16 GiB beyond the process's
           resident set, which a 24 GiB machine holding every contender does not have).
transformers' generate() repeats the prompt for every beam before prefill; our node prefills it
once and shares its K/V with all beams; CTranslate2 runs its own beam search (beam_size = W).
Every output is checked (bench/harness/parity.py); the run exits non-zero on a disagreement.
The other precisions, each our node on the same float32 checkpoint, timed beside the others:
  --bf16  our node built in bfloat16 (weights rounded once at load) as `ours_bf16`;
  --int8  our node built with `[quantize] int8` on its --int8-base (default: bf16 where oneDNN multiplies
          bfloat16 on this CPU, else fp32; bench/harness/common.default_int8_base), with random-id calibration and the
          default gate, or with --int8-budget N a selection budget of N nats and a gate loosened to match (as
          bench/score_node.py's), as `ours_int8`.
Each reports (keys `bf16`, `int8`) its speed-up over our float32 node, over our bfloat16 node where the run has
one, and over CTranslate2 (float32), single and at each side's best batching; how many of the returned top-k
candidates differ from our float32 node's on the same prompts; and the largest difference of the best
candidate's score. Each is held to parity on its best candidate only (a lower precision changes scores, and with
them which beams survive): its score within parity.QUANTIZED_ABS of transformers' float32 score of the same
sequence, and that sequence no worse than float32's best by more (bench/parity.top_beam_check); a run that misses
it writes nothing.

    .venv/bin/python bench/beam_node.py [--model qwen2.5-0.5b|qwen3-0.6b] [--layers N] [--quick] [--no-ct2]
                                         [--bf16] [--int8 [--int8-base bf16|fp32] [--int8-budget NATS]]
    .venv/bin/python bench/beam_node.py --runtime-constraints ...   (bench/beam_catalog.py: the catalogue as the
        node's inputs against compiled in, and a 1M-item catalogue swap; its own options)
"""

from __future__ import annotations

import argparse
import sys

import torch

from bench.harness import hf_baselines as hf_side
from bench.harness import memory, parity
from bench.harness.common import (FLOAT_DTYPES, MODELS, Clock, add_int8_base, add_int8_budget, bench_config, budget_label,
                          build_nodes, default_int8_base, emit, int8_config, interleaved_round, matmul_peaks, median,
                          model_gemm_shapes, peak_by_library, shaped_checkpoint, time_calls)
from bench.harness.flops import beam_flops, executed_mfu
from worker.runtime.allocator import release_free_memory

W, S, K = 100, 4, 4
PAD_ID = 0
IDENTICAL_ABS, PEER_ABS = 1e-4, 1e-3  # score tolerance: our node against generate(); CTranslate2 against it
PRECISIONS = ("bf16", "int8")  # the other precisions of our node a run may add (--bf16, --int8), as `ours_<name>`
VARIANT_NAMES = tuple(f"ours_{p}" for p in PRECISIONS)


def build_node(checkpoint, name: str, max_width: int, quantize=None, dtype: str = "float32"):
    """Our beam node in `dtype`; `quantize` an int8 build's [quantize] (bench/harness/common.int8_config)."""
    return build_nodes(bench_config(checkpoint, dtype, ("beam",), quantize=quantize,
                                    max_beam_width=max_width, max_new_tokens=S, max_prompt_tokens=512,
                                    max_beam_requests_per_batch=4), name)


class Contenders:
    """Callables for a batch of prompts, each returning (tokens [R, k, S], scores [R, k], lens or None).
    `variants`: our node in the run's other precisions, by contender name (`ours_bf16`, `ours_int8`)."""

    def __init__(self, node, hf, ct2, variants: dict | None = None):
        self.node, self.hf, self.ct2, self.variants = node, hf, ct2, variants or {}

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
        for name, node in self.variants.items():
            fns[name] = self.ours(prompts, node=node)
        return fns


def warm_up(contenders: Contenders, prompt) -> dict:
    """Each contender's first call, untimed, on a full-size request (one prompt): name -> how far it raised the
    process's resident set (bytes; absent where unknown; bench/harness/memory.py). Each starts from a heap whose free pages
    went back to the kernel, so that its rise counts all the call needs (a call that reuses free memory an earlier
    call left in the heap rises less: at 24 layers CTranslate2's single call rose 4.5 GiB after transformers', 7.7
    before it)."""
    rises = {}
    for name, fn in contenders.batch([prompt]).items():
        release_free_memory()
        _, _, rise = memory.measured_call(fn)
        if rise is not None:
            rises[name] = rise
    return rises


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


def run_batched(contenders: Contenders, prompts, sizes: dict[str, tuple[int, ...]],
                rises: dict) -> tuple[dict, list[dict], dict]:
    """Each contender's batch sizes above 1 in rising order, one call each: (name, size) -> seconds per call,
    outputs, and (name, size) -> why it was skipped. Before each call the heap's free pages go back to the kernel
    (untimed), so that memory one contender kept does not crowd out the next, and the call's rise of the resident
    set counts all it needs. A call is skipped where the contender's last measured rise (`rises`: its warm-up call's
    on one prompt, until a batched call of its own is measured), scaled to the batch, would not fit in the memory
    then available (bench/harness/memory.fits)."""
    seconds, outputs, skipped = {}, [], {}
    for name, batch_sizes in sizes.items():
        measured_size, rise = 1, rises.get(name)
        for size in sorted(batch_sizes):
            release_free_memory()
            fit, why = memory.fits(rise, measured_size, size, memory.available())
            if not fit:
                skipped[(name, size)] = why
                print(f"[beam_node] skipped {name} with {size} prompts per call: {why}", file=sys.stderr, flush=True)
                continue
            s, value, batch_rise = memory.measured_call(contenders.batch(prompts[:size])[name])
            seconds[(name, size)] = s
            outputs.append({"name": name, "prompts": list(range(size)), "value": value})
            if batch_rise is not None:
                measured_size, rise = size, batch_rise
    return seconds, outputs, skipped


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


def unchecked(outputs: list[dict]) -> list[int]:
    """Prompts that no float32 output is checked on: their reference is the only float32 output that holds them
    (our node's batch of 4 holds prompts 2 and 3, which otherwise only CTranslate2's batch of 4 runs)."""
    ref = references(outputs)
    checked = {p for o in outputs if o["name"] not in VARIANT_NAMES for p in o["prompts"] if ref[p] is not o}
    return sorted(set(ref) - checked)


def row(output: dict, prompt: int):
    """One prompt's (tokens [1, k, S], scores [1, k], lens [1, k] or None) out of a batched output."""
    i = output["prompts"].index(prompt)
    tokens, scores, lens = output["value"]
    return tokens[i:i + 1], scores[i:i + 1], None if lens is None else lens[i:i + 1]


def checks(outputs: list[dict]) -> list[dict]:
    """Every output row against its prompt's reference; CTranslate2 within PEER_ABS, ours and
    transformers' batched calls within IDENTICAL_ABS; our node in another precision (a lower precision changes
    scores, and with them which beams survive) on its best candidate within parity.QUANTIZED_ABS
    (parity.top_beam_check; its output's "rescored": float32's score of each prompt's best sequence, rescored()),
    so that no speed-up of it is reported without a parity check."""
    ref, found = references(outputs), []
    for o in outputs:
        for p in o["prompts"]:
            r = ref[p]
            if r is o:
                continue
            if o["name"] in VARIANT_NAMES:
                i = o["prompts"].index(p)
                found.append(parity.top_beam_check(f"{o['name']}[batch {len(o['prompts'])}] prompt {p} best vs "
                                                   f"{r['name']}", o["value"][1][i:i + 1, 0], o["rescored"][i:i + 1],
                                                   r["value"][1][r["prompts"].index(p)][None, 0], parity.QUANTIZED_ABS))
                continue
            tolerance = PEER_ABS if "ct2" in (o["name"], r["name"]) else IDENTICAL_ABS
            tokens, scores, lens = row(o, p)
            ref_tokens, ref_scores, _ = row(r, p)
            found.append(parity.beams_check(f"{o['name']}[batch {len(o['prompts'])}] prompt {p} vs {r['name']}",
                                            tokens, scores, lens, ref_tokens, ref_scores, tolerance))
    return found


def rescored(outputs: list[dict], hf, prompts) -> list[dict]:
    """The outputs, each of our node in another precision with "rescored": transformers' float32 score of each of
    its prompts' best sequence [R] (bench/hf_baselines.rescore)."""
    for o in outputs:
        if o["name"] in VARIANT_NAMES:
            tokens, _, lens = o["value"]
            o["rescored"] = torch.tensor([hf_side.rescore(hf, prompts[p], tokens[i, 0, :int(lens[i, 0])])
                                          for i, p in enumerate(o["prompts"])])
    return outputs


def changes(outputs: list[dict], name: str) -> dict:
    """How many of contender `name`'s returned candidates are not among our float32 node's for the same prompt,
    and the largest difference between its best candidate's score and our float32 node's."""
    ours = {p: o for o in outputs if o["name"] == "ours" for p in o["prompts"]}
    changed = total = 0
    best_diff = 0.0
    for o in outputs:
        if o["name"] != name:
            continue
        for p in o["prompts"]:
            (tokens, scores, _), (ref_tokens, ref_scores, _) = row(o, p), row(ours[p], p)
            changed += sum(candidate not in ref_tokens[0].tolist() for candidate in tokens[0].tolist())
            total += tokens.shape[1]
            best_diff = max(best_diff, float((scores[0, 0] - ref_scores[0, 0]).abs()))
    return {"candidates_changed": changed, "candidates": total, "best_score_max_abs_diff": best_diff}


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
    parser.add_argument("--bf16", action="store_true", help="add our node built in bfloat16")
    parser.add_argument("--int8", action="store_true", help="add our node built with [quantize] int8")
    add_int8_base(parser)
    add_int8_budget(parser)
    parser.add_argument("--sweep", action="store_true", help="add our node's latency over W x prompt length")
    parser.add_argument("--build-only", action="store_true", help="write the checkpoint, compile the node, convert "
                        "it for CTranslate2 (all cached in bench/.cache) and stop")
    args = parser.parse_args()
    for option in ("int8_budget", "int8_base"):
        if getattr(args, option) is not None and not args.int8:
            parser.error(f"--{option.replace('_', '-')} goes with --int8")
    if args.int8:
        args.int8_base = args.int8_base or default_int8_base()
    return args


def int8_name(args) -> str:
    """An --int8 run's part of the build folder and result file names: `-int8` on a bfloat16 base, `-int8-fp32` on
    float32 (as bench/harness/common.dtype_label), then its budget (`-int8-fp32-1nats`)."""
    if not args.int8:
        return ""
    return "-int8" + ("-fp32" if args.int8_base == "fp32" else "") + budget_label(args.int8_budget)


def precisions_name(args) -> str:
    """The result file's part naming the run's other precisions: `-bf16`, then int8_name (`-bf16-int8-1nats`)."""
    return ("-bf16" if args.bf16 else "") + int8_name(args)


def speedups(sides: dict) -> dict:
    """Latency ratios of single requests, and throughput ratios at each side's best batching."""
    ours, out = sides["ours"], {}
    for name in ("hf", "ct2"):
        side = sides.get(name)
        out[f"speedup_vs_{name}_single"] = side and side["single_ms"] / ours["single_ms"]
        out[f"speedup_vs_{name}_batched"] = side and ours["best_requests_per_s"] / side["best_requests_per_s"]
    return out


def variant_summary(sides: dict, name: str, changed: dict) -> dict:
    """Our node in another precision (contender `name`) against our float32 node, our bfloat16 node (None where the
    run has none) and CTranslate2 (float32): single latency and best-batching throughput ratios, then `changed`
    (changes())."""
    variant, out = sides[name], {}
    for peer, key in (("ours", "fp32"), ("ours_bf16", "bf16"), ("ct2", "ct2")):
        if peer == name:
            continue
        side = sides.get(peer)
        out[f"speedup_vs_{key}_single"] = side and side["single_ms"] / variant["single_ms"]
        out[f"speedup_vs_{key}_batched"] = side and variant["best_requests_per_s"] / side["best_requests_per_s"]
    return out | changed


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
    """(spec, compiled nodes, transformers or None with --build-only, CTranslate2 or None, layers, our beam node
    in the run's other precisions by contender name)."""
    from compile.checkpoint import read_spec
    from transformers import AutoModelForCausalLM

    from bench.harness.ct2_baseline import Ct2Model

    family, shape, depth = MODELS[args.model]
    layers = args.layers or (2 if args.quick else depth)
    checkpoint = shaped_checkpoint(family, shape, layers, torch.float32)
    nodes = build_node(checkpoint, f"beam-{args.model}-{layers}l", 400)
    variants = {}
    if args.bf16:
        variants["ours_bf16"] = build_node(checkpoint, f"beam-{args.model}-bf16-{layers}l", 400,
                                           dtype="bfloat16").beam
    if args.int8:
        base = str(FLOAT_DTYPES[args.int8_base]).removeprefix("torch.")
        variants["ours_int8"] = build_node(checkpoint, f"beam-{args.model}{int8_name(args)}-{layers}l", 400,
                                           int8_config(args.int8_budget), dtype=base).beam
    ct2 = None if args.no_ct2 else Ct2Model(checkpoint, torch.get_num_threads())
    hf = None if args.build_only else AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    return read_spec(checkpoint), nodes, hf, ct2, layers, variants


def measure(contenders: Contenders, prompts, singles: int, spec) -> dict:
    """Singles (interleaved) then batched calls, with the fp32 peak measured before and after."""
    peak_shapes, clock = ((2048, 2048, 2048), *model_gemm_shapes(spec, tokens=W)), Clock()
    peak_before = matmul_peaks(torch.float32, peak_shapes)
    rises = warm_up(contenders, prompts[0])
    clock.lap("peak_before_and_warm_up")
    single_s, single_outputs = run_singles(contenders, prompts[:singles])
    clock.lap("singles")
    sizes = {"ours": (2, 4), "hf": (2,)} | ({"ct2": (2, 4)} if contenders.ct2 is not None else {}) \
        | {name: (2, 4) for name in contenders.variants}
    batched_s, batched_outputs, skipped = run_batched(contenders, prompts, sizes, rises)
    clock.lap("batched")
    peak_after = matmul_peaks(torch.float32, peak_shapes)
    clock.lap("peak_after")
    outputs = rescored(single_outputs + batched_outputs, contenders.hf, prompts)
    return {"sides": summary(single_s, batched_s), "checks": checks(outputs), "unchecked_prompts": unchecked(outputs),
            "changes": {name: changes(outputs, name) for name in contenders.variants},
            "peaks": (peak_before, peak_after), "phase_seconds": clock.laps, "batched_skipped": skipped,
            "warm_up_rise_gib": {name: round(rise / memory.GIB, 2) for name, rise in rises.items()}}


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
        **{precision: variant_summary(sides, f"ours_{precision}", m["changes"][f"ours_{precision}"])
           if f"ours_{precision}" in sides else None for precision in PRECISIONS},
        "int8_base": args.int8_base, "int8_budget": args.int8_budget,
        "parity_ok": parity.all_ok(found), "W": W, "S": S, "k": K, "singles": args.singles, "sides": sides,
        "batching": {name: f"single: 1 prompt per call; batched: {side['best_batch']} prompts per call (best of "
                           f"{sorted(side['requests_per_s_by_batch'])}"
                           + "".join(f"; {size} skipped for memory" for n, size in m["batched_skipped"] if n == name)
                           + ")" for name, side in sides.items()},
        # batch sizes not run for want of memory (bench/harness/memory.py, with the rise each was projected from), each
        # contender's warm-up call's rise of the resident set (one prompt, from a trimmed heap), and prompts no
        # float32 output was checked on (with a batch skipped, only our node may have run them)
        "batched_skipped": {f"{name} x{size}": why for (name, size), why in m["batched_skipped"].items()},
        "warm_up_rise_gib": m["warm_up_rise_gib"],
        "unchecked_prompts": m["unchecked_prompts"],
        "executed_gflop_per_request": beam_flops(spec, [length], W, S) / 1e9, "peak_gflops": peak / 1e9,
        "peak_gflops_by_library": peak_by_library(m["peaks"]), "phase_seconds": m["phase_seconds"], "parity": found,
    }


def main() -> None:
    if "--runtime-constraints" in sys.argv[1:]:
        from bench.beam_catalog import main as runtime_constraints
        return runtime_constraints([a for a in sys.argv[1:] if a != "--runtime-constraints"])
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = Clock()
    spec, nodes, hf, ct2, layers, variants = prepare(args)
    if args.build_only:
        return
    clock.lap("prepare")
    length = args.prompt_tokens or (64 if args.quick else 256)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, spec.vocab_size, (length,), generator=g) for _ in range(4)]
    measured = measure(Contenders(nodes.beam, hf, ct2, variants), prompts, args.singles, spec)
    measured["phase_seconds"] = clock.laps | measured["phase_seconds"]
    result = report(args, spec, layers, length, measured)
    if args.sweep:
        result["sweep"] = sweep_ours(nodes.beam, spec.vocab_size, (8, 32, 100, 400), (64, 256, 480))
    emit(f"beam_node-{args.model}-{layers}l-{length}t{precisions_name(args)}" + ("-quick" if args.quick else ""),
         result)
    if not result["parity_ok"]:
        sys.exit("parity failed: " + ", ".join(c["check"] for c in result["parity"] if not c["ok"]))


if __name__ == "__main__":
    main()
