"""OpenVINO's own int8 in both forms (bench/harness/openvino_baseline.py: NNCF weight compression, and NNCF's full
quantization, activations too), the int8 peer of an int8 scoring run, on a tiny checkpoint: each converts, really runs
in int8, keeps its top-1 within the bound of every quantized contender, and the peer is the faster form that passes.
Needs the bench extra (openvino, nncf); skipped, named, without it."""

import pytest
import torch

from bench.harness import openvino_baseline, parity
from tests.compile.reference import hf_last_token, load_hf, random_batch

openvino = pytest.importorskip("openvino", reason="the bench extra (openvino) is not installed")
pytest.importorskip("nncf", reason="the bench extra (nncf) is not installed")


def test_openvino_int8_compresses_the_weights_and_stays_within_the_quantized_bound(demo_checkpoint, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setattr(openvino_baseline, "CACHE", tmp_path)  # the converted IRs: this test's own
    model = openvino_baseline.OpenVinoModel(demo_checkpoint, threads=1)
    int8_weights = [op for op in model.int8_model().get_ops() if op.get_type_name() == "Constant"
                    and op.get_output_element_type(0) in (openvino.Type.i8, openvino.Type.u8)]
    assert len(int8_weights) >= 7 * 2  # every linear of both decoder layers (and the head) holds int8 weights
    samples = random_batch(1024, [7, 30, 64, 1], 11)
    reference, _ = hf_last_token(load_hf(demo_checkpoint), samples)
    float_logits = model.logits("f32", samples, 1)
    int8_logits = model.logits("int8-f32", samples, 1)
    assert (float_logits - reference).abs().max() <= 1e-3  # the conversion itself: float32 equals transformers
    assert (int8_logits - float_logits).abs().max() > 1e-4  # the int8 weights really ran
    logprobs = torch.log_softmax(int8_logits, -1)
    ids = logprobs.argmax(-1)
    check = parity.quantized_check("openvino_int8", ids, logprobs.gather(1, ids[:, None])[:, 0], reference)
    assert check["ok"], check


def test_openvino_full_quantization_converts_quantizes_activations_and_stays_within_the_quantized_bound(
        demo_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(openvino_baseline, "CACHE", tmp_path)
    model = openvino_baseline.OpenVinoModel(demo_checkpoint, threads=1)
    quantized = model.quantized_model()
    activations = [op for op in quantized.get_ops() if op.get_type_name() == "FakeQuantize"]
    assert len(activations) >= 2 * 4  # at least each decoder layer's q/k/v, o, up/gate and down inputs
    samples = random_batch(1024, [7, 30, 64, 1], 11)
    reference, _ = hf_last_token(load_hf(demo_checkpoint), samples)
    logits = model.logits("int8q-f32", samples, 1)
    assert (logits - model.logits("int8-f32", samples, 1)).abs().max() > 1e-4  # not the weight-only model
    logprobs = torch.log_softmax(logits, -1)
    ids = logprobs.argmax(-1)
    check = parity.quantized_check("openvino_int8q", ids, logprobs.gather(1, ids[:, None])[:, 0], reference)
    assert check["ok"], check


def test_the_int8_peer_is_the_faster_form_that_passes_the_bound_and_both_are_recorded(demo_checkpoint, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setattr(openvino_baseline, "CACHE", tmp_path)
    model = openvino_baseline.OpenVinoModel(demo_checkpoint, threads=1)
    samples = random_batch(1024, [7, 30, 64, 1], 11)
    reference, _ = hf_last_token(load_hf(demo_checkpoint), samples)
    chosen, report = openvino_baseline.fastest_int8(model, torch.float32, samples, reference)
    assert set(report) == {"int8-f32", "int8q-f32"} and all(r["check"]["ok"] for r in report.values())
    assert chosen == min(report, key=lambda p: report[p]["ms"])
    far = reference.clone()
    far[:, 0] += 50.0  # a reference no int8 form is within the bound of: none is chosen, both checks recorded
    chosen, report = openvino_baseline.fastest_int8(model, torch.float32, samples, far)
    assert chosen is None and set(report) == {"int8-f32", "int8q-f32"}
    assert not any(r["check"]["ok"] for r in report.values())


def test_an_int8_run_whose_openvino_int8_forms_miss_the_bound_compares_with_openvino_at_the_base_precision(
        demo_checkpoint, tmp_path, monkeypatch):
    from bench import score_node

    monkeypatch.setattr(openvino_baseline, "CACHE", tmp_path)
    model = openvino_baseline.OpenVinoModel(demo_checkpoint, threads=1)
    samples = random_batch(1024, [7, 30, 64, 1], 11)
    reference, _ = hf_last_token(load_hf(demo_checkpoint), samples)
    far = reference.clone()
    far[:, 0] += 50.0
    (precision, _), sweeps = score_node.pick_openvino_setting(model, torch.float32, samples, True, far)
    assert precision == "f32" and not openvino_baseline.is_int8(precision)
    assert set(score_node.openvino_refused({"openvino_micro_batch_ms": sweeps})) == {"int8-f32", "int8q-f32"}
    (precision, _), sweeps = score_node.pick_openvino_setting(model, torch.float32, samples, True, reference)
    assert openvino_baseline.is_int8(precision) and score_node.openvino_refused({"openvino_micro_batch_ms": sweeps}) == {}
