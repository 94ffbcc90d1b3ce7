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

import itertools
from collections import defaultdict

import torch
import torch.nn.functional as F



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
    from compile.model import merge_partials  # the model core imports this module

    out = torch.empty_like(q)
    bounds, parent = cu_seqlens.tolist(), parents.tolist()
    offset = k.shape[0] - q.shape[0]
    extending = []  # segments with queries that extend another, in pool order
    for s in range(len(parent)):
        start, end = bounds[s], bounds[s + 1]
        if end <= max(start, offset):
            continue  # empty, or cached rows without queries
        if parent[s] < 0:
            out[start - offset: end - offset] = _causal(q[start - offset: end - offset], k[start:end], v[start:end])
        else:
            extending.append(s)
    if not extending:
        return out
    spans = [(bounds[s], bounds[s + 1]) for s in extending]
    rows = torch.cat([torch.arange(a - offset, b - offset) for a, b in spans]).to(q.device)  # their query rows
    queries = q.index_select(0, rows)  # [N, Hq, D]
    o, lse = _own_causal(queries, k, v, spans)  # all of them, their own keys, in a few padded batches
    first = [0, *itertools.accumulate(b - a for a, b in spans)]  # each segment's first row in `queries`
    readers: dict[int, list[int]] = defaultdict(list)  # ancestor segment -> segments (indices) that read it
    for i, s in enumerate(extending):
        a = parent[s]
        while a >= 0:
            readers[a].append(i)
            a = parent[a]
    for a, members in readers.items():
        # Every query that reads ancestor `a`, all samples at once: one attention, no mask.
        mine = torch.cat([torch.arange(first[i], first[i + 1]) for i in members]).to(q.device)
        o_a, lse_a = _attend_full(queries.index_select(0, mine), k[bounds[a]: bounds[a + 1]],
                                  v[bounds[a]: bounds[a + 1]])
        o_mine, lse_mine = o.index_select(0, mine), lse.index_select(0, mine)
        o[mine], lse[mine] = merge_partials(o_mine, lse_mine, o_a, lse_a), torch.logaddexp(lse_mine, lse_a)
    out[rows] = o.to(q.dtype)
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


# Score elements (segments x heads x L x L) one padded own-keys batch may hold: 16M floats = 64 MB.
_OWN_BATCH_ELEMENTS = 1 << 24


def _own_causal(queries: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                spans: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each segment's queries against its own keys, causally, with the log-sum-exp: queries [N, Hq, D]
    (the segments' rows, in order), k/v [Tk, Hkv, D] the pool, spans [(start, end)] pool rows ->
    out [N, Hq, D] float32, lse [N, Hq] float32. Segments are short suffixes, so they run together,
    padded to the longest of a batch, instead of one small kernel call each."""
    hq = queries.shape[1]
    outs, lses, begin, row = [], [], 0, 0
    while begin < len(spans):
        end, longest = begin, 0
        while end < len(spans):
            longest_next = max(longest, spans[end][1] - spans[end][0])
            if end > begin and (end - begin + 1) * hq * longest_next ** 2 > _OWN_BATCH_ELEMENTS:
                break
            end, longest = end + 1, longest_next
        count = sum(b - a for a, b in spans[begin:end])
        o, lse = _own_causal_padded(queries[row: row + count], k, v, spans[begin:end], longest)
        outs.append(o)
        lses.append(lse)
        begin, row = end, row + count
    return torch.cat(outs), torch.cat(lses)


def _own_causal_padded(queries, k, v, spans, longest: int):
    """One padded batch of _own_causal: S segments of at most `longest` rows."""
    n, hq, d = queries.shape
    hkv = k.shape[1]
    lens = torch.tensor([b - a for a, b in spans])
    steps = torch.arange(longest)
    valid = steps[None, :] < lens[:, None]  # [S, L]
    starts = torch.tensor([a for a, _ in spans])
    firsts = torch.cumsum(lens, 0) - lens
    key_rows = torch.where(valid, starts[:, None] + steps, 0).to(k.device)  # [S, L] pool rows (pad: 0)
    query_rows = torch.where(valid, firsts[:, None] + steps, 0).to(k.device)  # [S, L] rows of `queries`
    s = len(spans)
    qg = queries[query_rows].view(s, longest, hkv, hq // hkv, d)
    qg = qg.permute(0, 2, 3, 1, 4).float()  # [S, Hkv, G, L, D]
    kt = k[key_rows].permute(0, 2, 3, 1)[:, :, None].float()  # [S, Hkv, 1, D, L]
    vv = v[key_rows].permute(0, 2, 1, 3)[:, :, None].float()  # [S, Hkv, 1, L, D]
    scores = torch.matmul(qg, kt) * d ** -0.5  # [S, Hkv, G, L, L]
    # [S, L(query), L(key)]: causal, and real keys only
    allowed = (steps[None, :] <= steps[:, None])[None] & valid[:, None, :]
    scores = scores.masked_fill(~allowed.to(k.device)[:, None, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [S, Hkv, G, L]
    o = torch.matmul(torch.exp(scores - lse[..., None]), vv)  # [S, Hkv, G, L, D]
    keep = valid.to(k.device)
    return (o.permute(0, 3, 1, 2, 4).reshape(s, longest, hq, d)[keep],
            lse.permute(0, 3, 1, 2).reshape(s, longest, hq)[keep])


def _attend_full(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries against every key (an ancestor's: no mask), with the log-sum-exp, in float32:
    q [N, Hq, D], k/v [L, Hkv, D] -> out [N, Hq, D], lse [N, Hq]. The G query heads of a KV head
    become rows of one matrix, so the keys are read in place (no copy per head or per sample)."""
    n, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    qh = q.view(n, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * n, d).float()  # [Hkv, G*N, D]
    scores = torch.matmul(qh, k.permute(1, 2, 0).float()) * d ** -0.5  # [Hkv, G*N, L]
    lse = torch.logsumexp(scores, dim=-1)
    o = torch.matmul(torch.exp(scores - lse[..., None]), v.transpose(0, 1).float())  # [Hkv, G*N, D]
    return (o.reshape(hkv, g, n, d).permute(2, 0, 1, 3).reshape(n, hq, d),
            lse.reshape(hkv, g, n).permute(2, 0, 1).reshape(n, hq))
