"""The policy's vocabulary: what it reads of a job and a cost model, its drop reasons, and the
deadline-ordered queue of one workload (pure: no I/O, no clock)."""

from __future__ import annotations

import bisect
import enum
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

class DropReason(enum.StrEnum):
    """Why accepted or arriving work was answered without being served: declared once, counted once."""

    QUEUE_FULL = "queue_full"  # the queue's token budget is spent (refused at admission)
    DEADLINE_UNMEETABLE = "deadline_unmeetable"  # the predicted finish is past the deadline (refused at admission)
    EXPIRED_IN_QUEUE = "expired_in_queue"  # the deadline passed while queued in the gateway; never sent
    PREDICTED_LATE = "predicted_late"  # its batch would finish past its deadline; never sent
    EXPIRED_IN_WORKER = "expired_in_worker"  # the worker found it expired before compute; never computed
    WORKER_OVERDUE = "worker_overdue"  # the deadline passed while the worker held it
    WORKER_LOST = "worker_lost"  # the worker stopped answering with it in flight


DROP_CODES = {
    DropReason.QUEUE_FULL: "queue_full",
    DropReason.DEADLINE_UNMEETABLE: "deadline_unmeetable",
    DropReason.EXPIRED_IN_QUEUE: "deadline_exceeded",
    DropReason.PREDICTED_LATE: "deadline_exceeded",
    DropReason.EXPIRED_IN_WORKER: "deadline_exceeded",
    DropReason.WORKER_OVERDUE: "deadline_exceeded",
    DropReason.WORKER_LOST: "worker_lost",
}
"""Drop reason -> the API error code it is answered with (gateway/errors.py gives the HTTP status)."""


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


class CostModel(Protocol):
    """A worker's latency prediction (gateway/latency.py's CorrectedModel)."""

    @property
    def verified(self) -> bool: ...

    def predict_ms(self, batch_items: float, tokens_per_item: float) -> float: ...

    def backlog_ms(self, items: int, tokens: int) -> float: ...


W = TypeVar("W", bound=Work)


@dataclass(frozen=True)
class Refusal:
    """A request answered without compute: the drop reason, a message for the caller, Retry-After."""

    reason: DropReason
    message: str
    retry_after_s: float | None = None

    @property
    def code(self) -> str:
        return DROP_CODES[self.reason]


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
