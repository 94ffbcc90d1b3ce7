"""bench/gpu_suite.py fails when it should: on any crashed stage, and on a top beam off float32's."""

import pytest
import torch

from bench.gpu_suite import STAGES, failures, run_stages
from bench.parity import bf16_beams_check


def crashed(stage: str) -> dict:
    """One model's entry as the stage loop records a stage that raised (the shape of
    gpu_suite_cpu_smoke.json's fp8_node before FP8 compiled on a CPU)."""
    return {"parity": {"ok": True}, stage: {"error": "ConfigError: model.fp8 = true is for GPU builds", "trace": "..."}}


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_recorded_as_crashed_fails_the_suite_naming_it(stage):
    found = failures({"models": {"qwen3-0.6b": crashed(stage)}})
    assert len(found) == 1 and f"stage {stage} crashed (ConfigError: model.fp8" in found[0]


def test_a_stage_forced_to_raise_is_recorded_the_next_stage_still_runs_and_the_suite_fails():
    def boom():
        raise RuntimeError("forced: the fp8 node did not compile")

    entry, ran = {}, []
    steps = [("parity", lambda: {"ok": True}), ("fp8_node", boom), ("e2e", lambda: {}), ("score", boom)]
    run_stages(entry, steps, skip={"score"}, after_each=ran.append)
    assert ran == ["parity", "fp8_node", "e2e"] and "score" not in entry
    assert entry["fp8_node"]["error"] == "RuntimeError: forced: the fp8 node did not compile"
    assert "boom" in entry["fp8_node"]["trace"]
    assert failures({"models": {"m": entry}}) == ["m: stage fp8_node crashed (RuntimeError: forced: the fp8 node "
                                                  "did not compile)"]


def test_stages_that_ran_clean_are_no_failure():
    entry = {"parity": {"ok": True, "score": {"ok": True}, "beam": {"ok": True}}, "no_host_sync": {"ok": True},
             "fp8_node": {"speedup": 1.2}, "e2e": {"/v1/score": {"points": [{"goodput_per_s": 9.0, "offered_per_s": 10.0}]}}}
    assert failures({"models": {"m": entry}}) == []


def test_a_top_beam_off_float32_fails_parity_naming_the_beam():
    entry = {"parity": {"ok": False, "score": {"ok": True}, "beam": {"ok": False}}}
    assert failures({"models": {"m": entry}}) == ["m: parity (beam)"]


def beams(rows: list[list[list[int]]], scores: list[list[float]]) -> tuple:
    """(tokens [R, k, S], scores [R, k], lens None) from nested lists."""
    return torch.tensor(rows), torch.tensor(scores), None


REFERENCE = beams([[[1, 2], [3, 4], [5, 6]]], [[-1.00, -1.01, -2.0]])  # float32: [3, 4] 0.01 behind the best
HF_BF16 = beams([[[1, 2], [3, 4], [5, 6]]], [[-1.04, -1.05, -2.1]])  # transformers' own bf16 error: 0.04 -> bound 0.08


def test_the_top_beam_may_differ_from_float32_only_at_a_near_tie_and_within_the_bf16_bound():
    same = bf16_beams_check("b", beams([[[1, 2], [3, 4]]], [[-1.05, -1.06]]), HF_BF16, REFERENCE)
    assert same["ok"] and same["bound"] == pytest.approx(0.08) and same["top1_score_error_vs_fp32"] == pytest.approx(0.05)
    tie = bf16_beams_check("b", beams([[[3, 4], [1, 2]]], [[-1.02, -1.03]]), HF_BF16, REFERENCE)
    assert tie["ok"] and tie["top1_differs_beyond_near_ties"] == 0


def test_a_top_beam_float32_ranked_far_down_or_a_score_past_the_bound_fails():
    wrong = bf16_beams_check("b", beams([[[5, 6], [1, 2]]], [[-1.0, -1.1]]), HF_BF16, REFERENCE)
    assert not wrong["ok"] and wrong["top1_differs_beyond_near_ties"] == 1
    off = bf16_beams_check("b", beams([[[1, 2], [3, 4]]], [[-1.2, -1.3]]), HF_BF16, REFERENCE)
    assert not off["ok"] and off["top1_score_error_vs_fp32"] == pytest.approx(0.2)
