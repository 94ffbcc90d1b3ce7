"""The queue of one workload and what it reads of a queued job (pure: no I/O, no clock).

Jobs are served by priority (larger first; a request's optional `priority`, default 0), and within
a priority in deadline order (earliest deadline first; the default) or, for the first-come
first-served ablation, in arrival order. Either way the queue knows its earliest deadline (expiry)
and, for a job about to arrive with a given priority and deadline, the queued jobs it would be
served after (`ahead_of`): admission predicts a request's finish from where it will really run, not
from the back of the whole queue.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import math
from collections.abc import Iterable, Iterator
from typing import Generic, Protocol, TypeVar


class Work(Protocol):
    """What the policy reads of a queued job (shared/policy/job.py's Job; tests' stand-ins)."""

    deadline: float
    samples: int
    tokens: int
    """Tokens sent for this job: a shared prefix once, then the suffixes (the queue budget and the
    compiled batch bound count these; latency_tokens are the ones computed)."""
    batch_items: int
    latency_tokens: int
    label_ids: tuple[int, ...]
    beam_key: tuple[int, int, int] | None
    priority: int
    """Larger is served first (and given up last); 0 by default."""


W = TypeVar("W", bound=Work)


class QueueOrder(enum.StrEnum):
    """[gateway] queue_order: the order queued jobs are served in."""

    DEADLINE = "deadline"  # earliest deadline first (ties: arrival order)
    ARRIVAL = "arrival"  # first come, first served (an ablation: a tight deadline waits its turn)


class DeadlineQueue(Generic[W]):
    """Queued jobs of one workload in serving order, with the totals admission reads. Removal is
    eager, so every job in it is still waiting."""

    def __init__(self, order: QueueOrder | str = QueueOrder.DEADLINE) -> None:
        self.order = QueueOrder(order)
        self._entries: list[tuple[int, float, int, W]] = []  # serving order: (-priority, key, arrival number, job)
        self._by_deadline: list[tuple[float, int, int]] = []  # (deadline, arrival number, priority), for expiry
        self._keys: dict[int, tuple[float, int, int]] = {}  # id(job) -> its deadline, arrival number, priority
        self._arrivals = itertools.count()
        self.jobs = self.tokens = self.items = self.latency_tokens = 0

    def __len__(self) -> int:
        return self.jobs

    def __contains__(self, job: object) -> bool:
        return id(job) in self._keys

    def push(self, job: W) -> None:
        number = next(self._arrivals)
        self._keys[id(job)] = (job.deadline, number, job.priority)
        bisect.insort(self._entries, (*self._sort_key(job.deadline, number, job.priority), job))
        bisect.insort(self._by_deadline, (job.deadline, number, job.priority))
        self._count(job, 1)

    def remove(self, job: W) -> bool:
        """Take `job` out; False when it was not queued (sent, expired or cancelled already)."""
        key = self._keys.pop(id(job), None)
        if key is None:
            return False
        sort_key = self._sort_key(*key)
        del self._entries[bisect.bisect_left(self._entries, sort_key)]  # (p, k, n) sorts just before (p, k, n, job)
        del self._by_deadline[bisect.bisect_left(self._by_deadline, key)]
        self._count(job, -1)
        return True

    def in_order(self) -> Iterable[W]:
        """The jobs in the order they are served."""
        return (entry[3] for entry in self._entries)

    def earliest_deadline(self) -> float | None:
        return self._by_deadline[0][0] if self._by_deadline else None

    def earliest(self) -> W | None:
        """The queued job with the earliest deadline (the next to expire)."""
        if not self._by_deadline:
            return None
        return self._entries[bisect.bisect_left(self._entries, self._sort_key(*self._by_deadline[0]))][3]

    def ahead_of(self, deadline: float, priority: int = 0) -> Iterator[W]:
        """The queued jobs served ahead of a new job with `deadline` and `priority`, in serving order."""
        return (entry[3] for entry in itertools.islice(self._entries, self._cut(deadline, priority)))

    def in_order_with(self, jobs: Iterable[W], deadline: float, priority: int = 0) -> Iterator[W]:
        """The jobs in serving order with `jobs` (not queued) where a new job with `deadline` and
        `priority` is served."""
        cut = self._cut(deadline, priority)
        yield from (entry[3] for entry in itertools.islice(self._entries, cut))
        yield from jobs
        yield from (entry[3] for entry in itertools.islice(self._entries, cut, None))

    def _cut(self, deadline: float, priority: int) -> int:
        """Serving position of a new job: after every queued job of a larger priority and, at its own,
        every one due no later (in an arrival-order queue, every one)."""
        if self.order is QueueOrder.ARRIVAL:
            return bisect.bisect_right(self._entries, (-priority, math.inf))
        return bisect.bisect_right(self._entries, (-priority, deadline, math.inf))

    def _sort_key(self, deadline: float, number: int, priority: int) -> tuple[int, float, int]:
        return (-priority, deadline if self.order is QueueOrder.DEADLINE else float(number), number)

    def _count(self, job: W, sign: int) -> None:
        self.jobs += sign
        self.tokens += sign * job.tokens
        self.items += sign * job.batch_items
        self.latency_tokens += sign * job.latency_tokens
