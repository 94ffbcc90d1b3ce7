"""OpenVINO's own int8 (NNCF weight compression; bench/openvino_baseline.py), the int8 peer of an int8 scoring run,
on a tiny checkpoint: its weights really int8, its top-1 within the bound of every quantized contender. Needs the
bench extra (openvino, nncf); skipped, named, without it."""

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
