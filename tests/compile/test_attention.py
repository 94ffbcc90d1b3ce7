"""Attention over a key pool of segments (compile/attention.py), eager: the block mask and the
attention it gives, against references computed sample by sample; the layout's block padding."""

import random
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from compile.attention import KeyPool, eager_attention, packed_attention, pool_mask
from worker.runtime.layout import CPU_BLOCK, padded
from worker.runtime.layout import lay_out


def random_pool(seed: int, block: int):
    """A scoring-like key pool: static rows (maybe none) and their padding, then groups of a shared
    prefix (maybe empty, maybe over the static rows) and suffixes, then the filler to the block.
    Returns cu_seqlens, parents, num_cached, num_keys, and per sample its (ancestors..., own) segments."""
    rng = random.Random(seed)
    static = rng.choice([0, 5, block, block + 3])
    bounds, parents, samples = [0], [], []

    def segment(length, parent):
        bounds.append(bounds[-1] + length)
        parents.append(parent)
        return len(parents) - 1

    if static:
        segment(static, -1)
    if padded(static, block) > static:
        segment(padded(static, block) - static, -1)
    cached = bounds[-1]
    for _ in range(rng.randint(1, 4)):
        over = 0 if static and rng.random() < 0.5 else -1
        prefix = segment(rng.randint(1, 90), over) if rng.random() < 0.7 else over
        for _ in range(rng.randint(1, 4)):
            samples.append(segment(rng.randint(1, 70), prefix))
    tokens = bounds[-1] - cached
    if padded(tokens, block) > tokens:
        segment(padded(tokens, block) - tokens, -1)
    cu = torch.tensor(bounds, dtype=torch.int32)
    return cu, torch.tensor(parents), cached, bounds[-1], samples


def reference_attention(q, k, v, cu, parents, cached, samples):
    """Each sample's own segment attended causally over [its ancestors' keys, its own keys], by SDPA
    with an explicit mask: {own segment's first query row: output rows}."""
    bounds, parent = cu.tolist(), parents.tolist()
    out = {}
    for s in samples:
        chain = [s]
        while parent[chain[-1]] >= 0:
            chain.append(parent[chain[-1]])
        keys = torch.cat([torch.arange(bounds[a], bounds[a + 1]) for a in reversed(chain)])
        own = torch.arange(bounds[s], bounds[s + 1])
        ahead = len(keys) - len(own)
        allowed = torch.arange(len(keys))[None, :] <= ahead + torch.arange(len(own))[:, None]  # [L, Lk]
        qs, ks, vs = (x.transpose(0, 1)[None] for x in (q[own - cached], k[keys], v[keys]))
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=allowed, enable_gqa=True)
        out[bounds[s] - cached] = o[0].transpose(0, 1)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_segment_attention_equals_each_sample_alone(seed):
    block = CPU_BLOCK
    cu, parents, cached, num_keys, samples = random_pool(seed, block)
    num_queries = num_keys - cached
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(num_queries, 4, 16, generator=g)
    k, v = torch.randn(num_keys, 2, 16, generator=g), torch.randn(num_keys, 2, 16, generator=g)
    mask = pool_mask(KeyPool.fitting(num_keys, len(parents), block), cu, parents, num_queries, num_keys)
    out = packed_attention(q, k, v, mask)
    for row, expected in reference_attention(q, k, v, cu, parents, cached, samples).items():
        assert (out[row: row + len(expected)] - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_eager_attention_is_flex_attentions_reference_bit_for_bit(seed, dtype):
    """Outside a compile, packed_attention skips flex_attention's reference (its mask through nested vmaps in every
    layer) for the same computation with the mask broadcast once: the same bits, padding rows included."""
    cu, parents, cached, num_keys, _ = random_pool(200 + seed, CPU_BLOCK)
    num_queries = num_keys - cached
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, num_queries, 16, generator=g).to(dtype)
    k, v = (torch.randn(1, 2, num_keys, 16, generator=g).to(dtype) for _ in range(2))
    mask = pool_mask(KeyPool.fitting(num_keys, len(parents), CPU_BLOCK), cu, parents, num_queries, num_keys).block_mask
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        expected = flex_attention(q, k, v, block_mask=mask, enable_gqa=True)  # its unfused reference
    assert torch.equal(eager_attention(q, k, v, mask), expected)


def reference_blocks(cu, parents, num_queries, num_keys, block):
    """(partial, full) [NQ, NK] bool from create_block_mask, which evaluates every (query, key) pair."""
    bounds, parent = cu.tolist(), parents.tolist()
    segment = torch.searchsorted(cu[1:].long(), torch.arange(num_keys), right=True)
    start = cu.long()[segment.clamp(max=len(bounds) - 1)]
    up = torch.tensor(parent + [-1])
    grand = torch.where(up >= 0, up[up.clamp(min=0)], -1)
    offset = num_keys - num_queries

    def visible(b, h, qi, ki):
        qs = segment[qi + offset]
        own = (segment[ki] == qs) & (ki <= qi + offset) & (ki >= start[qi + offset])
        return own | (segment[ki] == up[qs]) | (segment[ki] == grand[qs])

    ref = create_block_mask(visible, None, None, num_queries, num_keys, device="cpu", BLOCK_SIZE=block)
    nq, nk = num_queries // block, num_keys // block

    def dense(num, idx):
        out = torch.zeros(nq, nk, dtype=torch.bool)
        for i in range(nq):
            out[i, idx[0, 0, i, : num[0, 0, i]].long()] = True
        return out

    return dense(ref.kv_num_blocks, ref.kv_indices), dense(ref.full_kv_num_blocks, ref.full_kv_indices)


@pytest.mark.parametrize("seed", range(6))
def test_block_classification_is_sound_against_create_block_mask(seed):
    """Every block the mask needs is read, a block marked full is full, a block skipped is empty
    (a block may be marked partial where it is full: only the mask is then evaluated for nothing)."""
    block = CPU_BLOCK
    cu, parents, cached, num_keys, _ = random_pool(100 + seed, block)
    num_queries = num_keys - cached
    mask = pool_mask(KeyPool.fitting(num_keys, len(parents), block), cu, parents, num_queries, num_keys).block_mask
    ref_partial, ref_full = reference_blocks(cu, parents, num_queries, num_keys, block)
    nq, nk = num_queries // block, num_keys // block
    partial = torch.zeros(nq, nk, dtype=torch.bool)
    full = torch.zeros(nq, nk, dtype=torch.bool)
    for i in range(nq):
        partial[i, mask.kv_indices[0, 0, i, : mask.kv_num_blocks[0, 0, i]].long()] = True
        full[i, mask.full_kv_indices[0, 0, i, : mask.full_kv_num_blocks[0, 0, i]].long()] = True
    assert torch.equal(partial | full, ref_partial | ref_full)  # the same blocks read, none skipped
    assert not (full & ~ref_full).any()  # nothing called full that is not
    assert not (partial & full).any()


def test_counts_that_are_not_block_multiples_are_refused():
    cu = torch.tensor([0, 70], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="not a multiple of 64"):
        pool_mask(KeyPool.fitting(70, 1, 64), cu, torch.tensor([-1]), 70, 70)


@pytest.mark.parametrize("static_len", [0, 3, 64])
def test_layout_pads_the_pool_to_the_block_with_segments_nobody_reads(static_len):
    rng = random.Random(static_len)
    static = torch.arange(100, 100 + static_len)
    for _ in range(20):
        lens = [rng.randint(1, 90) for _ in range(rng.randint(1, 6))]
        prefix = rng.choice([0, 5, 33])
        ids = torch.randint(0, 50, (prefix + sum(lens),))
        layout = lay_out(ids, lens, [prefix], [len(lens)], static, block=CPU_BLOCK)
        cu, parents = layout.cu_seqlens.tolist(), layout.parents.tolist()
        cached = padded(static_len, CPU_BLOCK)
        assert len(layout.input_ids) % CPU_BLOCK == 0 and cu[-1] == cached + len(layout.input_ids)
        assert cached in cu  # the cached rows' padding ends on a segment boundary
        padding = [s for s in range(len(parents)) if static_len <= cu[s] < cached]  # the cached rows' padding
        filler = len(parents) - 1 if prefix + sum(lens) < len(layout.input_ids) else None  # no static reuse here
        for s in padding + ([filler] if filler is not None else []):
            assert s not in parents  # never read by another segment
            assert (s in layout.sample_segments.tolist()) == (s == filler and len(lens) < 2)
