"""The int8 gate cannot be switched off by accident: limits that disable it are refused naming the field, looser
ones and a calibration on random ids are warned about, a selection of no layer is refused, and the compiled int8
package's labels agree with the float package within the gate."""

import dataclasses

import pytest
import torch

from compile.checkpoint import load_checkpoint
from compile.model import build_model
from compile.quantize.build_step import int8_for_build
from compile.quantize.gate import GateLimits, QuantizationRefused, check, figures
from shared.config import ConfigError, QuantizeConfig, load_config, parse_config
from tests.builds import INT8_GATE, ROOT
from worker.runtime.loader import load_nodes

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.mark.parametrize("field, value, message", [
    ("max_label_logprob_drift", 1e9, r"quantize\.max_label_logprob_drift = 1e\+09 nats switches the int8 gate off: "
                                     r"at most 2 .*default 0\.25"),
    ("mean_label_logprob_drift", 3.0, r"quantize\.mean_label_logprob_drift = 3 nats switches .*at most 1 "),
    ("selection_max_drift", 10.0, r"quantize\.selection_max_drift = 10 nats switches .*at most 2 "),
    ("min_top1_agreement", 0.0, r"quantize\.min_top1_agreement = 0 switches the int8 gate off: at least 0\.5 .*"
                                r"default 0\.9"),
    ("min_rank_agreement", 0.3, r"quantize\.min_rank_agreement = 0\.3 switches .*at least 0\.5"),
])
def test_limits_that_switch_the_gate_off_are_refused_naming_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({"quantize": {"int8": True, field: value}})
    with pytest.raises(ConfigError, match=message):  # a section replaced in code is checked again
        parse_config({}).replace(quantize=QuantizeConfig(int8=True, **{field: value}))


def test_limits_looser_than_the_defaults_are_accepted_and_named():
    assert QuantizeConfig().looser_than_defaults() == []
    assert QuantizeConfig(max_label_logprob_drift=0.0, min_top1_agreement=1.0).looser_than_defaults() == []
    assert QuantizeConfig(**INT8_GATE).looser_than_defaults() == [
        "quantize.selection_max_drift = 0.5 is looser than the default 0.1",
        "quantize.max_label_logprob_drift = 1 is looser than the default 0.25",
        "quantize.mean_label_logprob_drift = 0.5 is looser than the default 0.05",
        "quantize.min_top1_agreement = 0.5 is looser than the default 0.9",
        "quantize.min_rank_agreement = 0.5 is looser than the default 0.95"]


def eager(checkpoint, **quantize):
    """configs/test.toml on `checkpoint` with [quantize] int8 and these fields, and its float32 model."""
    config = load_config(ROOT / "configs/test.toml")
    config = config.replace(model=dataclasses.replace(config.model, path=str(checkpoint)),
                            quantize=QuantizeConfig(int8=True, **quantize))
    loaded = load_checkpoint(checkpoint, "float32")
    return config, build_model(loaded.spec, loaded.state_dict, torch.float32).eval()


@needs_onednn
def test_a_selection_of_no_layer_is_refused_not_labelled_int8(demo_checkpoint):
    config, model = eager(demo_checkpoint, **(INT8_GATE | {"selection_max_drift": 0.0}))
    with pytest.raises(QuantizationRefused, match=r"no linear layer fits the int8 selection budget "
                                                  r"\(quantize\.selection_max_drift = 0 nats\).*quantize\.int8 = false"):
        int8_for_build(config, model)


@needs_onednn
def test_random_calibration_and_a_loose_gate_are_warned_at_build_and_recorded(demo_checkpoint):
    config, model = eager(demo_checkpoint, **INT8_GATE)
    said = []
    record = int8_for_build(config, model, said.append)
    warnings = [line for line in said if line.startswith("warning: ")]
    assert any("quantize.calibration is empty: the layers are chosen and gated on random token ids" in line
               for line in warnings)
    assert any("quantize.max_label_logprob_drift = 1 is looser than the default 0.25" in line for line in warnings)
    assert len(record["warnings"]) == len(warnings) == 6 and record["int8_layers"]


def scored(node, seed: int, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One request of random samples: label log-probs [B, N] and the top-1 next token [B]."""
    generator = torch.Generator().manual_seed(seed)
    samples = [torch.randint(0, node.vocab_size, (n,), generator=generator) for n in lengths]
    vocab = node.vocab_size
    labels = torch.tensor([vocab // 4, vocab // 2, 3 * vocab // 4])  # the labels the build calibrated with
    out = node(torch.cat(samples), torch.tensor(lengths), labels, top_k=1)
    return out.label_logprobs, out.topk_ids[:, 0]


@pytest.mark.slow
@needs_onednn
def test_the_compiled_int8_package_agrees_with_the_float_package_within_its_gate(int8_artifacts, demo_artifacts):
    """Requests the build never saw (seeds 100-105), each package as a worker runs it."""
    int8, plain = load_nodes(int8_artifacts), load_nodes(demo_artifacts)
    limits = int8.manifest.quantize["limits"]
    requests = [[7, 30, 64, 12, 50, 3, 21, 40]] * 6
    result = figures([scored(plain.score, 100 + i, r) for i, r in enumerate(requests)],
                     [scored(int8.score, 100 + i, r) for i, r in enumerate(requests)])
    assert result.samples == 48 and result.max_label_logprob_drift > 0  # int8 layers really ran
    check(result, GateLimits(limits["max_label_logprob_drift"], limits["mean_label_logprob_drift"],
                             limits["min_top1_agreement"], limits["min_rank_agreement"]))
