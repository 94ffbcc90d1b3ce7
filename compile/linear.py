"""Which matrix-multiply kernel the compiled nodes' linear layers call (the build option model.gemm).

On the CPU, a float32 `F.linear` lowers to aten mm/addmm, which calls MKL's sgemm; on the AVX-512
machines this was measured on, oneDNN's float32 matmul (`mkldnn::_linear_pointwise`, compiled
against the plain [out, in] weight, so the weights keep their names and every node still shares one
copy; the runtime hands it prepacked: worker/runtime/packing.py) ran markedly faster. Inductor's own freezing
+ cpp.weight_prepack does not help here: with a dynamic token axis it left aten addmm in the package
(torch 2.13). bfloat16 linears already go to oneDNN through aten (bit-identical outputs), but
unpacked: through `mkldnn::_linear_pointwise` their weights are prepacked once at load, so "auto"
takes oneDNN for bfloat16 too. The op is CPU-only.

Default "auto": oneDNN for float32 on a CPU with AVX-512 and for bfloat16 on a CPU with bfloat16
instructions, aten otherwise, with one exception per node on a CPU with AVX2 alone. There MKL's sgemm
ran the scoring node's thousands of rows faster than prepacked oneDNN, while the beam node's GEMMs,
of W rows a decode step, ran faster on oneDNN; so on AVX2 alone "auto" gives each node its own kernel
(NARROW_NODES). The A/B runs behind these choices are in docs/benchmarks.md (bench/node_ab.py,
bench/gemm_ab.py). A weight two nodes read on different kernels stays dense (worker/runtime/packing.py), so a
deployment with both nodes runs its beam node on oneDNN with dense weights. oneDNN's float32 results
differ from aten's only in summation order; at real depth neither kernel holds 1e-4 of transformers'
label logits, at the test models' depth both do.

Blocking the token axis (tried, not kept). Outside a package, the whole MLP in 512-row blocks looked
faster, but only because each whole-MLP call mapped its [T, 2I] gate/up product afresh and faulted its
pages in under glibc's default allocator settings; with a worker's setting (worker/runtime/allocator.py keeps
freed memory) the blocks gain nothing, and a C++ blocked-MLP operator built into the scoring node was
no faster. Inside a package with a dynamic token axis (torch 2.13) no route worked cleanly anyway:
`scan` over [T // B, B, H] exports, but Inductor's scan -> while_loop rewrite cannot size its output
when the block count is not itself a graph symbol; static slices export only under
`backed_size_oblivious`, and the node compiled that way read out of bounds. So every MLP runs one GEMM
over all rows (docs/design/compilation.md).

Epilogues (oneDNN post-ops). Where a layer runs on oneDNN, the pointwise work that follows its GEMM is the
GEMM's post-op, applied to the float32 accumulator before the one rounding to the model dtype and the one
write: SiLU on the gate projection (`linear_silu`), the product with the activated gate on the up projection
(`linear_times`), the residual add on the attention's output projection and the MLP's down projection
(`linear_plus`). Without them each of these products was written, then read back by a fused pointwise
kernel: for SwiGLU the [T, 2I] gate/up product (Qwen2.5-0.5B: 2 x 4,864 columns) written and read once
more, the largest tensor of the layer. Gate and up are therefore two weights (`Mlp`), each packed whole.
Inductor's own CPU GEMM template with epilogue fusion (max-autotune, cpp backend) needs the weight to be a
compile-time constant that it prepacks into the package itself, which a package whose weights are loaded
and shared at run time cannot take (docs/design/compilation.md measures the routes).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

GemmBackend = Literal["aten", "onednn"]
GEMM_CHOICES = ("auto", "aten", "onednn")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, backend: GemmBackend) -> torch.Tensor:
    """x [N, in] @ weight [out, in]^T + bias [out] -> [N, out], on the chosen kernel."""
    if backend == "onednn":
        # Arguments after bias: no fused post-op ("none", its scalars, its algorithm).
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [None], "")
    return F.linear(x, weight, bias)


if torch.backends.mkldnn.is_available():
    @torch.library.register_fake("mkldnn::_linear_pointwise.binary")
    def _linear_binary_shape(x, other, weight, bias, attr):
        """The shape of oneDNN's GEMM with a binary post-op, for export (torch registers one for the unary form
        only: Inductor creates the binary form itself, after export, when freezing): [..., out] in x's dtype."""
        return x.new_empty((*x.shape[:-1], weight.shape[0]))


def on_onednn(module: nn.Module) -> bool:
    """Whether `module` is one of our Linear layers on oneDNN (an int8 or FP8 layer swapped in is not)."""
    return isinstance(module, Linear) and module.gemm == "onednn"


def linear_silu(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """silu(module(x)) [N, out]. On oneDNN the SiLU is the GEMM's eltwise post-op ("swish"): applied to the
    float32 accumulator in the epilogue, so the product is written once, activated, and no pointwise kernel
    reads it back (module docstring: epilogues)."""
    if on_onednn(module):
        return torch.ops.mkldnn._linear_pointwise(x, module.weight, module.bias, "swish", [None], "")
    return F.silu(module(x))


def linear_times(module: nn.Module, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """module(x) * other, other [N, out]; on oneDNN a binary post-op of the GEMM (SwiGLU's up projection times
    the activated gate)."""
    if on_onednn(module):
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, module.weight, module.bias, "mul")
    return module(x) * other


def linear_plus(module: nn.Module, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """other + module(x), other [N, out]; on oneDNN a binary post-op of the GEMM (the residual add after the
    attention's output projection and after the MLP's down projection)."""
    if on_onednn(module):
        return torch.ops.mkldnn._linear_pointwise.binary(x, other, module.weight, module.bias, "add")
    return other + module(x)


class Linear(nn.Linear):
    """nn.Linear whose kernel is set per build (`use_gemm`); same parameters and state-dict names."""

    gemm: GemmBackend = "aten"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.gemm)


def onednn_bf16() -> bool:
    """Whether this CPU runs oneDNN's bfloat16 matmul (AVX512-BF16 / AMX; on AVX2 alone oneDNN has no
    bfloat16 inner product: its op refuses to build one, while aten's bfloat16 matmul converts)."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


NARROW_NODES = frozenset({"beam"})
"""Nodes whose GEMMs have a few hundred rows at most (the beam node: W a decode step, the prompt once),
against the scoring node's thousands of packed tokens."""


def onednn_fp32(workload: str) -> bool:
    """Whether "auto" takes oneDNN for `workload`'s float32 node here: on a CPU with AVX-512, where it beat
    MKL's sgemm, for every node; on AVX2 alone for the narrow ones only, where MKL's won the scoring
    node and lost the beam node (module docstring)."""
    return torch.backends.mkldnn.is_available() and (torch.cpu._is_avx512_supported() or workload in NARROW_NODES)


def resolve_gemm(choice: str, device: str, dtype: torch.dtype, workload: str) -> GemmBackend:
    """The backend `workload`'s node uses, checked against its device: oneDNN's op exists on a CPU only,
    and in bfloat16 only where the CPU has bfloat16 instructions; "auto" takes it (worker/runtime/packing.py
    prepacks its weights) for float32 where `onednn_fp32` says so and for bfloat16 on a CPU with
    bfloat16 instructions, and aten otherwise."""
    if choice not in GEMM_CHOICES:
        raise ValueError(f"model.gemm = {choice!r}: expected one of {', '.join(GEMM_CHOICES)}")
    on_cpu = device == "cpu" and torch.backends.mkldnn.is_available()
    if choice == "auto":
        if on_cpu and ((dtype == torch.float32 and onednn_fp32(workload))
                       or (dtype == torch.bfloat16 and onednn_bf16())):
            return "onednn"
        return "aten"
    if choice == "onednn" and not on_cpu:
        raise ValueError(f"model.gemm = 'onednn' needs a CPU build with oneDNN (model.device is {device!r})")
    if choice == "onednn" and dtype == torch.bfloat16 and not onednn_bf16():
        raise ValueError(f"model.gemm = 'onednn' in bfloat16 needs a CPU with bfloat16 instructions (AVX512-BF16 or "
                         f"AMX; this one: {torch.backends.cpu.get_cpu_capability()}): use 'auto' or 'aten', or "
                         "model.dtype = 'float32'")
    return choice  # type: ignore[return-value]


def use_gemm(model: nn.Module, backend: GemmBackend) -> nn.Module:
    """Set the backend on every module with a `gemm` attribute (each Linear, the output projection);
    returns model."""
    for module in model.modules():
        if hasattr(module, "gemm"):
            module.gemm = backend
    return model
