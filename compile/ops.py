"""Custom operators compiled into the packages as calls (import this module before loading one).

`boundserve::varlen_attention` is causal attention over packed variable-length sequences: each
sample attends only to itself, so its cost is Σ Lᵢ², never (Σ Lᵢ)², and no padding is computed.

`boundserve::prefix_attention` generalises it to segments that extend other segments: a shared
prefix is one segment, and each sample's suffix is a segment whose tokens attend to every key of
their ancestors (the prefix, and the deployment's static prefix above it) plus their own tokens
causally. The two kinds of key are two partial softmaxes merged by their log-sum-exp (as the beam
node's shared-prompt attention does), so a prefix's keys/values are read in place by all the
samples that extend it, never copied per sample.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.nn.functional as F

from compile.beam.attention import merge


@torch.library.custom_op("boundserve::varlen_attention", mutates_args=())
def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Causal attention per packed sample. q [T, Hq, D], k/v [T, Hkv, D], cu_seqlens int [B+1] -> [T, Hq, D]."""
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            out[start:end] = _causal(q[start:end], k[start:end], v[start:end])
    return out


@varlen_attention.register_fake
def _(q, k, v, cu_seqlens):
    return torch.empty_like(q)


@torch.library.custom_op("boundserve::prefix_attention", mutates_args=())
def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     parents: torch.Tensor) -> torch.Tensor:
    """Attention over segments that extend other segments.

    k/v [Tk, Hkv, D]: the key pool, segment s holding rows cu_seqlens[s]:cu_seqlens[s+1] (int [S+1]).
    q [Tq, Hq, D]: queries of the pool's last Tq rows (the first Tk - Tq rows are cached keys, e.g. a
    static prefix, with no query). parents [S] int64: the segment each one extends, or -1; a parent
    comes before its child. A query sees all keys of its segment's ancestors and its own segment's
    keys up to itself. Returns [Tq, Hq, D].
    """
    out = torch.empty_like(q)
    bounds, parent = cu_seqlens.tolist(), parents.tolist()
    offset = k.shape[0] - q.shape[0]
    own: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    readers: dict[int, list[int]] = defaultdict(list)  # ancestor segment -> segments that read it
    for s in range(len(parent)):
        start, end = bounds[s], bounds[s + 1]
        if end <= max(start, offset):
            continue  # empty, or cached rows without queries
        rows = slice(start - offset, end - offset)
        if parent[s] < 0:
            out[rows] = _causal(q[rows], k[start:end], v[start:end])
            continue
        own[s] = _attend_lse(q[rows], k[start:end], v[start:end], causal=True)
        a = parent[s]
        while a >= 0:
            readers[a].append(s)
            a = parent[a]
    for a, segments in readers.items():
        # Every query that reads ancestor `a`, all samples at once: one attention, no mask.
        queries = torch.cat([q[bounds[s] - offset: bounds[s + 1] - offset] for s in segments])
        o, lse = _attend_lse(queries, k[bounds[a]: bounds[a + 1]], v[bounds[a]: bounds[a + 1]], causal=False)
        sizes = [bounds[s + 1] - bounds[s] for s in segments]
        for s, o_s, lse_s in zip(segments, o.split(sizes), lse.split(sizes)):
            o_own, lse_own = own[s]
            own[s] = (merge(o_own, lse_own, o_s, lse_s), torch.logaddexp(lse_own, lse_s))
    for s, (o, _) in own.items():
        out[bounds[s] - offset: bounds[s + 1] - offset] = o.to(q.dtype)
    return out


@prefix_attention.register_fake
def _(q, k, v, cu_seqlens, parents):
    return torch.empty_like(q)


def _causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal SDPA of one segment: q [L, Hq, D], k/v [L, Hkv, D] -> [L, Hq, D] (the fused kernel)."""
    group = q.shape[1] // k.shape[1]
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       is_causal=True, enable_gqa=group > 1)
    return o[0].transpose(0, 1)


def _attend_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial attention with its log-sum-exp: q [N, Hq, D], k/v [L, Hkv, D] -> out [N, Hq, D] float32,
    lse [N, Hq] float32. causal: N == L and query i sees keys 0..i (a segment's own keys)."""
    n, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    if causal:  # queries keep their own rows; GQA by repeating this short segment's keys
        qh, kh, vh = q.transpose(0, 1), k.repeat_interleave(g, 1).transpose(0, 1), v.repeat_interleave(g, 1).transpose(0, 1)
    else:  # no mask: the G query heads of a KV head become rows of one matrix, keys read in place
        qh = q.view(n, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * n, d)
        kh, vh = k.transpose(0, 1), v.transpose(0, 1)
    if q.device.type == "cpu":
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(qh[None], kh[None], vh[None], 0.0, causal)[:2]
        o, lse = o[0].float(), lse[0].float()
    else:
        o, lse = _math_attention(qh, kh, vh, causal)
    if causal:
        return o.transpose(0, 1), lse.transpose(0, 1)
    return (o.reshape(hkv, g, n, d).permute(2, 0, 1, 3).reshape(n, hq, d),
            lse.reshape(hkv, g, n).permute(2, 0, 1).reshape(n, hq))


def _math_attention(q, k, v, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference partial attention in float32: q [H, N, D], k/v [H, L, D] -> out [H, N, D], lse [H, N]."""
    scores = torch.matmul(q.float(), k.float().transpose(1, 2)) * q.shape[-1] ** -0.5  # [H, N, L]
    if causal:
        n, length = scores.shape[1:]
        scores = scores.masked_fill(torch.ones(n, length, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), v.float()), lse
