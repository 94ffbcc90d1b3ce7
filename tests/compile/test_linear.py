"""The build option model.gemm: which kernel the linear layers call, and that both kernels agree."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from compile.linear import Linear, linear, onednn_bf16, onednn_fp32, resolve_gemm, use_gemm
from worker.runtime.packing import combine, pack, packable
from shared.config import ConfigError, parse_config
from tests.compile.test_score_node import check_against_transformers

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@needs_onednn
@pytest.mark.parametrize("rows", [1, 2, 37])
@pytest.mark.parametrize("with_bias", [False, True])
def test_onednn_linear_equals_aten_in_float32(rows, with_bias):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 64, generator=generator)
    weight = torch.randn(96, 64, generator=generator)
    bias = torch.randn(96, generator=generator) if with_bias else None
    out = linear(x, weight, bias, "onednn")
    assert out.shape == (rows, 96)
    # Same products, another summation order: float32 rounding only (|values| ~ 8 here).
    assert (out - F.linear(x, weight, bias)).abs().max() <= 1e-4


@needs_onednn
def test_onednn_linear_reads_a_row_slice_of_the_weight():
    """project_q / project_kv pass row slices of the fused q/k/v weight (storage offset, no copy)."""
    x, weight = torch.randn(5, 32), torch.randn(48, 32)
    assert (linear(x, weight[16:], None, "onednn") - x @ weight[16:].T).abs().max() <= 1e-4


@needs_onednn
@pytest.mark.parametrize("workload", ["score", "beam"])
def test_both_kernels_are_accepted_for_a_cpu_build_and_auto_follows_the_cpu(workload):
    assert resolve_gemm("aten", "cpu", torch.float32, workload) == "aten"
    assert resolve_gemm("onednn", "cpu", torch.float32, workload) == "onednn"
    assert resolve_gemm("auto", "cpu", torch.float32, workload) == ("onednn" if onednn_fp32(workload) else "aten")
    assert resolve_gemm("auto", "cpu", torch.bfloat16, workload) == ("onednn" if onednn_bf16() else "aten")
    assert resolve_gemm("auto", "cpu", torch.float16, workload) == "aten"
    assert resolve_gemm("auto", "cuda", torch.float32, workload) == "aten"
    assert resolve_gemm("aten", "cuda", torch.float32, workload) == "aten"


@needs_onednn
@pytest.mark.parametrize("avx512", [True, False])
def test_auto_takes_onednn_for_float32_with_avx512_and_on_avx2_alone_for_the_beam_node_only(monkeypatch, avx512):
    """Where each kernel won (compile/linear.py): oneDNN on AVX-512; on AVX2 alone MKL's sgemm for the
    scoring node's thousands of rows and oneDNN for the beam node's hundreds; an explicit choice stands
    on either CPU."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: avx512)
    assert resolve_gemm("auto", "cpu", torch.float32, "score") == ("onednn" if avx512 else "aten")
    assert resolve_gemm("auto", "cpu", torch.float32, "beam") == "onednn"
    for workload in ("score", "beam"):
        assert resolve_gemm("onednn", "cpu", torch.float32, workload) == "onednn"
        assert resolve_gemm("aten", "cpu", torch.float32, workload) == "aten"


@pytest.mark.skipif(onednn_bf16(), reason="this CPU has oneDNN bfloat16 matmul")
def test_onednn_in_bfloat16_on_a_cpu_without_bfloat16_instructions_is_refused_and_auto_takes_aten():
    """On AVX2 alone oneDNN builds no bfloat16 inner product: the op would fail at the first call."""
    with pytest.raises(ValueError, match=r"model\.gemm = 'onednn' in bfloat16 needs a CPU with bfloat16"):
        resolve_gemm("onednn", "cpu", torch.bfloat16, "score")
    x, weight = torch.randn(5, 32).bfloat16(), torch.randn(48, 32).bfloat16()
    got = linear(x, weight, None, resolve_gemm("auto", "cpu", torch.bfloat16, "score"))
    assert got.dtype == torch.bfloat16 and (got.float() - x.float() @ weight.float().T).abs().max() <= 0.1


def test_onednn_on_cuda_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"model\.gemm = 'onednn'.*'cuda'"):
        resolve_gemm("onednn", "cuda", torch.float32, "score")


def test_an_unknown_gemm_in_the_config_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"model\.gemm"):
        parse_config({"model": {"gemm": "mkl"}})


def test_the_default_float32_cpu_build_records_the_kernel_auto_takes_here_in_its_manifest(demo_artifacts):
    nodes = json.loads((demo_artifacts / "manifest.json").read_text())["nodes"]
    assert nodes["score"]["gemm"] == resolve_gemm("auto", "cpu", torch.float32, "score")


def test_a_build_of_both_nodes_records_each_nodes_kernel(int8_artifacts):
    """The int8 build leaves "auto" to pick its float layers' kernel for both nodes (on AVX2 alone: aten
    for the scoring node, oneDNN for the beam node, which still serve: tests/compile/test_int8.py)."""
    nodes = json.loads((int8_artifacts / "manifest.json").read_text())["nodes"]
    assert {w: nodes[w]["gemm"] for w in ("score", "beam")} == {
        w: resolve_gemm("auto", "cpu", torch.float32, w) for w in ("score", "beam")}


def test_an_aten_build_matches_transformers(llama_artifacts):
    """Both kernels hold the tests' 1e-4 at these small sizes (the default oneDNN builds are checked
    against transformers by the node tests; at 24 layers of Qwen2.5-0.5B oneDNN was 1.7e-4 from
    transformers and aten 1.1e-4: see compile/linear.py). The aten build is the llama fixture's
    (tests/compile/conftest.py), shared with the llama node tests rather than built again."""
    path, artifacts = llama_artifacts
    assert json.loads((artifacts / "manifest.json").read_text())["nodes"]["score"]["gemm"] == "aten"
    check_against_transformers(artifacts, path)


class WholeAndSliced(nn.Module):
    """One linear whose weight the oneDNN op takes whole, one read through a row slice."""

    def __init__(self):
        super().__init__()
        self.whole, self.sliced = Linear(8, 8), Linear(8, 16, bias=False)
        self.whole.gemm = "onednn"

    def forward(self, x):
        return self.whole(x), linear(x, self.sliced.weight[:8], None, "onednn")


@needs_onednn
def test_only_weights_the_onednn_op_takes_whole_are_packed():
    """A packed constant read through a slice would read oneDNN's blocked bytes as dense: never packed."""
    program = torch.export.export(WholeAndSliced(), (torch.randn(4, 8),))
    found = packable(program)
    assert found == {"whole.weight": "onednn", "whole.bias": None, "sliced.weight": None}
    # a weight one node takes whole and another slices stays dense for both
    assert combine([found, {"whole.weight": None}]) == {}
    assert combine([found, {"other.weight": "onednn"}]) == {"other.weight": "onednn", "whole.weight": "onednn"}


@needs_onednn
def test_a_weight_another_node_reads_on_aten_stays_dense():
    """On AVX2 alone "auto" gives the scoring node aten and the beam node oneDNN (compile/linear.py): the
    weights both read are then handed dense to both."""
    example = (torch.randn(4, 8),)
    on_onednn = packable(torch.export.export(WholeAndSliced(), example))
    on_aten = packable(torch.export.export(use_gemm(WholeAndSliced(), "aten"), example))
    assert on_onednn["whole.weight"] == "onednn" and on_aten["whole.weight"] is None
    assert combine([on_onednn, on_aten]) == {} and combine([on_onednn]) == {"whole.weight": "onednn"}


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not onednn_bf16(), reason="oneDNN has no bfloat16 matmul on this CPU (a build takes aten there)"))])
def test_a_packed_weight_gives_the_dense_weights_results(dtype):
    generator = torch.Generator().manual_seed(3)
    weights = {"w": torch.randn(96, 64, generator=generator).to(dtype), "b": torch.randn(96).to(dtype)}
    packed = pack(weights, {"w": "onednn"})
    assert packed["w"].is_mkldnn and not packed["b"].is_mkldnn
    for rows in (1, 37, 300):
        x = torch.randn(rows, 64, generator=generator).to(dtype)
        got = linear(x, packed["w"], weights["b"], "onednn").float()
        dense = linear(x, weights["w"], weights["b"], "onednn").float()
        # the same products; a 1-row call may take another kernel (summation order: 5e-6 here)
        assert (got - dense).abs().max() <= 1e-4


def test_an_unknown_packing_in_a_manifest_is_refused():
    with pytest.raises(ValueError, match="unknown packing 'mkl' for weight w"):
        pack({"w": torch.ones(2, 2)}, {"w": "mkl"})


@needs_onednn
def test_both_nodes_get_the_same_prepacked_weights(beam_artifacts):
    """Every linear weight but the last layer's q/k/v (sliced by its queries-only pass) and the tied
    embedding is packed once at load and handed to both packages (beam_artifacts asks for oneDNN, so this
    runs on every CPU, also where "auto" keeps aten)."""
    from worker.runtime.loader import load_nodes

    nodes = load_nodes(beam_artifacts)
    prepacked = nodes.manifest.prepacked
    last = nodes.manifest.model.num_layers - 1
    assert "model.layers.0.mlp.up.weight" in prepacked and "model.layers.0.attn.qkv.weight" in prepacked
    assert f"model.layers.{last}.attn.qkv.weight" not in prepacked and "model.embed.weight" not in prepacked
    assert all(nodes.weights[name].is_mkldnn for name in prepacked)
    assert not nodes.weights["model.embed.weight"].is_mkldnn
