"""A tokenized scoring request as batch-sized chunks, with the prefix its samples share (pure).

Sharing is automatic and exact: the split is made on the token ids that would be computed anyway.
A request with two or more samples whose longest common token prefix is at least
`[score] min_shared_prefix_tokens` long (and at most `bounds.max_prefix_tokens`) is sent as that
prefix, computed once, plus one suffix per sample; otherwise every sample goes whole. A prefix
longer than its bound is never cut: the request goes unshared. What each chunk then sends and
computes is its WorkSize's to say (shared/work.py; gateway/job.py holds it).
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.prefix import SharingRule, longest_common_prefix
from shared.work import WorkSize


def shared_prefix_len(samples: Sequence[Sequence[int]], rule: SharingRule) -> int:
    """Tokens the samples will share (0: sent unshared), by `rule` on their longest common prefix."""
    return rule.prefix_len(longest_common_prefix(samples) if len(samples) >= 2 else 0, len(samples))


def chunks(samples: list[list[int]], prefix_len: int, max_samples_per_batch: int, max_tokens_per_batch: int) -> list[list[list[int]]]:
    """The samples in order, cut into batch-sized chunks by WorkSize.chunk_bounds (the simulator
    cuts with the same function); a single sample always fits (at most max_tokens_per_sample)."""
    work = WorkSize.of(samples, prefix_len)
    return [samples[start:end] for start, end in work.chunk_bounds(max_samples_per_batch, max_tokens_per_batch)]
