"""Selective FP8 (compile/fp8.py) on the CPU: the layer, the ranking, the budget, the swap, and a compiled package.

torch 2.13 runs torch._scaled_mm for float8_e4m3fn on the CPU, so the real operator is checked
against the quantise-dequantise simulation and against the float linear it replaces, and a package
built with `[model] fp8` is compiled here and checked against the eager model.
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


@pytest.mark.slow
def test_a_compiled_fp8_package_on_the_cpu_is_the_eager_fp8_model(demo_checkpoint):
    """`[model] fp8` built for the CPU (torch runs _scaled_mm there), its scoring package against the eager model
    with the same layers and scales, on requests the build never saw. Bound 1e-3 on label probabilities: only
    the compiled kernels' summation order and fused quantisation differ (measured 6e-5); the FP8 layers change
    the float model's probabilities by far more (measured 0.06), so a package that ran float would fail."""
    from compile.checkpoint import load_checkpoint
    from compile.fp8 import Fp8Plan, pack_batch
    from compile.model import build_model
    from worker.runtime.loader import load_nodes
    from compile.score.module import ScoreModule
    from tests.builds import build_artifacts

    artifacts = build_artifacts(demo_checkpoint, "demo-fp8", model={"fp8": True, "fp8_max_prob_change": 0.05})
    nodes = load_nodes(artifacts)
    node, facts = nodes.score, nodes.manifest.fp8
    assert facts["layers"] and facts["mode"] == "torch._scaled_mm on cpu" and facts["max_label_prob_change"] <= 0.05
    loaded = load_checkpoint(demo_checkpoint, "float32")
    plan = Fp8Plan(facts["layers"], facts["input_absmax"], [], 0, 0, "")
    fp8 = ScoreModule(apply_fp8(build_model(loaded.spec, loaded.state_dict, torch.float32), plan), 8).eval()
    plain = ScoreModule(build_model(loaded.spec, loaded.state_dict, torch.float32), 8).eval()
    vocab = node.vocab_size
    labels, lengths = [vocab // 4, vocab // 2, 3 * vocab // 4], [7, 30, 64, 12, 50, 3, 21, 40]
    to_eager, to_float = 0.0, 0.0
    for seed in range(100, 104):
        generator = torch.Generator().manual_seed(seed)
        samples = [torch.randint(0, vocab, (n,), generator=generator) for n in lengths]
        got = node(torch.cat(samples), torch.tensor(lengths), torch.tensor(labels), top_k=1).label_probs
        batch = [pack_batch(samples, labels, 8)]  # label slots past the three given are padding
        eager_fp8, eager_float = label_probs(fp8, batch)[0][:, :3], label_probs(plain, batch)[0][:, :3]
        to_eager = max(to_eager, float((got - eager_fp8).abs().max()))
        to_float = max(to_float, float((got - eager_float).abs().max()))
    assert to_eager <= 1e-3 < to_float, (to_eager, to_float)


def test_model_fp8_is_accepted_on_a_cpu_and_refused_beside_int8():
    """A CPU build may use FP8 (torch's _scaled_mm runs there: how the FP8 package is checked without a GPU);
    int8 and FP8 at once are refused."""
    from shared.config import ConfigError, parse_config

    assert parse_config({"model": {"fp8": True, "device": "cpu"}}).model.fp8
    assert parse_config({"model": {"fp8": True, "device": "cuda"}, "worker": {"devices": ["cuda:0"]}}).model.fp8
    with pytest.raises(ConfigError, match=r"quantize\.int8 and model\.fp8 are both true"):
        parse_config({"model": {"fp8": True, "device": "cpu"}, "quantize": {"int8": True}})
