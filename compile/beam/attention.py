"""Shared-prompt attention for beams: one prompt K/V per request, a short suffix K/V per beam.

A decode query of beam w of request r attends to keys [prompt_r ; suffix_{r,w}]. Softmax over a
concatenation splits exactly into two partial softmaxes merged by their log-sum-exp:
    out = out_p · exp(lse_p − lse) + out_s · exp(lse_s − lse),   lse = logaddexp(lse_p, lse_s).
The prompt part is one batched matmul of all W beams (and all query heads of a KV group) against
the request's single prompt K/V, which is never copied per beam. Shapes: R requests, W beams,
L prompt tokens (padded to the longest prompt of the batch, masked), J suffix tokens,
Hq query heads, Hkv KV heads, G = Hq / Hkv, D head dim.
"""

from __future__ import annotations

import torch

from compile.model import merge_partials


def _partial(scores: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """scores [..., M, N] float32, v [..., N, D] -> softmax(scores) @ v [..., M, D] float32, lse [..., M]."""
    lse = torch.logsumexp(scores, dim=-1)  # [..., M]
    probs = torch.exp(scores - lse[..., None])
    return torch.matmul(probs.to(v.dtype), v).float(), lse


def prompt_attention(q, k, v, valid, scale: float):
    """q [R, W, Hq, D]; k, v [R, L, Hkv, D]; valid [R, L] bool -> out [R, W, Hq, D] f32, lse [R, W, Hq]."""
    r, w, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    # All beams and all query heads of one KV head form the rows of one matmul: [R, Hkv, W*G, D].
    qg = q.reshape(r, w, hkv, g, d).permute(0, 2, 1, 3, 4).reshape(r, hkv, w * g, d)
    kt = k.permute(0, 2, 3, 1)  # [R, Hkv, D, L]
    scores = torch.matmul(qg, kt).float() * scale  # [R, Hkv, W*G, L]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    out, lse = _partial(scores, v.permute(0, 2, 1, 3))  # [R, Hkv, W*G, D], [R, Hkv, W*G]
    out = out.reshape(r, hkv, w, g, d).permute(0, 2, 1, 3, 4).reshape(r, w, hq, d)
    lse = lse.reshape(r, hkv, w, g).permute(0, 2, 1, 3).reshape(r, w, hq)
    return out, lse


def suffix_attention(q, k, v, scale: float):
    """q [R, W, Hq, D]; k, v [R, W, J, Hkv, D] (each beam's own) -> out [R, W, Hq, D] f32, lse [R, W, Hq]."""
    r, w, hq, d = q.shape
    hkv = k.shape[3]
    g = hq // hkv
    qg = q.reshape(r, w, hkv, g, d)  # [R, W, Hkv, G, D]
    kt = k.permute(0, 1, 3, 4, 2)  # [R, W, Hkv, D, J]
    scores = torch.matmul(qg, kt).float() * scale  # [R, W, Hkv, G, J]
    out, lse = _partial(scores, v.permute(0, 1, 3, 2, 4))  # [R, W, Hkv, G, D]
    return out.reshape(r, w, hq, d), lse.reshape(r, w, hq)



def shared_prompt_attention(q, prompt_k, prompt_v, prompt_valid, suffix_k, suffix_v, scale: float):
    """Attention of beam queries over [prompt ; own suffix]. q [R, W, Hq, D] -> [R, W, Hq, D] (q's dtype)."""
    out_p, lse_p = prompt_attention(q, prompt_k, prompt_v, prompt_valid, scale)
    out_s, lse_s = suffix_attention(q, suffix_k, suffix_v, scale)
    return merge_partials(out_p, lse_p, out_s, lse_s).to(q.dtype)
