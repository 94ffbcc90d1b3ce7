"""bench/score_node.py's OpenVINO accuracy in bf16 and int8 runs: reported beside the result (a peer's bf16 may be
less accurate than transformers' by more than the bound and is still the speed to beat), asserted where the base is
float32 (no bf16 error to allow there, so a miss means the comparison is broken)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from bench import score_node
from bench.harness import provenance

VOCAB = 10_000  # above both label ids


def outputs(hf_error: float, openvino_error: float) -> tuple[dict, torch.Tensor]:
    """(request 0's outputs, the float32 reference): every logit zero, the label logits off by the errors given."""
    reference = torch.zeros(2, VOCAB)
    off = lambda error: reference.index_add(1, score_node.LABELS, torch.full((2, 2), error))  # noqa: E731
    return {"hf_careful": off(hf_error), "openvino": off(openvino_error)}, reference


def test_a_bf16_openvino_outside_the_bound_is_reported_and_the_result_still_written():
    out, reference = outputs(0.1, 0.3)
    asserted, reported = score_node.openvino_accuracy(out, reference, torch.bfloat16)
    assert asserted == []
    assert reported["check"] == "openvino_label_logits_vs_fp32" and reported["within_bound"] is False
    assert "ok" not in reported
    assert reported["error_vs_fp32"] == pytest.approx(0.3) and reported["bound"] == pytest.approx(1.5 * 0.1 + 0.02)
    # the run's asserted checks (reference_checks) leave OpenVINO out, so its miss does not refuse the result
    out["ours"] = SimpleNamespace(label_logits=out["hf_careful"][:, score_node.LABELS])
    out["hf_best"] = out["hf_careful"]
    checks = score_node.reference_checks(out, reference, None, {})
    assert [c["check"] for c in checks] == ["ours_label_logits_vs_fp32", "hf_best_label_logits_vs_fp32"]
    assert provenance.failed_checks({"parity": checks + asserted, "openvino_accuracy": reported}) == []


def test_a_bf16_openvino_inside_the_bound_says_so():
    out, reference = outputs(0.1, 0.15)
    assert score_node.openvino_accuracy(out, reference, torch.bfloat16)[1]["within_bound"] is True


def test_on_a_float32_base_openvino_is_asserted_and_a_miss_refuses_the_result():
    out, reference = outputs(0.0, 0.3)
    asserted, reported = score_node.openvino_accuracy(out, reference, torch.float32)
    assert reported is None and [c["ok"] for c in asserted] == [False]
    assert provenance.failed_checks({"parity": asserted}) == asserted


def test_without_openvino_there_is_nothing_to_check():
    out, reference = outputs(0.1, 0.1)
    del out["openvino"]
    assert score_node.openvino_accuracy(out, reference, torch.bfloat16) == ([], None)


def test_an_int8_run_takes_openvinos_own_int8_and_holds_it_to_the_quantized_bound():
    """An int8 run's OpenVINO peer is its int8 (NNCF weights, at the base's hint), asserted like every quantized
    contender: its top-1 log-probability within parity.QUANTIZED_ABS of the float32 reference's."""
    from bench.harness.openvino_baseline import peer_precision

    assert peer_precision(torch.bfloat16, int8=True) == "int8-bf16" and peer_precision(torch.float32, True) == "int8-f32"
    assert peer_precision(torch.bfloat16, int8=False) == "bf16"
    reference = torch.zeros(2, VOCAB)
    for shift, ok in ((0.3, True), (1.5, False)):
        near = reference.clone()
        near[:, 7] = shift  # token 7 on top, its log-prob `shift`-ish above the reference's for that token
        asserted, reported = score_node.openvino_accuracy({"openvino": near, "hf_careful": reference}, reference,
                                                          torch.bfloat16, int8=True)
        assert reported is None and [c["check"] for c in asserted] == ["openvino_int8_top1_vs_fp32"]
        assert asserted[0]["ok"] is ok and asserted[0]["tolerance"] == 1.0
