"""bench/beam_node.py's other precisions (--bf16, --int8): named in the result file, held to the quantized bound on
their best candidate, reported against our float32 node and CTranslate2 with the candidates they change. And the int8
sanity bound of bench/harness/parity.py, one for every quantized contender (bench/shared_prefix.py,
bench/score_node.py)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from bench import beam_node, shared_prefix
from bench.harness import parity


def parsed(monkeypatch, *argv: str):
    monkeypatch.setattr(sys, "argv", ["beam_node.py", *argv])
    return beam_node.parse_args()


def test_the_result_file_names_each_precision_added(monkeypatch):
    names = {(): "", ("--bf16",): "-bf16", ("--int8", "--int8-base", "bf16"): "-int8",
             ("--bf16", "--int8", "--int8-base", "fp32", "--int8-budget", "1"): "-bf16-int8-fp32-1nats"}
    for argv, name in names.items():
        assert beam_node.precisions_name(parsed(monkeypatch, *argv)) == name


def output(name: str, prompts: list[int], candidates: list[list[list[int]]], scores: list[list[float]]) -> dict:
    """A contender's output for `prompts`: candidates [R][k][S] token ids, scores [R][k]."""
    return {"name": name, "prompts": prompts, "value": (torch.tensor(candidates), torch.tensor(scores), None)}


FP32 = [output("ours", [0, 1], [[[1, 2], [3, 4]], [[5, 6], [7, 8]]], [[-1.0, -2.0], [-1.5, -2.5]])]


def test_changes_count_candidates_missing_from_the_float32_node_and_the_best_score_gap():
    bf16 = output("ours_bf16", [0, 1], [[[3, 4], [1, 2]], [[5, 6], [9, 9]]], [[-1.25, -1.5], [-1.5, -3.0]])
    assert beam_node.changes(FP32 + [bf16], "ours_bf16") == {"candidates_changed": 1, "candidates": 4,
                                                            "best_score_max_abs_diff": 0.25}
    batched = output("ours_bf16", [1], [[[7, 8], [5, 6]]], [[-1.0, -1.5]])  # a batch of prompt 1 alone
    assert beam_node.changes(FP32 + [batched], "ours_bf16")["candidates_changed"] == 0


def test_other_precisions_are_held_to_the_quantized_bound_on_their_best_candidate():
    hf = output("hf", [0], [[[1, 2], [3, 4]]], [[-1.0, -2.0]])
    changed = output("ours_int8", [0], [[[9, 9], [9, 9]]], [[-1.0, -1.0]]) | {"rescored": torch.tensor([-9.0])}
    changed["value"] = (*changed["value"][:2], torch.tensor([[2, 2]]))
    found = beam_node.checks(FP32 + [changed, hf])
    assert [c["check"] for c in found] == ["ours[batch 2] prompt 0 vs hf", "ours_int8[batch 1] prompt 0 best vs hf"]
    assert not found[1]["ok"] and found[1]["bound"] == 1.0  # float32 scores its beam 8 nats worse than its own best
    assert found[1]["score_error_vs_fp32_rescored"] == 8.0
    other = output("ours_bf16", [0], [[[5, 5], [1, 2]]], [[-0.9, -1.0]]) | {"rescored": torch.tensor([-0.95])}
    other["value"] = (*other["value"][:2], torch.tensor([[2, 2]]))  # another beam, better than float32's best
    assert parity.all_ok(beam_node.checks(FP32 + [other, hf]))


def test_a_precision_is_reported_against_our_float32_and_bfloat16_nodes_and_ctranslate2():
    sides = {"ours": {"single_ms": 200.0, "best_requests_per_s": 10.0},
             "ct2": {"single_ms": 1000.0, "best_requests_per_s": 2.0},
             "ours_bf16": {"single_ms": 100.0, "best_requests_per_s": 16.0},
             "ours_int8": {"single_ms": 80.0, "best_requests_per_s": 20.0}}
    changed = {"candidates_changed": 1, "candidates": 8, "best_score_max_abs_diff": 0.1}
    assert beam_node.variant_summary(sides, "ours_bf16", changed) == {
        "speedup_vs_fp32_single": 2.0, "speedup_vs_fp32_batched": 1.6,
        "speedup_vs_ct2_single": 10.0, "speedup_vs_ct2_batched": 8.0, **changed}
    int8 = beam_node.variant_summary(sides, "ours_int8", changed)
    assert (int8["speedup_vs_bf16_single"], int8["speedup_vs_bf16_batched"]) == (1.25, 1.25)
    del sides["ct2"], sides["ours_bf16"]  # --no-ct2, no --bf16
    int8 = beam_node.variant_summary(sides, "ours_int8", changed)
    assert [int8[f"speedup_vs_{peer}_{how}"] for peer in ("bf16", "ct2") for how in ("single", "batched")] == [None] * 4


def test_ours_in_int8_is_held_to_the_one_quantized_bound_whatever_its_gate():
    reference = torch.zeros(2, 100)  # uniform: every token's log-prob is -log(100)
    logprob = float(torch.log_softmax(reference, -1)[0, 0])
    ids = torch.zeros(2, dtype=torch.int64)
    assert parity.quantized_check("ours_int8", ids, torch.full((2,), logprob - 0.5), reference)["ok"]
    # a build gated at 2 nats (--int8-budget 1) was held to 2 here, CTranslate2's int8 to 1: now both to 1
    assert not parity.quantized_check("ours_int8", ids, torch.full((2,), logprob - 1.5), reference)["ok"]
    assert not hasattr(parity, "quantized_bound")


def scoring(label_logits: torch.Tensor, top1_id: int, top1_logprob: float) -> SimpleNamespace:
    samples = label_logits.shape[0]
    return SimpleNamespace(label_logits=label_logits, topk_ids=torch.full((samples, 1), top1_id),
                           topk_logprobs=torch.full((samples, 1), top1_logprob))


@pytest.mark.parametrize("drift, bound, ok", [(1.5, 2.0, True), (1.5, parity.QUANTIZED_ABS, False),
                                              (2.5, 2.0, False)])
def test_shared_prefix_int8_checks_hold_both_sides_to_the_bound_given(drift, bound, ok):
    reference = torch.zeros(3, 10_000)  # uniform over a vocabulary holding the label ids
    reference_logprob = float(torch.log_softmax(reference, -1)[0, 0])
    labels = torch.zeros(3, len(shared_prefix.LABELS))
    outputs = [{"shared": scoring(labels + drift, 0, reference_logprob), "unshared": scoring(labels, 0,
                reference_logprob - drift), "hf_careful": reference}]
    found = shared_prefix.checks_for(outputs, "int8", [reference], bound)
    assert [c["ok"] for c in found] == [ok, True, ok]
