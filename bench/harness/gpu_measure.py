"""The measurements of bench/gpu_suite.py: parity, scoring node, beam node, selective FP8, request bodies.

Every comparison runs in the same process and run as what it is compared against: transformers on
the same device and dtype, careful (left-padded batch, only the last position projected) and at
its best (length-sorted micro-batches, the fastest size) for scoring; generate(num_beams=W) one
prompt per call and batched for beams. MFU is the FLOPs our node executes (bench/harness/flops.py) over the
matmul peak measured in the same run (and, separately, over the datasheet figure). Inputs are
random token ids from fixed, distinct seeds.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from bench.harness import hf_baselines as hf_side
from bench.harness import parity as checks
from bench.harness.common import interleaved_times, load_built, median
from bench.harness.flops import beam_flops, executed_mfu, score_flops

SAMPLES_PER_REQUEST = 15
BEAM_W, BEAM_S, BEAM_K = 100, 4, 10
PARITY_W, PARITY_K = 8, 4
PARITY_PROMPTS = 8  # beam parity's prompts: the bf16 bound is a max over them, on both sides (2 made it a coin toss)


@dataclass(frozen=True)
class Settings:
    """What one suite run does: device, sizes, loads and compile bounds."""

    device: str
    dtype: torch.dtype
    layers: int | None
    sample_tokens: tuple[int, int]
    score_requests: int
    batch_requests: tuple[int, ...]
    beam_prompts: tuple[int, int]
    beam_batches: tuple[int, ...]
    e2e_seconds: float
    score_rate: float  # the seed system's rates: the targets' offered loads
    beam_rate: float
    load_multipliers: tuple[float, ...]  # offered loads swept as multiples of the node's measured capacity
    # (the node alone at 1-2 requests per call: the gateway's larger batches serve more, hence up to 4x)
    slo_ms: float  # an answer counts towards goodput within this latency (also each request's deadline)
    calibration_batches: int
    repeats: int
    fp8_budget: float
    bounds: dict
    hf_micro_batches: tuple[int, ...] = (1, 4, 8)


def labels(vocab: int) -> list[int]:
    return [9454 % vocab, 2152 % vocab]  # "yes"/"no" in Qwen's vocabulary


def random_samples(count: int, low: int, high: int, vocab: int, generator: torch.Generator) -> list[torch.Tensor]:
    lens = torch.randint(low, high + 1, (count,), generator=generator).tolist()
    return [torch.randint(0, vocab, (n,), generator=generator) for n in lens]


def score_requests(s: Settings, vocab: int, count: int, seed: int = 0) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [random_samples(SAMPLES_PER_REQUEST, *s.sample_tokens, vocab, g) for _ in range(count)]


def timed(fn, s: Settings, repeats: int) -> float:
    """Median wall seconds of fn() after one warm-up call (device synchronised)."""
    sync = torch.cuda.synchronize if s.device == "cuda" else (lambda: None)
    fn(), sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(), sync()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def timed_alternately(fns: list, s: Settings, repeats: int) -> list[float]:
    """Median wall seconds of each of fns, called in turn (common.interleaved_times: at least 3 rounds, after one
    warm-up call each, the device synchronised after each call), so that a change in the machine's load falls
    on every side alike."""
    sync = torch.cuda.synchronize if s.device == "cuda" else (lambda: None)
    times = interleaved_times({i: (lambda fn=fn: (fn(), sync())) for i, fn in enumerate(fns)}, max(3, repeats))
    return [median(times[i]) for i in range(len(fns))]


def hf_last_logits(hf, samples: list[torch.Tensor], device: str, micro_batch: int | None = None) -> torch.Tensor:
    """transformers careful (micro_batch None) or at its best (length-sorted micro-batches) -> [B, V] on the CPU."""
    samples = [x.to(device) for x in samples]
    if micro_batch is None:
        return hf_side.careful(hf, samples, 0).cpu()
    return hf_side.best(hf, samples, 0, micro_batch).cpu()


def hf_beam(hf, prompts: list[torch.Tensor], device: str, width: int, k: int):
    """generate(num_beams=W) on a left-padded batch -> tokens [R, k, S], scores [R, k] on the CPU."""
    tokens, scores = hf_side.beams(hf, [p.to(device) for p in prompts], 0, width, BEAM_S, k)
    return tokens.cpu(), scores.cpu()


def until_eos(tokens: torch.Tensor, eos) -> torch.Tensor:
    """A beam's new tokens [S] up to and including its first EOS (generate() pads past it): what it scored."""
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    stops = [i for i, t in enumerate(tokens.tolist()) if t in eos_ids]
    return tokens[:stops[0] + 1] if stops else tokens


def parity(nodes, hf, hf32, spec, s: Settings) -> dict:
    """Label logits of one 15-sample request, and the W=8 best beam of PARITY_PROMPTS prompts (its score against
    transformers' float32 score of the same sequence, and that sequence no worse than float32 beam search's best), each
    against transformers in float32 on the same weights and bounded by transformers' own error in the suite's dtype
    (bench/harness/parity.py; for beams, its error on the same sequences: its generate()'s best and our best, each
    rescored in float32); "ok" false, on either, fails the suite."""
    request = score_requests(s, spec.vocab_size, 1, seed=7)[0]
    lab = torch.tensor(labels(spec.vocab_size))
    ours = nodes.score(torch.cat(request), torch.tensor([len(x) for x in request]), lab, 0).label_logits
    ref = hf_last_logits(hf, request, s.device)[:, lab]
    check = checks.bf16_check("score_label_logits_vs_fp32", ours, ref, hf_last_logits(hf32, request, s.device)[:, lab])
    result = {"ok": check["ok"], "score": check, "score_max_abs_diff_vs_hf_same_dtype": float((ours - ref).abs().max()),
              "score_label_argmax_agree": float((ours.argmax(-1) == ref.argmax(-1)).float().mean())}
    if nodes.beam is None:
        return {**result, "beam": "no beam node"}
    g = torch.Generator().manual_seed(8)
    prompts = random_samples(PARITY_PROMPTS, *s.beam_prompts, spec.vocab_size, g)
    per_call = nodes.manifest.bounds.max_beam_requests_per_batch
    outs = [nodes.beam(torch.cat(chunk), torch.tensor([len(p) for p in chunk]), PARITY_W, BEAM_S, PARITY_K)
            for chunk in (prompts[i:i + per_call] for i in range(0, len(prompts), per_call))]
    scores = torch.cat([o.scores[:, 0] for o in outs])  # [R] each prompt's best
    best = [o.sequences[i, 0, :int(o.lengths[i, 0])] for o in outs for i in range(o.scores.shape[0])]
    hf_side_beams = [hf_beam(hf, [p], s.device, PARITY_W, PARITY_K) for p in prompts]  # one prompt per call: no padding
    ref_beams = [hf_beam(hf32, [p], s.device, PARITY_W, PARITY_K) for p in prompts]
    rescored = torch.tensor([hf_side.rescore(hf32, p, seq) for p, seq in zip(prompts, best)])
    hf_best = [until_eos(seqs[0, 0], hf.generation_config.eos_token_id) for seqs, _ in hf_side_beams]
    hf_same = ([float(hf_scores[0, 0]) for _, hf_scores in hf_side_beams]
               + [hf_side.rescore(hf, p, seq) for p, seq in zip(prompts, best)])  # transformers' bf16 scores of ...
    fp32_same = [hf_side.rescore(hf32, p, seq) for p, seq in zip(prompts, hf_best)] + rescored.tolist()  # ... these
    beam = checks.bf16_beams_check("beam_best_vs_fp32", scores, rescored,
                                   torch.stack([ref_scores[0, 0] for _, ref_scores in ref_beams]),
                                   torch.tensor(hf_same), torch.tensor(fp32_same))
    top1 = [seq.tolist() == seqs[0, 0, :len(seq)].tolist() for seq, (seqs, _) in zip(best, hf_side_beams)]
    score_diffs = [abs(float(scores[i]) - float(hf_scores[0, 0])) for i, (_, hf_scores) in enumerate(hf_side_beams)]
    return {**result, "ok": check["ok"] and beam["ok"], "beam": beam, "beam_top1_same_as_hf": sum(top1) / len(top1),
            "beam_top1_score_max_diff": max(score_diffs), "beam_width": PARITY_W, "beam_prompts": len(prompts),
            "note": f"{str(s.dtype)} on both sides; beam search prunes, so another best beam than float32's is no "
                    "error while float32 scores it no worse (bench/harness/parity.py: top_beam_check)"}


def mfu_fields(flops: float, seconds: float, peak: dict) -> dict:
    """Executed MFU against the measured peak (refused above 1) and against the datasheet figure."""
    sheet = peak["datasheet_bf16_flops"]
    return {"executed_gflops": flops / seconds / 1e9,
            "executed_mfu": executed_mfu(flops, seconds, peak["measured_matmul_flops"]),
            "executed_mfu_datasheet": flops / seconds / sheet if sheet else None}


def score_bench(nodes, hf, spec, s: Settings, peak: dict) -> dict:
    """The scoring node on batches of 1..R requests of 15 samples; transformers careful and at its best."""
    requests = score_requests(s, spec.vocab_size, s.score_requests)
    lab = torch.tensor(labels(spec.vocab_size))
    flops = sum(score_flops(spec, [len(x) for x in r]) for r in requests)
    tokens = sum(len(x) for r in requests for x in r)
    by_batch = {}
    for per_call in s.batch_requests:
        groups = [sum(requests[i:i + per_call], []) for i in range(0, len(requests), per_call)]

        def run(groups=groups):
            for samples in groups:
                nodes.score(torch.cat(samples), torch.tensor([len(x) for x in samples]), lab, 0)

        seconds = timed(run, s, s.repeats)
        by_batch[per_call] = {"ms_per_request": seconds / len(requests) * 1e3, "requests_per_s": len(requests) / seconds,
                              "tokens_per_s": tokens / seconds, **mfu_fields(flops, seconds, peak)}
    hf_runs = {None: "careful"} | {m: f"best_micro_batch_{m}" for m in s.hf_micro_batches}
    hf_ms = {name: timed(lambda m=m: [hf_last_logits(hf, r, s.device, m) for r in requests], s,
                         max(1, s.repeats // 2)) / len(requests) * 1e3 for m, name in hf_runs.items()}
    best_hf = min(hf_ms, key=hf_ms.get)  # careful is one of transformers' candidates too
    best = max(by_batch.values(), key=lambda b: b["requests_per_s"])
    ours_ms = 1e3 / best["requests_per_s"]
    return {"requests": len(requests), "samples_per_request": SAMPLES_PER_REQUEST, "sample_tokens": list(s.sample_tokens),
            "mean_tokens_per_request": tokens / len(requests), "by_requests_per_call": by_batch,
            "capacity_requests_per_s": best["requests_per_s"], "hf_ms_per_request": hf_ms,
            "speedup_vs_hf_careful": hf_ms["careful"] / ours_ms, "speedup_vs_hf_best": hf_ms[best_hf] / ours_ms,
            "hf_best": best_hf, "executed_mfu": best["executed_mfu"], "executed_mfu_datasheet": best["executed_mfu_datasheet"],
            "batching": "ours: the best requests-per-call above; transformers: one request per call"}


def beam_bench(nodes, hf, spec, s: Settings, peak: dict) -> dict:
    """The beam node at W=100, S=4 (k=10) on short prompts, R requests per call; generate() with 1 and
    with the largest R prompts per call."""
    if nodes.beam is None:
        return {"error": "no beam node"}
    g = torch.Generator().manual_seed(3)
    count = max(s.beam_batches) * 2
    prompts = random_samples(count, *s.beam_prompts, spec.vocab_size, g)
    by_batch = {}
    for per_call in s.beam_batches:
        groups = [prompts[i:i + per_call] for i in range(0, count, per_call)]

        def run(groups=groups):
            for group in groups:
                nodes.beam(torch.cat(group), torch.tensor([len(p) for p in group]), BEAM_W, BEAM_S, BEAM_K)

        seconds = timed(run, s, s.repeats)
        flops = sum(beam_flops(spec, [len(p) for p in group], BEAM_W, BEAM_S) for group in groups)
        by_batch[per_call] = {"ms_per_request": seconds / count * 1e3, "requests_per_s": count / seconds,
                              **mfu_fields(flops, seconds, peak)}
    hf_single_s = timed(lambda: hf_beam(hf, prompts[:1], s.device, BEAM_W, BEAM_K), s, 1)
    wide = max(s.beam_batches)
    hf_batched_s = timed(lambda: hf_beam(hf, prompts[:wide], s.device, BEAM_W, BEAM_K), s, 1)
    hf_rate = max(1 / hf_single_s, wide / hf_batched_s)
    best = max(by_batch.values(), key=lambda b: b["requests_per_s"])
    return {"beam_width": BEAM_W, "steps": BEAM_S, "returned": BEAM_K, "prompt_tokens": list(s.beam_prompts),
            "by_requests_per_call": by_batch, "capacity_requests_per_s": best["requests_per_s"],
            "hf_single_ms": hf_single_s * 1e3, f"hf_batch_{wide}_ms": hf_batched_s * 1e3,
            "speedup_vs_hf_single": hf_single_s * 1e3 / by_batch[1]["ms_per_request"],
            "speedup_vs_hf_batched": best["requests_per_s"] / hf_rate, "executed_mfu": best["executed_mfu"],
            "batching": f"single: 1 request per call on both sides; batched: each side's best of 1..{wide}"}


def fp8_report(checkpoint, spec, s: Settings) -> dict:
    """Selective FP8 on the eager scoring module: ranking, choice under a 0.01 budget, eager timing."""
    from compile.checkpoint import load_checkpoint
    from compile.fp8 import Fp8Budget, apply_fp8, label_probs, random_calibration, select_fp8
    from compile.model import build_model
    from compile.score.module import ScoreModule

    loaded = load_checkpoint(checkpoint, str(s.dtype).removeprefix("torch."))
    module = ScoreModule(build_model(loaded.spec, loaded.state_dict, s.dtype), 5).to(s.device).eval()
    batches = random_calibration(spec.vocab_size, s.calibration_batches, SAMPLES_PER_REQUEST, s.sample_tokens,
                                 labels(spec.vocab_size), 8, s.device)
    start = time.perf_counter()
    plan = select_fp8(module, batches, Fp8Budget(max_prob_change=0.01))
    select_s = time.perf_counter() - start
    other_budgets = {}
    for budget in (0.05, 0.2):  # how the choice grows with the budget (the ranking is reused)
        wider = select_fp8(module, batches, Fp8Budget(max_prob_change=budget), ranked=plan.ranked)
        other_budgets[budget] = {"chosen": len(wider.chosen), "max_change": wider.max_change, "mean_change": wider.mean_change}
        plan = wider if not plan.chosen else plan  # time the first budget that chose anything
    fp8_copy = copy.deepcopy(module)  # the reference module stays as it is, for timing against
    apply_fp8(fp8_copy.model, plan)
    bf16_s = timed(lambda: label_probs(module, batches), s, s.repeats)
    fp8_s = timed(lambda: label_probs(fp8_copy, batches), s, s.repeats)
    ranked = [(r.name, round(r.max_change, 6), round(r.mean_change, 7)) for r in plan.ranked]
    return {"mode": plan.mode, "candidates": len(plan.ranked), "chosen": len(plan.chosen), "budget": plan.budget,
            "max_label_prob_change": plan.max_change, "mean_label_prob_change": plan.mean_change,
            "other_budgets": other_budgets, "calibration_batches": len(batches), "selection_s": select_s, "least_sensitive": ranked[:5],
            "most_sensitive": ranked[-3:], "chosen_layers": plan.chosen,
            "eager_ms_per_batch_ref": bf16_s / len(batches) * 1e3, "eager_ms_per_batch_fp8": fp8_s / len(batches) * 1e3}


def fp8_node_bench(nodes, spec, s: Settings, built) -> dict:
    """The scoring node compiled with `[model] fp8` against the plain node: speed, label-probability change."""
    config, artifacts, compile_s = built
    fp8 = load_built(artifacts, config)
    requests = score_requests(s, spec.vocab_size, s.score_requests, seed=21)
    lab = torch.tensor(labels(spec.vocab_size))
    per_call = max(s.batch_requests)
    groups = [sum(requests[i:i + per_call], []) for i in range(0, len(requests), per_call)]

    def call(node, samples):
        return node(torch.cat(samples), torch.tensor([len(x) for x in samples]), lab, 0).label_probs

    facts = fp8.manifest.fp8
    found = {"budget": s.fp8_budget, "layers": len(facts["layers"]), "candidates": facts["candidates"],
             "calibration_max_change": facts["max_label_prob_change"], "mode": facts["mode"], "compile_s": compile_s}
    if not facts["layers"]:  # the package is the plain node: a time against it would measure noise
        return found | {"speedup": None, "measured_nothing": f"the build chose no FP8 layer of {facts['candidates']} "
                                                              f"within the budget {s.fp8_budget}"}
    diffs = torch.cat([(call(fp8.score, g) - call(nodes.score, g)).abs().flatten() for g in groups])
    ref_s, fp8_s = timed_alternately([lambda: [call(nodes.score, g) for g in groups],
                                      lambda: [call(fp8.score, g) for g in groups]], s, s.repeats)
    return found | {"held_out_max_label_prob_change": float(diffs.max()),
                    "held_out_mean_label_prob_change": float(diffs.mean()),
                    "ms_per_request_ref": ref_s / len(requests) * 1e3, "ms_per_request_fp8": fp8_s / len(requests) * 1e3,
                    "speedup": ref_s / fp8_s, "timed": f"the two nodes alternately, median of {max(3, s.repeats)} each"}


def score_bodies(s: Settings, vocab: int, count: int, seed: int) -> list[dict]:
    """Scoring requests whose deadline is the SLO (the gateway drops what cannot make it)."""
    return [{"samples": [{"input_ids": x.tolist()} for x in r], "label_token_ids": labels(vocab), "output": "probs",
             "deadline_ms": int(s.slo_ms)} for r in score_requests(s, vocab, count, seed=seed)]


def beam_bodies(s: Settings, vocab: int, count: int, seed: int) -> list[dict]:
    """Beam requests whose deadline is the SLO."""
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": p.tolist(), "beam_width": BEAM_W, "max_new_tokens": BEAM_S, "num_return_sequences": BEAM_K,
             "deadline_ms": int(s.slo_ms)} for p in random_samples(count, *s.beam_prompts, vocab, g)]
