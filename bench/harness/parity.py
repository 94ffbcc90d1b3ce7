"""Parity checks between our nodes and the baselines, each with its stated tolerance.

A benchmark records every check in its JSON and exits non-zero when one fails: a baseline that
computes something else is not a baseline.

Tolerances:
  FP32_ABS       float32 label logits / log-probs of two implementations of the same model agree
                 to 1e-3 (they differ only in summation order; measured ~1e-5 at 4-24 layers);
  bf16           as tests/compile/test_score_node.py: each bf16 side's error against the float32
                 reference is at most 1.5x transformers' own bf16 error plus 0.02;
  quantized      every contender below float precision that is not held to the bf16 bound: CTranslate2's
                 compute types other than float32 (int8, int8_float32, int8_bfloat16, int16, bfloat16: they
                 quantize or round the weights; on random weights int8 moves a top-1 log-probability by ~0.6
                 nat at 2 layers) and our int8 node, all alike (quantized_check: one bound, whatever a build's
                 own gate allowed): the top-1 log-probability within QUANTIZED_ABS nats of the float32
                 reference's log-probability of the same token, and a different top-1 token only where the
                 reference's top two are within that margin (a wrong model misses by several nats almost
                 everywhere). CTranslate2's converted model is checked strictly in float32;
  beams          a reduced-precision beam node's best candidate (top_beam_check): its score within the
                 precision's bound of float32's score of the same sequence, and that sequence no worse than
                 float32 beam search's best by more than the bound (bf16: bf16_beams_check, the bound from
                 transformers' own bf16 error on the same sequences; the int8 and bf16 variants of
                 bench/beam_node.py: QUANTIZED_ABS);
  near ties      a top-1 token may differ only where the reference's top-2 margin is within the
                 tolerance (rounding can then pick either).
"""

from __future__ import annotations

import torch

FP32_ABS = 1e-3
BF16_FACTOR, BF16_ABS = 1.5, 0.02
QUANTIZED_ABS = 1.0


def top2(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [B, V] -> top-1 id [B], its log-probability [B], margin to the second [B] (log-probs)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    values, ids = torch.topk(logprobs, 2, dim=-1)
    return ids[:, 0], values[:, 0], values[:, 0] - values[:, 1]


def top1_check(name: str, ids, logprobs, ref_logits: torch.Tensor, tolerance: float) -> dict:
    """A peer's top-1 ids [B] and log-probs [B] against reference logits [B, V]."""
    ref_ids, _, margin = top2(ref_logits)
    ref_lp = torch.log_softmax(ref_logits.float(), dim=-1)
    lp_of_theirs = ref_lp.gather(1, ids[:, None].long())[:, 0]  # the reference's log-prob of their token
    lp_diff = float((logprobs - lp_of_theirs).abs().max())
    disagree = ids != ref_ids
    unexplained = int((disagree & (margin > tolerance)).sum())
    return {"check": name, "top1_logprob_max_abs_diff": lp_diff, "top1_disagree": int(disagree.sum()),
            "top1_disagree_beyond_near_ties": unexplained, "tolerance": tolerance,
            "ok": lp_diff <= tolerance and unexplained == 0}


def quantized_check(name: str, ids, logprobs, ref_logits: torch.Tensor) -> dict:
    """A quantized contender's top-1 ids [B] and log-probs [B] against reference logits [B, V], within
    QUANTIZED_ABS: the one bound of every quantized contender, ours and the peers' (module docstring)."""
    return top1_check(name, ids, logprobs, ref_logits, QUANTIZED_ABS)


def close_check(name: str, got: torch.Tensor, expected: torch.Tensor, tolerance: float) -> dict:
    diff = float((got.float() - expected.float()).abs().max())
    return {"check": name, "max_abs_diff": diff, "tolerance": tolerance, "ok": diff <= tolerance}


def bf16_check(name: str, got: torch.Tensor, hf_bf16: torch.Tensor, reference: torch.Tensor) -> dict:
    """Label logits of a bf16 side against the float32 reference, bounded by transformers' own bf16 error."""
    hf_error = float((hf_bf16.float() - reference).abs().max())
    error = float((got.float() - reference).abs().max())
    bound = BF16_FACTOR * hf_error + BF16_ABS
    return {"check": name, "error_vs_fp32": error, "hf_bf16_error_vs_fp32": hf_error, "bound": bound,
            "ok": error <= bound}


def bf16_beams_check(name: str, ours: torch.Tensor, rescored: torch.Tensor, reference_best: torch.Tensor,
                     hf_bf16_same: torch.Tensor, fp32_same: torch.Tensor) -> dict:
    """The best beam of a bf16 side against generate() in float32 on the same weights (top_beam_check), bounded as
    bf16_check bounds label logits: BF16_FACTOR x transformers' own bf16 error + BF16_ABS, that error measured on the
    same sequences: hf_bf16_same [N] transformers' bf16 scores of N sequences (generate()'s own best, rescore() of
    the bf16 side's best), fp32_same [N] float32's scores of the same N sequences; the others as in top_beam_check.
    (Not bf16's best score against float32's best: where the two searches keep different beams that difference
    compares two sequences, and on the CPU smoke's Qwen2.5 shape it came out 0.023 where bf16's error on the very
    sequence our node chose was 0.025 and, over 20 prompts, up to 0.053.)"""
    hf_error = float((hf_bf16_same.float() - fp32_same.float()).abs().max())
    check = top_beam_check(name, ours, rescored, reference_best, BF16_FACTOR * hf_error + BF16_ABS)
    return {**check, "hf_bf16_same_sequence_error_vs_fp32": hf_error, "hf_bf16_sequences": len(hf_bf16_same)}


def top_beam_check(name: str, ours: torch.Tensor, rescored: torch.Tensor, reference_best: torch.Tensor,
                   bound: float) -> dict:
    """The best candidate of a lower-precision beam search, per prompt: its score `ours` [R], the float32 model's
    score of the same sequence `rescored` [R] (bench/hf_baselines.rescore) and float32 beam search's best score
    `reference_best` [R]. The score it reports is its sequence's within `bound`, and that sequence is no worse than
    float32's best by more than `bound`. (Not "the same sequence": beam search prunes, and a lower precision that
    prunes otherwise may find another beam, even a better one; measured on the CPU smoke run: bf16 found one
    0.18 nats per token above float32's best.)"""
    error = float((ours.float() - rescored.float()).abs().max())
    shortfall = float((reference_best.float() - rescored.float()).max())
    return {"check": name, "score_error_vs_fp32_rescored": error, "shortfall_vs_fp32_best": shortfall,
            "bound": bound, "ok": error <= bound and shortfall <= bound}


def beams_check(name: str, tokens, scores, lens, ref_tokens, ref_scores, tolerance: float) -> dict:
    """Beam candidates [R, k, S] / scores [R, k] (lens [R, k] tokens each, or None for all S) against
    a reference: same scores within tolerance at every rank; the same tokens, except that two
    candidates whose scores are within tolerance of each other may trade ranks."""
    score_diff = float((scores - ref_scores).abs().max())
    mismatched, reordered = 0, 0
    for r in range(tokens.shape[0]):
        for j in range(tokens.shape[1]):
            n = tokens.shape[2] if lens is None else int(lens[r, j])
            if tokens[r, j, :n].tolist() == ref_tokens[r, j, :n].tolist():
                continue
            reordered += 1
            tied = (ref_scores[r] - ref_scores[r, j]).abs() <= tolerance
            same_elsewhere = any(tokens[r, j, :n].tolist() == ref_tokens[r, i, :n].tolist()
                                 for i in torch.nonzero(tied).flatten().tolist())
            mismatched += not same_elsewhere
    return {"check": name, "score_max_abs_diff": score_diff, "candidates_not_at_same_rank": reordered,
            "candidates_differ_beyond_near_ties": mismatched, "tolerance": tolerance,
            "identical": reordered == 0 and score_diff <= 1e-4,
            "ok": mismatched == 0 and score_diff <= tolerance}


def all_ok(checks: list[dict]) -> bool:
    return all(c["ok"] for c in checks)
