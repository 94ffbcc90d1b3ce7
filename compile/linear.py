"""Which matrix-multiply kernel the compiled nodes' linear layers call (the build option model.gemm).

On the CPU, a float32 `F.linear` lowers to aten mm/addmm, which calls MKL's sgemm; on the AVX-512
machine this was measured on, that ran at about half the rate of oneDNN's float32 matmul
(`mkldnn::_linear_pointwise`, compiled against the plain [out, in] weight, so the weights keep their
names and every node still shares one copy; the runtime hands it prepacked: worker/runtime/packing.py). Inductor's own freezing + cpp.weight_prepack
does not help here: with a dynamic token axis it left aten addmm in the package (torch 2.13, seen
on a compiled 2-layer MLP at the same speed as without freezing). bfloat16 linears already go to oneDNN through
aten (bit-identical outputs, measured), but unpacked: through `mkldnn::_linear_pointwise` their
weights are prepacked once at load (worker/runtime/packing.py), so "auto" takes oneDNN for bfloat16 too. The
op is CPU-only.

Default "auto": oneDNN for float32 on a CPU with AVX-512 (on AVX2 alone: for the beam node only, see
below) and for bfloat16 on a CPU with bfloat16 instructions, aten otherwise. On AVX-512, at
Qwen2.5-0.5B's shapes, oneDNN made the float32 scoring node 1.6x faster at 24 layers (1.7x at 4) and
the beam node 1.5x at 4 layers (medians of interleaved rounds, bench/gemm_ab.py). On a CPU with AVX2
alone (an AMD EPYC, 2 threads) the scoring node went the other way: MKL's sgemm ran it 1.12x faster
than prepacked oneDNN at 24 layers (19.14 against 21.51 s a request, all 6 interleaved pairs,
bench/node_ab.py --b-gemm aten), and per GEMM shape of that request 20.4 against 23.4 s
(bench/profile_nodes.py), so there "auto" takes aten for the scoring node. Not for the beam node: its
GEMMs have W rows a decode step (and the prompt's rows once), where oneDNN wins on that CPU (one
decode step's GEMMs at 100 rows, timed alone outside a package, median of 5 calls, a one-off script:
MKL 915 ms, oneDNN 832 on dense weights, 754 prepacked; at 400 rows all three within 3 %), and the
beam node compiled on aten ran at 0.83x the speed of the one on prepacked oneDNN (4.83 against 3.99 s
a request, W = 100, all 6 pairs slower, bench/node_ab.py --workload beam). So on AVX2 alone "auto"
gives each node its own kernel (NARROW_NODES). A weight two nodes read on different kernels stays
dense (worker/runtime/packing.py), so a deployment with both nodes runs its beam node on oneDNN with dense
weights. oneDNN's float32 results differ from aten's only in summation order: at 24 layers, 3
requests of 15 samples, the largest label-logit difference from transformers was 1.7e-4 with oneDNN
and 1.1e-4 with aten (logits up to ~6: relative 3e-5), so neither kernel holds 1e-4 at real depth; at
the test models' depth both hold the tests' 1e-4.

Blocking the token axis (tried, not kept). Outside a package, Qwen2.5-0.5B's whole MLP (prepacked
oneDNN gate/up, SiLU·mul, down) on 4,285 rows ran 1.37x faster in 512-row blocks in bf16 (752 vs
548 GFLOP/s) and 1.39x in fp32 (372 vs 267); 1,024-row blocks gained nothing (549 / 268). Medians
of 5 interleaved rounds, 2 threads, quiet (load 0.2-0.5). Inside a package with a dynamic token axis
(torch 2.13) no route worked yet: `scan` over [T // B, B, H] exports, but Inductor's scan ->
while_loop rewrite cannot size its output when the block count is not itself a graph symbol
(KeyError on the token symbol); static slices x[i*B:(i+1)*B] (the last one open-ended) export only
under `backed_size_oblivious` (otherwise a guard on the row count that the dynamic range violates),
and the scoring node compiled that way read out of bounds (tiny Qwen3 test model). So every MLP
runs one GEMM over all rows.

With glibc's default allocator settings each whole-MLP call maps its [T, 2I] gate/up product afresh
(above the mmap threshold) and faults its pages in, which blocks avoid; a worker keeps freed memory
instead (worker/runtime/allocator.py). Measured again that way (12-05, an AMD EPYC with AVX-512 at half rate,
2 threads, prepacked oneDNN, 4,285 rows, best of 5 interleaved rounds), the blocks gain nothing:
Qwen3-0.6B's float32 MLP took 376 ms whole (silu * mul compiled by Inductor) against 379 in 512-row
blocks (430 against 379 under the default settings); the GEMMs alone ran at 208-222 GFLOP/s (0.92-0.98
of the float32 peak) whether whole, split two or four ways along N, or in 256- or 1,024-row blocks.
Built into the Qwen3-0.6B float32 scoring node as a C++ operator (each block's three steps on this op
with the prepacked weights; not kept), the node ran 0.98x as fast as without it (bench/node_ab.py,
4 pairs, identical label log-probs).
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
