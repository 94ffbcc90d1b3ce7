"""W8A8 int8 linear layers for CPU builds: int8 weights per output channel, int8 activations per token, oneDNN's
VNNI GEMM (`onednn::qlinear_pointwise`) compiled into the packages.

Weights: symmetric per output channel, w ~ q * s_w[n] with q in [-127, 127]; stored in the weights file as a dense
int8 [K, N] buffer (`qweight`, the layout the op's schema expects) with float32 scales [N] and int32 zero points [N]
(all 0; int64 ones would be copied into a new unnamed constant). The worker packs `qweight` once at load
(worker/runtime/packing.py: `onednn.qlinear_prepack`, oneDNN's VNNI layout with zero-point compensation) and hands the
same packed tensor to every node; an eager layer (calibration, tests) packs its own copy.
Activations: symmetric per token (row), x ~ (u - 128) * s_x[m] with u uint8: oneDNN's VNNI kernels take unsigned
activations (signed ones run its reference kernel, orders of magnitude slower). The op takes one activation scale for the whole
tensor, so it gets the largest row scale and each row is rescaled by s_x[m] / max s_x after (Inductor fuses that
into the next pointwise kernel). Scale and zero point are 0-d tensors computed in the graph: as Python numbers
Inductor would turn them into constants of its own, which a shared weights file cannot supply.

Activation range, by the CPU the build runs on (`activation_max`). With VNNI (`torch.cpu._is_vnni_supported()`) oneDNN
multiplies u8 by s8 into 32-bit sums, so activations take the full range (q in [-127, 127], zero point 128). On
AVX2 alone it pairs the products into 16-bit sums first (vpmaddubsw), which saturate: 2 x 255 x 127 is past
32,767, and a test layer came out far off its float layer. There activations get 7 bits (q in [-63, 63], zero
point 64: 2 x 127 x 127 fits), the reduced range other x86 int8 stacks use on such CPUs, and the same layer
came close to its float layer. A package is bound to the kind it was built on (worker/runtime/machine.py:
`cpu_vnni`), so a full-range package never runs where it would saturate.
"""

from __future__ import annotations

import torch
from torch import nn

from worker.runtime.packing import pack_int8

INT8_MAX = 127


def activation_max() -> int:
    """The largest |q| of an activation on this CPU: 127 with VNNI, 63 without (see the module docstring)."""
    return INT8_MAX if torch.cpu._is_vnni_supported() else 63


def quantize_rows(x: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] float -> (u [M, K] uint8 = round(x / s) + levels + 1, s [M, 1] float32), s = absmax(row) / levels
    (levels: activation_max() of the CPU the package is built for; no default, so no caller saturates by omission)."""
    scale = x.float().abs().amax(-1, keepdim=True).clamp(min=1e-12) / levels
    u = torch.round(x.float() / scale).clamp(-levels, levels) + (levels + 1)
    return u.to(torch.uint8), scale


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] float -> (q [K, N] int8, s [N] float32): per output channel, symmetric."""
    w = weight.detach().float()
    scale = w.abs().amax(1).clamp(min=1e-12) / INT8_MAX
    q = torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q.t().contiguous(), scale


class Int8Linear(nn.Module):
    """y = x W^T + b through oneDNN's int8 GEMM; called like compile.linear.Linear, output in x's dtype."""

    def __init__(self, linear: nn.Module):
        super().__init__()
        qweight, scale = quantize_weight(linear.weight)
        self.register_buffer("qweight", qweight)  # [K, N] int8; packed at load
        self.register_buffer("weight_scale", scale)  # [N] float32
        self.register_buffer("weight_zero_point", torch.zeros_like(scale, dtype=torch.int32))
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.levels = activation_max()  # fixed at build: the package is bound to this kind of CPU
        self.packed = pack_int8(qweight)  # eager calls; an export reads `qweight` (the worker packs it)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape  # [..., K]
        u, row_scale = quantize_rows(x.reshape(-1, shape[-1]), self.levels)
        top = row_scale.amax()  # 0-d
        y = self.int8_gemm(u, top, x.dtype)
        y = y * (row_scale / top).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def int8_gemm(self, u: torch.Tensor, top: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """oneDNN's int8 GEMM alone: u [M, K] uint8 from quantize_rows, `top` its largest row scale (0-d) ->
        [M, N] in `dtype`, scaled by top * s_w (forward rescales each row and adds the bias)."""
        zero_point = (top > 0).to(torch.int32) * (self.levels + 1)  # 0-d, always levels + 1 (module docstring)
        weight = self.qweight if torch.compiler.is_exporting() else self.packed
        return torch.ops.onednn.qlinear_pointwise.tensor(
            u, top, zero_point, weight, self.weight_scale, self.weight_zero_point, None,
            1.0, 0, dtype, "none", [], "")
