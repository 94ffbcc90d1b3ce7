"""Selective FP8 (compile/fp8.py) on the CPU: the layer, the ranking, the budget, the swap.

torch 2.13 runs torch._scaled_mm for float8_e4m3fn on the CPU, so the real operator is checked
against the quantise-dequantise simulation and against the float linear it replaces.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from compile.fp8 import (FP8, Fp8Budget, Fp8Linear, apply_fp8, candidate_linears, label_probs, random_calibration,
                         scaled_mm_available, select_fp8)


@pytest.fixture(scope="module")
def score_module(demo_checkpoint):
    from compile.checkpoint import load_checkpoint
    from compile.model import build_model
    from compile.score.module import ScoreModule

    checkpoint = load_checkpoint(demo_checkpoint, "float32")
    return ScoreModule(build_model(checkpoint.spec, checkpoint.state_dict, torch.float32), 5).eval()


@pytest.fixture(scope="module")
def batches(score_module):
    return random_calibration(score_module.model.spec.vocab_size, 3, 5, (3, 24), [5, 9, 11], 8, seed=1)


def test_scaled_mm_runs_on_this_cpu():
    assert scaled_mm_available("cpu"), "torch._scaled_mm(float8_e4m3fn) no longer runs on the CPU"


@pytest.mark.parametrize("bias", [False, True])
def test_fp8_linear_matches_its_simulation_and_the_float_layer(bias):
    torch.manual_seed(0)
    linear = nn.Linear(64, 48, bias=bias)
    x = torch.randn(7, 3, 64)
    absmax = float(x.abs().amax())
    real, simulated = Fp8Linear(linear, absmax, simulate=False), Fp8Linear(linear, absmax, simulate=True)
    assert real.weight_fp8.dtype == FP8 and real.weight_fp8.shape == (48, 64)
    y_real, y_sim, y_ref = real(x), simulated(x), linear(x)
    assert y_real.shape == y_ref.shape == (7, 3, 48)
    torch.testing.assert_close(y_real, y_sim, rtol=1e-4, atol=1e-4)
    relative = (y_real - y_ref).norm() / y_ref.norm()
    assert 0 < relative < 0.08  # e4m3 keeps 3 mantissa bits: a few per cent, never exact


def test_ranking_covers_every_candidate_and_the_budget_holds(score_module, batches):
    plan = select_fp8(score_module, batches, Fp8Budget(max_prob_change=0.02))
    names = set(candidate_linears(score_module.model))
    assert {loss.name for loss in plan.ranked} == names
    assert f"layers.{len(score_module.model.layers) - 1}.attn.qkv" not in names
    keys = [(loss.max_change, loss.mean_change) for loss in plan.ranked]
    assert keys == sorted(keys)
    assert plan.max_change <= 0.02 and plan.mode.startswith("torch._scaled_mm")
    assert all(loss.max_change > 0 for loss in plan.ranked)  # FP8 is measurably not exact


def test_budget_extremes(score_module, batches):
    nothing = select_fp8(score_module, batches, Fp8Budget(max_prob_change=0.0))
    assert nothing.chosen == [] and nothing.max_change == 0.0
    everything = select_fp8(score_module, batches, Fp8Budget(max_prob_change=1.0))
    assert sorted(everything.chosen) == sorted(candidate_linears(score_module.model))
    capped = select_fp8(score_module, batches, Fp8Budget(max_prob_change=1.0, max_layers=2))
    assert capped.chosen == [loss.name for loss in capped.ranked[:2]]


def test_apply_reproduces_the_measured_change_and_simulation_agrees(score_module, batches):
    import copy

    plan = select_fp8(score_module, batches, Fp8Budget(max_prob_change=0.05))
    simulated = select_fp8(score_module, batches, Fp8Budget(max_prob_change=0.05), simulate=True)
    assert simulated.mode.startswith("simulated") and simulated.chosen == plan.chosen
    reference = label_probs(score_module, batches)
    fp8_module = copy.deepcopy(score_module)
    apply_fp8(fp8_module.model, plan)
    assert sum(isinstance(m, Fp8Linear) for m in fp8_module.modules()) == len(plan.chosen)
    probs = label_probs(fp8_module, batches)
    worst = max(float((p - r)[:, b[4]].abs().max()) for p, r, b in zip(probs, reference, batches))
    assert worst == pytest.approx(plan.max_change, abs=1e-6)
    with pytest.raises(ValueError, match="cannot run in FP8"):
        apply_fp8(fp8_module.model, type(plan)(["lm_head"], {}, [], 0, 0, ""))


def test_model_fp8_on_a_cpu_build_is_refused_pointing_to_int8():
    """A CPU has no float8 GEMM (the compiled FP8 node is checked on CUDA by bench/gpu_suite.py's fp8_node stage)."""
    from shared.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match=r"model\.fp8 = true is for GPU builds.*quantize\.int8 = true"):
        parse_config({"model": {"fp8": True, "device": "cpu"}})
    assert parse_config({"model": {"fp8": True, "device": "cuda"}, "worker": {"devices": ["cuda:0"]}}).model.fp8
