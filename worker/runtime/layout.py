"""Host-side layout of a scoring batch into segments: which tokens are computed, once, and what each reads.

A batch is a list of groups (one per request): a shared prefix (possibly empty) followed by the
suffixes of the group's samples; sample i of a group is prefix + suffix i. The node computes
    - each group's prefix once, as a segment of its own,
    - each non-empty suffix as a segment extending that prefix (positions continue after it),
    - the deployment's static prefix not at all: its keys/values are cached in the package
      (segment 0 of the key pool) and a prefix, or an unshared sample, extends it when its ids really
      start with the static ids and go on after them,
    - a group's prefix, or its leading part, not at all when the caller holds its keys/values from an
      earlier request (a hit of the worker's prefix cache): those rows follow the static prefix's in
      the key pool, one root segment per hit, and the group's rest of the prefix extends it.
A sample whose suffix is empty ends in its group's prefix segment. Results are those of the full
samples: only where keys/values come from changes, never which tokens are attended to.

Both parts of the key pool are padded to the attention block (compile/attention.py: a count that
is not a multiple would be silently truncated): the cached rows by a segment nobody reads (its
keys/values are computed with the static ones and stored padded), the computed tokens by a filler
segment at the end, which is also a sample when the batch has fewer than the 2 the package is
compiled for. Segments with a parent read the cached rows; nothing reads the filler.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shared.work import NO_REUSE, StaticPrefix, WorkSize


# Rows per block on a CPU: the masked waste of partial blocks shrinks with the block, the per-block
# overhead grows. On the scoring mix 32 was faster than 64 and 128, and than 16 on Qwen2.5's shapes. On a
# CPU with AMX, where the bfloat16 kernel multiplies blocks on AMX tiles, 64 was no faster than 32 within
# the machine's noise (bench/node_ab.py; docs/benchmarks.md, "A/B runs of the node"), so one block for
# every CPU.
CPU_BLOCK = 32
GPU_BLOCK = 128  # FlexAttention's own default on CUDA: the Triton kernel's tiles divide it


def block_for(device: str) -> int:
    """Rows per attention block for packages built for `device`."""
    return CPU_BLOCK if device.split(":")[0] == "cpu" else GPU_BLOCK


def padded(rows: int, block: int) -> int:
    """rows rounded up to a multiple of the block."""
    return -(-rows // block) * block


@dataclass(frozen=True)
class Layout:
    """The scoring node's segment inputs for one batch (T computed tokens, S segments, B samples)."""

    input_ids: torch.Tensor  # [T] int64, the computed tokens of every segment, in segment order
    positions: torch.Tensor  # [T] int64, positions in the full sample (after any prefix)
    cu_seqlens: torch.Tensor  # [S+1] int32 over the key pool: cached static rows first, then the T tokens
    parents: torch.Tensor  # [S] int64, the segment each extends, -1 for none
    sample_segments: torch.Tensor  # [B] int64, the segment holding each sample's last token
    cached_tokens: list[int]  # per group: submitted tokens whose keys/values were reused, not computed
    num_samples: int  # B before any filler
    hit_rows: int = 0  # key-pool rows of the hits after the static prefix's: their tokens, padded to the block
    prefix_rows: list[tuple[tuple[int, int], ...]] = ()  # per group: (first pool row, count) runs of its prefix's rows

    def rows_of_prefix(self, group: int) -> torch.Tensor:
        """The key-pool rows [P] holding group `group`'s prefix tokens in order (reused or computed)."""
        return torch.cat([torch.arange(start, start + count) for start, count in self.prefix_rows[group]]
                         or [torch.zeros(0, dtype=torch.int64)])


class _Builder:
    """Appends segments to the key pool, remembering where each one's tokens and positions go."""

    def __init__(self, static_len: int, block: int, hit_lens: list[int], min_hit_rows: int = 0) -> None:
        self.ids: list[torch.Tensor] = []
        self.positions: list[torch.Tensor] = []
        self.bounds, self.parents = [0], []
        if static_len:
            self.rows(static_len)  # segment 0: the static prefix, when there is one
        self.rows(padded(static_len, block) - static_len)  # the static rows' padding: a segment nobody reads
        static_rows = self.bounds[-1]
        self.hit_segments = [self.rows(n) if n else -1 for n in hit_lens]  # root segments of cached rows
        self.hit_rows = max(padded(self.bounds[-1] - static_rows, block), min_hit_rows)
        self.rows(static_rows + self.hit_rows - self.bounds[-1])  # the hits' padding, read by nobody
        self.sample_segments: list[int] = []
        self.prefix_rows: list[tuple[tuple[int, int], ...]] = []
        self.block = block

    def rows(self, count: int) -> int:
        """A root segment of `count` cached rows (none when count is 0); returns its index."""
        if count:
            self.bounds.append(self.bounds[-1] + count)
            self.parents.append(-1)
        return len(self.parents) - 1

    def segment(self, ids: torch.Tensor, start: int, parent: int) -> int:
        self.ids.append(ids)
        self.positions.append(torch.arange(start, start + len(ids), dtype=torch.int64))
        self.bounds.append(self.bounds[-1] + len(ids))
        self.parents.append(parent)
        return len(self.parents) - 1


def lay_out(input_ids: torch.Tensor, sample_lens: list[int], prefix_lens: list[int], group_sizes: list[int],
            static_ids: torch.Tensor, block: int = CPU_BLOCK, hits: list[int] | None = None,
            min_hit_rows: int = 0, computed_groups: frozenset[int] = frozenset()) -> Layout:
    """Lay out groups of (prefix, suffixes) over the static prefix `static_ids` [C] (may be empty),
    padded to the attention block of the package (the manifest's `attention_block`).

    hits[r] (default 0): leading tokens of group r's prefix whose keys/values the caller passes as
    cached rows after the static prefix's (in group order, Layout.hit_rows in all); a hit covers the
    whole prefix only when every sample of the group goes on after it (its last token is computed).
    min_hit_rows: the fewest hit rows laid out (a package compiled with hit inputs always takes at
    least a block of them; rows beyond the hits' are a segment nobody reads).
    computed_groups: groups whose every token is computed, the static prefix not reused (per-token
    log-probs need each token's own hidden state); they take no hit.

    input_ids [sum(prefix_lens) + sum(sample_lens)]: per group its prefix ids, then its suffixes.
    The caller has checked the sizes (ScoreNode.check); this only arranges them.
    """
    static = StaticPrefix(tuple(static_ids.tolist()))
    hits = hits or [0] * len(prefix_lens)
    if any(hits[g] for g in computed_groups):
        raise ValueError("a group whose every token is computed cannot read a prefix-cache hit")
    builder, cached, cursor, sample = _Builder(len(static.ids), block, hits, min_hit_rows), [], 0, 0
    for group, (prefix_len, size) in enumerate(zip(prefix_lens, group_sizes)):
        prefix = input_ids[cursor: cursor + prefix_len]
        suffix_lens = sample_lens[sample: sample + size]
        suffixes = input_ids[cursor + prefix_len: cursor + prefix_len + sum(suffix_lens)].split(suffix_lens)
        cursor, sample = cursor + prefix_len + sum(suffix_lens), sample + size
        if hits[group]:
            reused = _hit_group(builder, prefix, suffixes, hits[group], builder.hit_segments[group])
        elif prefix_len:
            reused = _shared_group(builder, prefix, suffixes, NO_REUSE if group in computed_groups else static)
        else:
            reused = 0
            builder.prefix_rows.append(())
            for ids in suffixes:
                reuse = 0 if group in computed_groups else _extends_static(ids, static)
                builder.sample_segments.append(builder.segment(ids[reuse:], reuse, 0 if reuse else -1))
                reused += reuse
        cached.append(WorkSize(prefix_len, tuple(suffix_lens), reused).cached_tokens)
    return _finish(builder, cached, len(sample_lens))


def _shared_group(builder: _Builder, prefix: torch.Tensor, suffixes, static: StaticPrefix) -> int:
    """One segment for the prefix (over the static prefix when it starts with it), one per suffix;
    returns the prefix's tokens reused."""
    # (the first n + 1 ids say all the rule needs: whether the prefix starts with and goes on after them)
    reuse = static.reused(prefix[: len(static.ids) + 1].tolist(), all(len(s) for s in suffixes))
    _extend_prefix(builder, prefix, suffixes, reuse, 0)
    return reuse


def _hit_group(builder: _Builder, prefix: torch.Tensor, suffixes, hit: int, hit_segment: int) -> int:
    """The prefix's first `hit` tokens read from the cached rows of `hit_segment`, the rest computed."""
    if not 0 < hit <= len(prefix) or (hit == len(prefix) and not all(len(s) for s in suffixes)):
        raise ValueError(f"a hit of {hit} tokens on a prefix of {len(prefix)} must leave every sample's "
                         "last token to compute")
    _extend_prefix(builder, prefix, suffixes, hit, hit_segment)
    return hit


def _extend_prefix(builder: _Builder, prefix: torch.Tensor, suffixes, reuse: int, reused_segment: int) -> None:
    """The prefix's tokens after its first `reuse` (whose rows are `reused_segment`'s) as a segment,
    then one segment per non-empty suffix extending it."""
    runs = [(builder.bounds[reused_segment], reuse)] if reuse else []
    if reuse == len(prefix):
        prefix_segment = reused_segment  # every sample goes on after it
    else:
        prefix_segment = builder.segment(prefix[reuse:], reuse, reused_segment if reuse else -1)
        runs.append((builder.bounds[prefix_segment], len(prefix) - reuse))
    builder.prefix_rows.append(tuple(runs))
    for ids in suffixes:
        if len(ids):
            builder.sample_segments.append(builder.segment(ids, len(prefix), prefix_segment))
        else:
            builder.sample_segments.append(prefix_segment)  # the sample is the prefix itself


def _extends_static(ids: torch.Tensor, static: StaticPrefix) -> int:
    """len(static.ids) when ids start with them and go on after them, else 0 (checked per sample)."""
    n = len(static.ids)
    return static.reused(ids[: n + 1].tolist(), False) if n else 0


def _finish(builder: _Builder, cached: list[int], num_samples: int) -> Layout:
    tokens = sum(len(ids) for ids in builder.ids)
    filler = padded(tokens, builder.block) - tokens
    if num_samples < 2 and not filler:
        filler = builder.block  # the package is compiled for >= 2 samples: the filler is the second
    if filler:
        segment = builder.segment(torch.zeros(filler, dtype=torch.int64), 0, -1)
        if num_samples < 2:
            builder.sample_segments.append(segment)
    return Layout(
        input_ids=torch.cat(builder.ids).long(),
        positions=torch.cat(builder.positions),
        cu_seqlens=torch.tensor(builder.bounds, dtype=torch.int32),
        parents=torch.tensor(builder.parents, dtype=torch.int64),
        sample_segments=torch.tensor(builder.sample_segments, dtype=torch.int64),
        cached_tokens=cached,
        num_samples=num_samples,
        hit_rows=builder.hit_rows,
        prefix_rows=builder.prefix_rows,
    )
