"""A tokenized scoring request as batch-sized chunks, with the prefix its samples share (pure).

Sharing is automatic and exact: the split is made on the token ids that would be computed anyway.
A request with two or more samples whose longest common token prefix is at least
`[score] min_shared_prefix_tokens` long (and at most `bounds.max_prefix_tokens`) is sent as that
prefix, computed once, plus one suffix per sample; otherwise every sample goes whole. A prefix
longer than its bound is never cut: the request goes unshared. Cost is counted as the worker
computes it (shared.latency_model.computed_tokens): the prefix once per chunk, and none of the
deployment's static prefix wherever the prefix (or, unshared, a sample) starts with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.latency_model import shared_static_len
from shared.prefix import longest_common_prefix, static_prefix_len


def shared_prefix_len(samples: Sequence[Sequence[int]], min_tokens: int, max_tokens: int) -> int:
    """Tokens the samples will share (0: sent unshared): their common prefix when there are two or
    more samples and it is within [min_tokens, max_tokens]."""
    if len(samples) < 2:
        return 0
    length = longest_common_prefix(samples)
    return length if min_tokens <= length <= max_tokens else 0


def prefix_cost(samples: Sequence[Sequence[int]], prefix_len: int, static_ids: Sequence[int]) -> int:
    """Computed tokens of the shared prefix itself (once per chunk; 0 when nothing is shared). For a
    chunk of some of `samples` this is an upper bound (a sample equal to the prefix may cost the
    static prefix's reuse for all; without it, a chunk may reuse it)."""
    if not prefix_len:
        return 0
    every_sample_goes_on = all(len(s) > prefix_len for s in samples)
    return prefix_len - shared_static_len(samples[0][:prefix_len], static_ids, every_sample_goes_on)


def sample_cost(sample: Sequence[int], prefix_len: int, static_ids: Sequence[int]) -> int:
    """Computed tokens of one sample beyond the shared prefix (its suffix; or the whole sample less
    the static prefix when nothing is shared)."""
    if prefix_len:
        return len(sample) - prefix_len
    return len(sample) - static_prefix_len(sample, static_ids)


def computed_tokens(samples: Sequence[Sequence[int]], prefix_len: int, static_ids: Sequence[int]) -> int:
    """Tokens the worker computes for these whole samples sent with `prefix_len` shared."""
    return prefix_cost(samples, prefix_len, static_ids) + sum(sample_cost(s, prefix_len, static_ids) for s in samples)


def chunks(samples: list[list[int]], prefix_len: int, static_ids: Sequence[int], max_samples: int,
           max_tokens: int) -> list[list[list[int]]]:
    """The samples in order, cut greedily into chunks of at most `max_samples` samples and
    `max_tokens` computed tokens; every chunk carries the shared prefix again (counted once in it).
    A single sample always fits (its computed tokens are at most its length, within the sample bound)."""
    base = prefix_cost(samples, prefix_len, static_ids)
    out: list[list[list[int]]] = [[]]
    tokens = base
    for sample in samples:
        cost = sample_cost(sample, prefix_len, static_ids)
        if out[-1] and (len(out[-1]) == max_samples or tokens + cost > max_tokens):
            out.append([])
            tokens = base
        out[-1].append(sample)
        tokens += cost
    return out
