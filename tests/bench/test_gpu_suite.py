"""bench/gpu_suite.py fails when it should: on any crashed stage, and on a top beam off float32's."""

import pytest
import torch

from bench.gpu_suite import STAGES, failures, run_stages
from bench.harness.gpu_measure import Settings, timed_alternately
from bench.harness.parity import bf16_beams_check


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


def test_an_fp8_node_with_no_fp8_layer_fails_the_suite_instead_of_reporting_a_speedup():
    # the shape fp8_node_bench returns when the build chose none (the plain node timed against itself: the
    # CPU smoke once recorded a "speedup" of 1.57 that way)
    entry = {"parity": {"ok": True}, "fp8_node": {"layers": 0, "candidates": 4, "speedup": None,
                                                  "measured_nothing": "the build chose no FP8 layer of 4 within the budget 0.2"}}
    assert failures({"models": {"m": entry}}) == ["m: stage fp8_node measured nothing (the build chose no FP8 layer "
                                                  "of 4 within the budget 0.2)"]


def test_two_nodes_are_timed_in_turn_after_a_warm_up_each():
    calls = []
    settings = Settings(device="cpu", dtype=torch.bfloat16, layers=1, sample_tokens=(1, 2), score_requests=1,
                        batch_requests=(1,), beam_prompts=(1, 2), beam_batches=(1,), e2e_seconds=1.0, score_rate=1.0,
                        beam_rate=1.0, load_multipliers=(1.0,), slo_ms=1.0, calibration_batches=1, repeats=1,
                        fp8_budget=1.0, bounds={})
    medians = timed_alternately([lambda: calls.append("ref"), lambda: calls.append("fp8")], settings, 1)
    assert calls == ["ref", "fp8"] * 4  # a warm-up each, then at least three rounds, alternating
    assert len(medians) == 2 and all(m >= 0 for m in medians)


def test_a_top_beam_off_float32_fails_parity_naming_the_beam():
    entry = {"parity": {"ok": False, "score": {"ok": True}, "beam": {"ok": False}}}
    assert failures({"models": {"m": entry}}) == ["m: parity (beam)"]


def test_the_best_beam_is_held_to_float32s_score_of_its_sequence_and_its_best_within_the_bf16_bound():
    ref_best = torch.tensor([-1.00, -2.00])
    hf_same, fp32_same = torch.tensor([-1.04, -2.01]), torch.tensor([-1.00, -2.00])  # bf16's own error 0.04
    ours, rescored = torch.tensor([-1.05, -1.90]), torch.tensor([-1.02, -1.92])
    found = bf16_beams_check("b", ours, rescored, ref_best, hf_same, fp32_same)
    assert found["bound"] == pytest.approx(0.08) and found["ok"]  # prompt 1: another beam, better than float32's
    assert found["score_error_vs_fp32_rescored"] == pytest.approx(0.03)
    assert found["shortfall_vs_fp32_best"] == pytest.approx(0.02)
    assert found["hf_bf16_same_sequence_error_vs_fp32"] == pytest.approx(0.04) and found["hf_bf16_sequences"] == 2


def test_a_best_beam_scored_wrong_or_worse_than_float32s_by_more_than_the_bound_fails():
    ref_best, hf_same, fp32_same = torch.tensor([-1.0, -2.0]), torch.tensor([-1.04, -2.01]), torch.tensor([-1.0, -2.0])
    misscored = bf16_beams_check("b", torch.tensor([-1.0, -1.5]), ref_best, ref_best, hf_same, fp32_same)
    assert not misscored["ok"] and misscored["score_error_vs_fp32_rescored"] == pytest.approx(0.5)
    worse = bf16_beams_check("b", torch.tensor([-1.3, -2.0]), torch.tensor([-1.3, -2.0]), ref_best, hf_same, fp32_same)
    assert not worse["ok"] and worse["shortfall_vs_fp32_best"] == pytest.approx(0.3)


def test_the_bf16_bound_is_transformers_error_on_the_same_sequences_not_its_best_against_float32s_best():
    """transformers' bf16 search kept another beam than float32's, whose score happens to equal float32's best
    (difference 0), but bf16 misscores that sequence by 0.05 against float32's score of it: bf16's error is 0.05,
    so a node 0.08 off passes (<= 1.5 x 0.05 + 0.02) and one 0.10 off fails."""
    ref_best = torch.tensor([-3.00])
    hf_same = torch.tensor([-3.00])  # transformers bf16's score of its own best ...
    fp32_same = torch.tensor([-2.95])  # ... which float32 scores 0.05 higher
    close = bf16_beams_check("b", torch.tensor([-3.03]), torch.tensor([-2.95]), ref_best, hf_same, fp32_same)
    assert close["bound"] == pytest.approx(0.095) and close["ok"]
    off = bf16_beams_check("b", torch.tensor([-3.05]), torch.tensor([-2.95]), ref_best, hf_same, fp32_same)
    assert off["score_error_vs_fp32_rescored"] == pytest.approx(0.10) and not off["ok"]


def test_a_node_worse_than_bf16s_own_error_on_any_of_the_sequences_fails():
    """The bound is a max over every sequence transformers' bf16 scored; the node's error a max over its prompts."""
    ref_best = torch.tensor([-3.0, -3.0, -3.0])
    hf_same, fp32_same = torch.tensor([-3.01, -3.02, -3.03]), torch.tensor([-3.0, -3.0, -3.0])  # bf16's error: 0.03
    rescored = torch.tensor([-3.0, -3.0, -3.0])
    within = bf16_beams_check("b", torch.tensor([-3.01, -3.06, -2.99]), rescored, ref_best, hf_same, fp32_same)
    assert within["bound"] == pytest.approx(0.065) and within["ok"]
    beyond = bf16_beams_check("b", torch.tensor([-3.01, -3.07, -2.99]), rescored, ref_best, hf_same, fp32_same)
    assert not beyond["ok"]


@pytest.mark.parametrize("eos,expected", [(2, [5, 2]), ([7, 2], [5, 2]), (None, [5, 2, 0, 0]), (9, [5, 2, 0, 0])])
def test_a_beam_that_stopped_early_is_rescored_up_to_its_eos(eos, expected):
    from bench.harness.gpu_measure import until_eos

    assert until_eos(torch.tensor([5, 2, 0, 0]), eos).tolist() == expected


def test_rescoring_a_sequence_gives_the_score_generate_ranked_it_by(demo_checkpoint):
    """The float32 score the beam check compares with is generate()'s own: its best beam, rescored, scores the same."""
    from bench.harness import hf_baselines
    from tests.compile.reference import load_hf, random_batch

    hf = load_hf(demo_checkpoint)
    prompt = random_batch(1024, [9], seed=4)[0]
    tokens, scores = hf_baselines.beams(hf, [prompt], 0, 4, 3, 2)
    for j in range(2):
        assert hf_baselines.rescore(hf, prompt, tokens[0, j]) == pytest.approx(float(scores[0, j]), abs=1e-4)


def test_only_runs_the_named_stages_and_skip_skips_them():
    from bench.gpu_suite import skipped_stages

    assert skipped_stages("", "parity") == set(STAGES) - {"parity"}
    assert skipped_stages("fp8,e2e", "") == {"fp8", "e2e"}
    assert skipped_stages("", "") == set()


@pytest.mark.parametrize("skip,only,message", [
    ("", "parity,beam_parity", "unknown stage(s) beam_parity: the stages are parity, no_host_sync"),
    ("fp9", "", "unknown stage(s) fp9"),
    ("e2e", "parity", "--skip and --only together"),
])
def test_a_stage_name_that_is_no_stage_or_both_options_are_refused(skip, only, message):
    from bench.gpu_suite import skipped_stages

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        skipped_stages(skip, only)


def test_the_command_line_refuses_an_unknown_stage_naming_the_stages():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "bench/gpu_suite.py", "--cpu-smoke", "--only", "parityy"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "unknown stage(s) parityy: the stages are parity" in done.stderr
