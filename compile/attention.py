"""Attention over a packed key pool of segments, compiled into the graph (FlexAttention, no Python op).

The key pool holds cached rows first (keys/values without queries: the deployment's static prefix),
then the batch's computed tokens, which are also the queries: query i is pool row i + (Tk - Tq). The
pool is cut into segments (cu_seqlens [S+1] over its rows); a segment may extend another (parents
[S], -1 for none; a parent comes before its child, two levels at most: the static prefix, then a
request's shared prefix). A query sees every key of its segment's ancestors and its own segment's
keys up to itself, so an unshared sample is a segment without parent: causal attention per sample.
Rows past cu_seqlens[-1] (the beam node's block padding) form one more segment of their own.

Once per forward, from the layout's tensors, `pool_mask` builds the block mask every layer uses:
    - a row table [6 * max_keys] int64: the key intervals [lo, hi) each query row sees — its own
      segment up to itself, its parent's and its grandparent's segments in full (empty: 0, 0).
      Fixed size (the compiled bound), one buffer. The mask compares a key's row number with the
      query's bounds, so it reads nothing per key (a table lookup per key was a scalar gather per
      lane in the CPU kernel, a large share of its time on the scoring mix);
    - each (query block, key block) pair classified empty, full (the mask is not evaluated) or
      partial from the same intervals: Tq x key blocks x 3 comparisons, where create_block_mask
      evaluates the mask on all Tq x Tk pairs (measured 0.5 ms against 17-90 ms at 4.3k tokens).
`packed_attention` then runs, on a CPU with AVX512-BF16, a C++ kernel of worker/runtime/kernels
(worker/runtime/kernels.attention_kernel): torch.ops.boundserve.packed_attention for float32, and for bfloat16
where the CPU has no AMX; torch.ops.boundserve.packed_attention_amx for bfloat16 where it has AMX (heads
a multiple of 32 wide). They read the row table themselves and never the block mask. Elsewhere it runs
one flex_attention call per layer. `PoolMask` carries both.

Outside a compile or an export (the build's int8 / fp8 calibration, its static prefix, tests),
flex_attention runs its unfused reference, which evaluates the mask through four nested vmaps in
every layer. `packed_attention` takes those calls itself: the same float32 scores, the same masking
and safe softmax, with the mask evaluated once per call by broadcasting the query and key row numbers
(pool_mask's mask reads only table lookups and comparisons, which broadcast). Same outputs, bit for
bit (tests/compile/test_attention.py). An eager 24-layer Qwen2.5-0.5B scoring pass of 992 tokens in
bfloat16 (the int8 layer selection runs ~100 of them) took 3.5 s instead of 7.4 s (2 threads, AMX machine).

Traps of FlexAttention inside an AOTInductor package (torch 2.13), and how this module avoids them:
    - the query and key counts must be multiples of the block, or rows are silently dropped: the
      layouts pad both (worker/runtime/layout.py, the beam node's inputs) and `pool_mask` refuses
      counts that are not;
    - q/k/v go in as 4-D contiguous tensors (3-D views fail lowering);
    - the tensors the mask reads must have a fixed size (dynamic ones fail to export or to build)
      and be one realized buffer (a lone index_select stays a Pointwise node and fails lowering);
    - the CPU kernel sizes its scratch buffers for the thread count it was compiled with: more
      threads at run time write past them (compile/build.py records the count, the runtime checks);
    - Inductor may fuse the kernel's consumer into the CPU template as an epilogue, which the
      template refuses at code generation ("Unsupported for epilogue_nodes"; seen with bf16): CPU
      packages are built with epilogue fusion off (compile/build.py; no other template runs there);
    - on a CPU without AMX the bfloat16 kernel leaves the fast path (no VNNI packing; its p·v
      product goes through cpublas' generic gemm per block), so there bfloat16 runs our own kernel
      (worker/runtime/kernels) where the CPU has AVX512-BF16, else the float32 kernel on upcast q/k/v
      (`kernel_dtype`);
    - its float32 kernel ran at 0.24 of the float32 peak in the Qwen2.5-0.5B scoring node (1.07 s of
      15.1 s; bench/profile_nodes.py, 2 threads, AMD EPYC with AVX512-BF16): float32 runs our kernel
      too where the CPU has AVX512-BF16.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from worker.runtime import kernels


@dataclass(frozen=True)
class KeyPool:
    """The static sizes a package's attention is compiled for (the row table is max_keys long)."""

    block: int  # rows per attention block; query and key counts are multiples of it
    max_keys: int  # the most pool rows of a call: cached rows + computed tokens, padded
    max_segments: int  # the most segments of a call (a table of parents is indexed by segment)

    @staticmethod
    def fitting(num_keys: int, num_segments: int, block: int) -> "KeyPool":
        """A pool just large enough for one call (eager use: nothing is compiled for it)."""
        return KeyPool(block, max(num_keys, 1), max(num_segments, 1))


@dataclass(frozen=True)
class PoolMask:
    """Which keys each query sees, once per forward for every layer: the row table (what the C++ kernel
    reads) and the block mask built from it (what FlexAttention reads; unused, it is never computed in
    a compiled graph)."""

    table: torch.Tensor  # [6 * max_keys] int64 (_interval_table)
    block_mask: BlockMask


def pool_mask(pool: KeyPool, cu_seqlens: torch.Tensor, parents: torch.Tensor, num_queries: int,
              num_keys: int) -> PoolMask:
    """The mask of one call: cu_seqlens [S+1] int over the pool's num_keys rows, parents [S] int64;
    queries are the pool's last num_queries rows. Both counts are multiples of pool.block."""
    torch._check(num_queries % pool.block == 0, lambda: f"{num_queries} queries: not a multiple of {pool.block}")
    torch._check(num_keys % pool.block == 0, lambda: f"{num_keys} keys: not a multiple of {pool.block}")
    table = _interval_table(pool, cu_seqlens, parents, num_queries, num_keys)
    partial, full = _classify_blocks(pool, table, num_queries, num_keys)
    m = pool.max_keys

    def visible(b, h, q_idx, kv_idx):
        own = (kv_idx >= table[q_idx]) & (kv_idx < table[m + q_idx])
        parent = (kv_idx >= table[2 * m + q_idx]) & (kv_idx < table[3 * m + q_idx])
        grandparent = (kv_idx >= table[4 * m + q_idx]) & (kv_idx < table[5 * m + q_idx])
        return own | parent | grandparent

    block_mask = BlockMask.from_kv_blocks(*_ordered(partial), *_ordered(full), BLOCK_SIZE=pool.block,
                                          mask_mod=visible, seq_lengths=(num_queries, num_keys))
    return PoolMask(table, block_mask)


def kernel_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype FlexAttention runs in: bfloat16 on a CPU without AMX runs its float32 kernel (where
    worker/runtime/kernels' bfloat16 kernel does not apply)."""
    if dtype == torch.bfloat16 and device.type == "cpu" and not torch.cpu._is_amx_tile_supported():
        return torch.float32
    return dtype


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: PoolMask) -> torch.Tensor:
    """q [Tq, Hq, D], k/v [Tk, Hkv, D] (Hq a multiple of Hkv) -> [Tq, Hq, D] in q's dtype."""
    compiled = torch.compiler.is_compiling() or torch.compiler.is_exporting()
    operator = kernels.attention_kernel(q.dtype, q.device, q.shape[-1]) if compiled else None
    if operator is not None:
        kernels.build_library()  # the operator must exist to be traced
        return getattr(torch.ops.boundserve, operator)(q.contiguous(), k.contiguous(), v.contiguous(), mask.table)
    dtype = kernel_dtype(q.dtype, q.device)
    # [1, H, T, D], each its own 4-D buffer: the cast comes last (cast first, Inductor kept the cast's
    # 3-D buffer under a 4-D view, which the CPU template cannot lower)
    heads_first = [t.transpose(0, 1)[None].contiguous().to(dtype) for t in (q, k, v)]
    if compiled:
        out = flex_attention(*heads_first, block_mask=mask.block_mask,
                             enable_gqa=q.shape[1] != k.shape[1])  # [1, Hq, Tq, D]
    else:
        out = eager_attention(*heads_first, mask.block_mask)
    return out[0].transpose(0, 1).to(q.dtype)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: BlockMask) -> torch.Tensor:
    """flex_attention's unfused reference for a mask_mod that broadcasts: q [1, Hq, Tq, D], k/v [1, Hkv, Tk, D]
    -> [1, Hq, Tq, D]. The same steps: float32 scores scaled by 1/sqrt(D), -inf where the mask_mod says no (the
    reference, like this, ignores the block tables), safe softmax (a query that sees no key gets zeros), the
    probabilities back in q's dtype times v."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    rows = torch.arange(q.shape[2], device=q.device)[:, None]
    keys = torch.arange(k.shape[2], device=q.device)[None, :]
    visible = mask.mask_mod(0, 0, rows, keys)  # [Tq, Tk]
    scores = (q.float() @ k.float().transpose(-2, -1)).mul_(q.shape[-1] ** -0.5)  # in place: [Hq, Tq, Tk] floats
    scores.masked_fill_(~visible, -float("inf"))
    return torch._safe_softmax(scores, dim=-1).to(q.dtype) @ v.to(q.dtype)


def _interval_table(pool: KeyPool, cu_seqlens, parents, num_queries: int, num_keys: int) -> torch.Tensor:
    """[6 * max_keys] int64, field-major: for query row i (pool row i + Tk - Tq) the key rows
    [lo, hi) of its own segment up to itself, of its parent segment, of its grandparent segment
    (0, 0 where there is none). Rows past the queries hold garbage nobody reads."""
    device = cu_seqlens.device
    starts = cu_seqlens.to(torch.int64)  # [S+1]
    ends = torch.cat([starts[1:], starts.new_full((1,), pool.max_keys)])  # [S+1]; segment S runs to the end
    row = torch.arange(pool.max_keys, device=device) + (num_keys - num_queries)  # pool row of each query
    segment = torch.searchsorted(starts[1:], row, right=True).clamp(max=starts.shape[0] - 1)  # rows past: S
    parent = torch.full((pool.max_segments + 1,), -1, dtype=torch.int64, device=device)
    parent = parent.index_copy(0, torch.arange(parents.shape[0], device=device), parents.to(torch.int64))
    grandparent = torch.where(parent >= 0, parent.index_select(0, parent.clamp(min=0)), -1)
    fields = [starts.index_select(0, segment), row + 1]
    for ancestor in (parent.index_select(0, segment), grandparent.index_select(0, segment)):
        known = ancestor >= 0
        fields += [torch.where(known, starts.index_select(0, ancestor.clamp(min=0)), 0),
                   torch.where(known, ends.index_select(0, ancestor.clamp(min=0)), 0)]
    return torch.stack(fields).reshape(-1)  # one buffer, realized before the kernel reads it


def _classify_blocks(pool: KeyPool, table, num_queries: int, num_keys: int):
    """(partial, full) [Tq/block, Tk/block] bool from each query row's three key intervals: a block
    is read when an interval touches it, and full when one interval covers it."""
    m, block = pool.max_keys, pool.block
    lo = torch.stack([table[f * m: f * m + num_queries] for f in (0, 2, 4)], -1)[:, None, :]  # [Tq, 1, 3]
    hi = torch.stack([table[f * m: f * m + num_queries] for f in (1, 3, 5)], -1)[:, None, :]
    key_start = (torch.arange(num_keys // block, device=table.device) * block)[None, :, None]  # [1, NK, 1]
    touches = ((lo < key_start + block) & (hi > key_start)).any(-1)  # [Tq, NK]
    covers = ((lo <= key_start) & (hi >= key_start + block)).any(-1)
    touched = touches.view(num_queries // block, block, -1).any(1)  # [NQ, NK]
    full = covers.view(num_queries // block, block, -1).all(1)
    return touched & ~full, full


def _ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[NQ, NK] bool -> count [1, 1, NQ] int32 and key-block indices [1, 1, NQ, NK] int32, the
    chosen blocks first (BlockMask's layout)."""
    count = blocks.sum(-1, dtype=torch.int32)
    order = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return count[None, None], order[None, None]
