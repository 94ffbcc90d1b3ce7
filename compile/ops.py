"""Custom operators compiled into the packages as calls (import this module before loading one).

`boundserve::varlen_attention` is causal attention over packed variable-length sequences: each
sample attends only to itself, so its cost is Σ Lᵢ², never (Σ Lᵢ)², and no padding is computed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


@torch.library.custom_op("boundserve::varlen_attention", mutates_args=())
def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Causal attention per packed sample. q [T, Hq, D], k/v [T, Hkv, D], cu_seqlens int [B+1] -> [T, Hq, D]."""
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    group = q.shape[1] // k.shape[1]
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            # [1, H, L, D] views of one sample; SDPA picks the fused CPU/CUDA kernel.
            qi = q[start:end].transpose(0, 1).unsqueeze(0)
            ki = k[start:end].transpose(0, 1).unsqueeze(0)
            vi = v[start:end].transpose(0, 1).unsqueeze(0)
            oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, enable_gqa=group > 1)
            out[start:end] = oi.squeeze(0).transpose(0, 1)
    return out


@varlen_attention.register_fake
def _(q, k, v, cu_seqlens):
    return torch.empty_like(q)
