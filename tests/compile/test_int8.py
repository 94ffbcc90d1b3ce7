"""Selective int8 (compile/quantize/): the W8A8 layer, the gate, the calibration file, and builds whose packages
really run oneDNN's int8 GEMMs, or are refused by the gate."""

import json
import os
import subprocess
import sys
import zipfile

import pytest
import torch

from compile.quantize.build_step import read_calibration
from compile.quantize.gate import GateFigures, GateLimits, QuantizationRefused, check, figures
from compile.quantize.int8 import INT8_MAX, Int8Linear, activation_max
from tests.builds import CACHE, ROOT, build_int8

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
VNNI_ISAS = ("avx512_core_vnni", "avx512_core_amx", "avx10_1_512")
"""oneDNN ISA names of kernels with int8 dot products (AVX512-VNNI; AMX and AVX10.1 machines include it)."""


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 37, 300])
def test_an_int8_layer_is_close_to_its_float_layer_and_answers_in_its_dtype(dtype, rows):
    torch.manual_seed(rows)  # the layer's own initialisation too: the bound must not depend on the tests run before
    generator = torch.Generator().manual_seed(rows)
    layer = torch.nn.Linear(64, 96).to(dtype)
    x = torch.randn(rows, 64, generator=generator).to(dtype)
    got, want = Int8Linear(layer)(x), layer(x)
    assert got.dtype == dtype and got.shape == (rows, 96)
    # 127 levels per channel and, with VNNI, per row: ~1 % of the output's range, bound 2 % (a wrong layout misses
    # by 100 %). Without VNNI rows get 63 levels, twice the step, so twice the bound (over 200 seeded 1-row layers
    # the worst was 3.0 %); full-range activations there saturated oneDNN's 16-bit pair sums: 25 % off.
    bound = 0.02 * INT8_MAX / activation_max()
    assert float((got.float() - want.float()).abs().max()) <= bound * float(want.float().abs().max())


def test_the_gate_measures_drift_top1_and_the_order_of_a_requests_items():
    reference = [(torch.tensor([[-1.0, -2.0], [-3.0, -1.0], [-2.0, -2.5]]), torch.tensor([4, 5, 6]))]
    swapped = [(torch.tensor([[-1.1, -2.0], [-0.5, -1.0], [-2.0, -2.5]]), torch.tensor([4, 5, 7]))]
    result = figures(reference, swapped)
    assert result.max_label_logprob_drift == pytest.approx(2.5)
    assert result.top1_agreement == pytest.approx(2 / 3)
    # by the first label: items 0 > 2 > 1 before; 1 > 0 > 2 after: only the pair (0, 2) keeps its order
    assert result.rank_agreement == pytest.approx(1 / 3)
    assert (result.samples, result.requests) == (3, 1)


def test_the_gate_refuses_with_every_missed_limit_and_its_figure():
    result = GateFigures(0.8, 0.01, 0.5, 1.0, samples=16, requests=2)
    with pytest.raises(QuantizationRefused, match=r"max label log-prob drift 0\.8 nats > 0\.25.*top-1 agreement "
                                                  r"0\.5000 < 0\.9") as refused:
        check(result, GateLimits(0.25, 0.05, 0.9, 0.95))
    assert "mean" not in str(refused.value) and "rank" not in str(refused.value)
    check(result, GateLimits(1.0, 0.05, 0.5, 0.95))  # within every limit: no error


def test_a_calibration_file_is_read_or_refused_naming_the_line(tmp_path):
    path = tmp_path / "calibration.txt"
    path.write_text("1 2 3\n\n4 5\n")
    assert [s.tolist() for s in read_calibration(path, 8, 100)] == [[1, 2, 3], [4, 5]]
    path.write_text("1 2 3\n4 x\n")
    with pytest.raises(ValueError, match="line 2: expected token ids"):
        read_calibration(path, 8, 100)
    path.write_text("1 2 3 4 5\n")
    with pytest.raises(ValueError, match=r"line 1: 5 tokens, more than bounds.max_tokens_per_sample \(4\)"):
        read_calibration(path, 4, 100)
    path.write_text("1 200\n")
    with pytest.raises(ValueError, match="line 1: a token id outside the vocabulary"):
        read_calibration(path, 4, 100)


def package_source(path) -> str:
    """The generated C++ of a package (the wrapper that calls each kernel)."""
    with zipfile.ZipFile(path) as archive:
        return "".join(archive.read(n).decode(errors="replace") for n in archive.namelist() if n.endswith(".cpp"))


@pytest.mark.slow
@needs_onednn
def test_an_int8_build_passes_its_gate_and_both_packages_call_the_int8_gemm_once_per_int8_layer(int8_artifacts):
    from worker.runtime.loader import load_nodes

    artifacts = int8_artifacts
    manifest = json.loads((artifacts / "manifest.json").read_text())
    record = manifest["quantize"]
    int8_layers = record["int8_layers"]
    assert int8_layers and record["calibration"].startswith("4 batches of 8 random token-id samples")
    assert record["gate"]["max_label_logprob_drift"] <= 1.0 and record["gate"]["requests"] == 2
    int8_weights = {f"model.{name}.qweight" for name in int8_layers}
    assert {n for n, kind in manifest["prepacked"].items() if kind == "onednn_int8"} == int8_weights
    for workload in ("score", "beam"):  # no silent fallback to float GEMMs (e.g. dequantized weights)
        source = package_source(artifacts / manifest["nodes"][workload]["package"])
        assert source.count("aoti_torch_cpu__qlinear_pointwise_tensor(") >= len(int8_layers), workload
    nodes = load_nodes(artifacts)
    assert all(nodes.weights[name].is_mkldnn or nodes.weights[name].dtype != torch.int8 for name in int8_weights)
    ids, lens = torch.randint(0, 1000, (30,)), torch.tensor([10, 20])
    result = nodes.score(ids, lens, torch.tensor([5, 9]), 2)
    assert torch.isfinite(result.label_logprobs).all()
    beams = nodes.beam(ids[:10], torch.tensor([10]), 2, 3, 2)
    assert beams.sequences.shape == (1, 2, 3)


@pytest.mark.slow
@needs_onednn
def test_the_int8_package_runs_onednn_int8_kernels_with_int8_weights(int8_artifacts):
    """oneDNN's own log of what ran: an int8 matmul with s8 weights (a float fallback shows f32/bf16), on int8
    dot products where the CPU has them (brgemm on avx512_core_vnni; on a CPU with AMX or AVX10, oneDNN names
    those ISAs, which include VNNI), else a jit kernel (AVX2: gemm:jit), never the reference one."""
    artifacts = int8_artifacts
    script = ("import sys, torch; sys.path.insert(0, '.'); from worker.runtime.loader import load_nodes; "
              f"n = load_nodes('{artifacts}'); "
              "n.score(torch.arange(30) % 1000, torch.tensor([10, 20]), torch.tensor([5, 9]), 2)")
    env = {**os.environ, "ONEDNN_VERBOSE": "1", "OMP_NUM_THREADS": str(torch.get_num_threads())}
    log = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True).stdout
    int8_lines = [line for line in log.splitlines() if "exec" in line and "matmul" in line and "wei:s8" in line]
    assert int8_lines and not any(",ref" in line for line in int8_lines), log[-2000:]
    if "avx512_vnni" in open("/proc/cpuinfo").read():
        assert any(isa in line for line in int8_lines for isa in VNNI_ISAS), log[-2000:]
    else:
        assert all("jit" in line for line in int8_lines), log[-2000:]


@pytest.mark.slow
def test_a_model_that_fails_the_gate_is_refused_with_its_figures_and_nothing_is_written(demo_checkpoint):
    from worker.runtime.artifacts import MANIFEST

    with pytest.raises(QuantizationRefused, match=r"misses the \[quantize\] gate on 2 held-out requests .*"
                                                  r"max label log-prob drift [0-9.e-]+ nats > 0\.0"):
        build_int8(demo_checkpoint, "demo-int8-refused", selection_max_drift=2.0, max_label_logprob_drift=0.0)
    assert not (CACHE / "artifacts/demo-int8-refused" / MANIFEST).exists()


@pytest.mark.slow
@needs_onednn
async def test_an_int8_deployment_serves_both_routes_over_http_with_the_same_api(int8_artifacts, tmp_path):
    import numpy as np

    from worker.runtime.loader import load_nodes
    from shared.config import BeamConfig
    from tests.gateway.test_gateway_real_worker import TEXTS, direct, encode, real_gateway

    artifacts = int8_artifacts
    nodes = load_nodes(artifacts)
    async with real_gateway(artifacts, tmp_path, beam=BeamConfig(enabled=True)) as client:
        response = await client.post("/v1/score", json={"samples": TEXTS, "labels": ["yes", "no"],
                                                        "output": "logprobs"})
        scored = await response.json()
        assert response.status == 200, scored
        want = direct(nodes.score, encode(client, TEXTS), scored["label_token_ids"]).label_logprobs
        np.testing.assert_allclose(scored["scores"], want.numpy(), rtol=1e-5, atol=1e-6)
        body = {"prompt": TEXTS[0], "beam_width": 4, "max_new_tokens": 3, "num_return_sequences": 2}
        response = await client.post("/v1/generate", json=body)
        generated = await response.json()
        assert response.status == 200, generated
        prompt = encode(client, [TEXTS[0]])[0]
    out = nodes.beam(torch.tensor(prompt), torch.tensor([len(prompt)]), 4, 3, 2)
    assert [c["token_ids"] for c in generated["candidates"]] == \
        [out.sequences[0, i, : int(out.lengths[0, i])].tolist() for i in range(2)]


@needs_onednn
def test_ranking_with_the_unchanged_layers_replayed_gives_the_same_selection_computing_fewer_layers(
        checkpoint_factory):
    """A candidate of layer b is measured with layers 0..b-1 replaced by their recorded outputs (select.Replay):
    every drift, the order, the probes and the chosen layers are those of full passes, to the bit."""
    from compile.checkpoint import load_checkpoint
    from compile.fp8 import candidate_layer, random_calibration
    from compile.model import build_model
    from compile.quantize import select as selection
    from compile.quantize.build_step import scorer
    from compile.score.module import ScoreModule

    checkpoint = load_checkpoint(checkpoint_factory("qwen3", num_hidden_layers=4), "float32")
    model = build_model(checkpoint.spec, checkpoint.state_dict, torch.float32)
    batches = random_calibration(checkpoint.spec.vocab_size, 2, 4, (3, 24), [5, 9, 11], 8, seed=2)
    run = scorer(ScoreModule(model, 1).eval(), batches)
    first_layer_calls = []
    model.layers[0].register_forward_hook(lambda *_: first_layer_calls.append(1))

    def chosen(replay: bool):
        first_layer_calls.clear()
        result = selection.select(model, run, Int8Linear, 0.05, replay=replay)
        return result, len(first_layer_calls)

    full, full_calls = chosen(replay=False)
    replayed, replayed_calls = chosen(replay=True)
    assert replayed.to_dict() == full.to_dict()  # the same floats, not merely close
    assert full.ranked and 0 < len(full.chosen) < len(full.ranked)  # a budget that chooses some, not all
    # without replay layer 0 runs in every pass; with it, only in the reference pass and in the passes that
    # quantize one of its own layers (its candidates, the probes whose prefix holds one)
    order = [d.name for d in full.ranked if d.max_drift <= full.budget]
    in_layer_0 = lambda names: any(candidate_layer(n) == 0 for n in names)  # noqa: E731
    passes = 1 + sum(in_layer_0([d.name]) for d in full.ranked) + sum(in_layer_0(order[:p["layers"]])
                                                                       for p in full.probes)
    assert full_calls == (1 + len(full.ranked) + len(full.probes)) * len(batches)
    assert replayed_calls == passes * len(batches) < full_calls
    assert all(type(layer).__name__ == "Layer" for layer in model.layers)  # every stand-in put back


def test_replay_refuses_a_batch_it_did_not_record():
    from compile.quantize.select import Replay

    replay = Replay([torch.zeros(3, 8), torch.zeros(4, 8)])
    assert replay(torch.ones(3, 8)) is replay.outputs[0]
    with pytest.raises(RuntimeError, match=r"replayed layer output \(4, 8\) for an input \(5, 8\)"):
        replay(torch.ones(5, 8))
    assert replay(torch.ones(4, 8)) is replay.outputs[1]
    with pytest.raises(RuntimeError, match="replayed layer called 3 times, more than the 2 calls recorded"):
        replay(torch.ones(3, 8))
