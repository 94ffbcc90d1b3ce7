"""The GEMM epilogues (compile/linear.py): SiLU, the SwiGLU product and the residual add as oneDNN post-ops
give the results of the GEMM followed by the pointwise op, the graph calls the fused ops, and their weights
are packed whole."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from compile.linear import Linear, linear_plus, linear_silu, linear_times, on_onednn, onednn_bf16, use_gemm
from compile.quantize.int8 import Int8Linear
from worker.runtime.packing import pack, packable

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
DTYPES = [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    not onednn_bf16(), reason="oneDNN has no bfloat16 matmul on this CPU (a build takes aten there)"))]


def layer(in_features: int, out_features: int, bias: bool, dtype: torch.dtype, seed: int) -> Linear:
    torch.manual_seed(seed)
    module = Linear(in_features, out_features, bias=bias).to(dtype)
    module.gemm = "onednn"
    return module


@needs_onednn
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 37, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_each_epilogue_equals_the_gemm_then_the_pointwise_op(dtype, rows, bias):
    """Against float32 aten on the same (rounded) inputs: float32 within summation order; bfloat16 within its
    rounding of results of magnitude ~4 (the fused one rounds once, the unfused one twice)."""
    gemm = layer(64, 96, bias, dtype, rows)
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 64, generator=generator).to(dtype)
    other = torch.randn(rows, 96, generator=generator).to(dtype)
    exact = F.linear(x.float(), gemm.weight.float(), None if gemm.bias is None else gemm.bias.float())
    tolerance = 1e-4 if dtype == torch.float32 else 0.05
    for got, want in ((linear_silu(gemm, x), F.silu(exact)), (linear_times(gemm, x, other), exact * other.float()),
                      (linear_plus(gemm, x, other), exact + other.float())):
        assert got.dtype == dtype and got.shape == (rows, 96)
        assert (got.float() - want).abs().max() <= tolerance


@needs_onednn
@pytest.mark.parametrize("dtype", DTYPES)
def test_epilogues_on_a_packed_weight_give_the_dense_weights_results(dtype):
    gemm = layer(64, 96, False, dtype, 0)
    x, other = torch.randn(37, 64).to(dtype), torch.randn(37, 96).to(dtype)
    dense = [linear_silu(gemm, x), linear_times(gemm, x, other), linear_plus(gemm, x, other)]
    gemm.weight = nn.Parameter(pack({"w": gemm.weight.detach()}, {"w": "onednn"})["w"], requires_grad=False)
    packed = [linear_silu(gemm, x), linear_times(gemm, x, other), linear_plus(gemm, x, other)]
    for got, want in zip(packed, dense):
        assert (got.float() - want.float()).abs().max() <= 1e-4


def test_a_layer_on_aten_or_in_int8_takes_the_gemm_then_the_pointwise_op():
    """An int8 layer swapped in (compile/quantize/int8.py) has no post-ops: the epilogue functions call it and
    apply the op themselves, so the same model code runs with any mix of layers."""
    torch.manual_seed(1)
    dense = nn.Linear(64, 96, bias=False)
    on_aten = use_gemm(Linear(64, 96, bias=False), "aten")
    on_aten.weight = dense.weight
    x, other = torch.randn(8, 64), torch.randn(8, 96)
    assert not on_onednn(on_aten)
    assert torch.equal(linear_silu(on_aten, x), F.silu(dense(x)))
    assert torch.equal(linear_times(on_aten, x, other), dense(x) * other)
    assert torch.equal(linear_plus(on_aten, x, other), other + dense(x))
    if torch.backends.mkldnn.is_available():
        int8 = Int8Linear(dense)
        assert not on_onednn(int8)
        assert torch.equal(linear_plus(int8, x, other), other + int8(x))


class SwiGluBlock(nn.Module):
    """An MLP written as compile/model.Mlp writes it, its weights on oneDNN."""

    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = layer(8, 16, False, torch.float32, 0), layer(8, 16, False, torch.float32, 1), \
            layer(16, 8, False, torch.float32, 2)

    def forward(self, x):
        return linear_plus(self.down, linear_times(self.up, x, linear_silu(self.gate, x)), x)


@needs_onednn
def test_the_exported_graph_calls_the_fused_ops_and_their_weights_are_packed():
    """No pointwise node between the GEMMs (the SiLU, the product and the add are post-ops), and each weight,
    read whole by a unary or binary oneDNN op, is packed (worker/runtime/packing.py)."""
    program = torch.export.export(SwiGluBlock(), (torch.randn(4, 8),))
    targets = [node.target for node in program.graph.nodes if node.op == "call_function"]
    assert targets == [torch.ops.mkldnn._linear_pointwise.default, torch.ops.mkldnn._linear_pointwise.binary,
                       torch.ops.mkldnn._linear_pointwise.binary]
    assert packable(program) == {"gate.weight": "onednn", "up.weight": "onednn", "down.weight": "onednn"}
