"""Why work was answered without being served: the drop reasons, declared once, and a refusal (pure)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


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
SENT_AND_MISSED = (DropReason.EXPIRED_IN_WORKER, DropReason.WORKER_OVERDUE)
"""Drops of work the batcher sent as predicted in time that still missed its deadline: what its learnt
lateness counts as at least that late (the answers that never come would otherwise bias it low)."""


@dataclass(frozen=True)
class Refusal:
    """A request answered without compute: the drop reason, a message for the caller, Retry-After."""

    reason: DropReason
    message: str
    retry_after_s: float | None = None

    @property
    def code(self) -> str:
        return DROP_CODES[self.reason]
