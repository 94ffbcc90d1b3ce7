"""The deadline-ordered queue of one workload and what it reads of a queued job (pure: no I/O, no clock)."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar


class Work(Protocol):
    """What the policy reads of a queued job (gateway/job.py's Job; the simulator's jobs)."""

    deadline: float
    samples: int
    tokens: int
    """Tokens sent for this job: a shared prefix once, then the suffixes (the queue budget and the
    compiled batch bound count these; latency_tokens are the ones computed)."""
    batch_items: int
    latency_tokens: int
    label_ids: tuple[int, ...]
    beam_key: tuple[int, int, int] | None


W = TypeVar("W", bound=Work)


class DeadlineQueue(Generic[W]):
    """Queued jobs of one workload in deadline order (ties: arrival order), with the totals
    admission reads. Removal is eager, so every job in it is still waiting."""

    def __init__(self) -> None:
        self._entries: list[tuple[float, int, W]] = []  # sorted by (deadline, arrival number)
        self._keys: dict[int, tuple[float, int]] = {}  # id(job) -> its sort key
        self._arrivals = itertools.count()
        self.jobs = self.tokens = self.items = self.latency_tokens = 0

    def __len__(self) -> int:
        return self.jobs

    def __contains__(self, job: object) -> bool:
        return id(job) in self._keys

    def push(self, job: W) -> None:
        key = (job.deadline, next(self._arrivals))
        self._keys[id(job)] = key
        bisect.insort(self._entries, (*key, job))
        self._count(job, 1)

    def remove(self, job: W) -> bool:
        """Take `job` out; False when it was not queued (sent, expired or cancelled already)."""
        key = self._keys.pop(id(job), None)
        if key is None:
            return False
        del self._entries[bisect.bisect_left(self._entries, key)]  # (d, n) sorts just before (d, n, job)
        self._count(job, -1)
        return True

    def in_order(self) -> Iterable[W]:
        return (entry[2] for entry in self._entries)

    def earliest_deadline(self) -> float | None:
        return self._entries[0][0] if self._entries else None

    def _count(self, job: W, sign: int) -> None:
        self.jobs += sign
        self.tokens += sign * job.tokens
        self.items += sign * job.batch_items
        self.latency_tokens += sign * job.latency_tokens
