"""A tokenized scoring request as batch-sized chunks, with the prefix its samples share (pure).

Sharing is automatic and exact: the split is made on the token ids that would be computed anyway.
A request with two or more samples whose longest common token prefix is at least
`[score] min_shared_prefix_tokens` long (and at most `bounds.max_prefix_tokens`) is sent as that
prefix, computed once, plus one suffix per sample; otherwise every sample goes whole. A prefix
longer than its bound is never cut: the request goes unshared. Batch bounds and budgets count the
tokens sent (the prefix once per chunk, then the suffixes), as the compiled node's bound does;
latency predictions count the tokens computed, which also leave out the deployment's static
prefix wherever the node reuses it.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.policy import chunk_bounds
from shared.prefix import computed_tokens as request_computed_tokens
from shared.prefix import longest_common_prefix


def shared_prefix_len(samples: Sequence[Sequence[int]], min_tokens: int, max_tokens: int) -> int:
    """Tokens the samples will share (0: sent unshared): their common prefix when there are two or
    more samples and it is within [min_tokens, max_tokens]."""
    if len(samples) < 2:
        return 0
    length = longest_common_prefix(samples)
    return length if min_tokens <= length <= max_tokens else 0


def sent_tokens(samples: Sequence[Sequence[int]], prefix_len: int) -> int:
    """Token ids these whole samples take on the wire with `prefix_len` shared: the prefix once,
    then each suffix. The compiled batch bound (max_tokens_per_batch) counts these."""
    return prefix_len + sum(len(s) - prefix_len for s in samples)


def computed_tokens(samples: Sequence[Sequence[int]], prefix_len: int, static_ids: Sequence[int]) -> int:
    """Tokens the node computes for these whole samples with `prefix_len` shared: sent tokens less
    the static prefix's, where the node reuses it (shared.prefix.computed_tokens)."""
    return request_computed_tokens(samples[0][:prefix_len] if prefix_len else [],
                                   [s[prefix_len:] for s in samples], static_ids)


def chunks(samples: list[list[int]], prefix_len: int, max_samples: int, max_tokens: int) -> list[list[list[int]]]:
    """The samples in order, cut greedily into chunks of at most `max_samples` samples and
    `max_tokens` sent tokens; every chunk carries the shared prefix again (counted once in it), so
    its suffixes get what the prefix leaves of the budget. The cut is the policy's (the simulator
    chunks with the same function); a single sample always fits (at most max_tokens_per_sample)."""
    suffixes = [len(sample) - prefix_len for sample in samples]
    return [samples[start:end] for start, end in chunk_bounds(suffixes, max_samples, max_tokens - prefix_len)]
