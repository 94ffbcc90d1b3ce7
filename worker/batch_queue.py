"""Accepted batches waiting for compute: deadlines on this process's clock, bounded queue."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field

from shared.protocol import BeamBatch, ScoreBatch


@dataclass
class PendingBatch:
    """A batch accepted from one gateway, with absolute deadlines on this worker's monotonic clock."""

    peer: bytes
    """ROUTER identity of the gateway that sent it (replies go back there)."""
    message: ScoreBatch | BeamBatch
    received_at: float
    """time.monotonic() seconds at receipt."""
    deadlines: tuple[float, ...]
    """Per request, received_at + deadline_ms / 1000."""
    rejected: dict[int, str] = field(default_factory=dict)
    """Request index -> why that request alone is refused (bounds); it is answered `error`."""

    @classmethod
    def received(cls, peer: bytes, message: ScoreBatch | BeamBatch, now: float | None = None) -> PendingBatch:
        """Convert the relative deadline budgets to this clock at the moment of receipt."""
        now = time.monotonic() if now is None else now
        deadlines = tuple(now + r.deadline_ms / 1000.0 for r in message.requests)
        return cls(peer=peer, message=message, received_at=now, deadlines=deadlines)

    def split(self, now: float) -> tuple[list[int], list[int]]:
        """(live, expired) request indices at time `now`; rejected requests are in neither."""
        live, expired = [], []
        for i, deadline in enumerate(self.deadlines):
            if i in self.rejected:
                continue
            (live if deadline > now else expired).append(i)
        return live, expired

    @property
    def request_ids(self) -> list[str]:
        return [r.request_id for r in self.message.requests]


class BatchQueue:
    """FIFO of PendingBatch with a hard capacity: `offer` refuses instead of growing.

    One producer (the receive loop) and one consumer per compute lane. stop() is called only after
    the queue has drained, so stop markers never count against the capacity.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._queue: queue.Queue[PendingBatch | None] = queue.Queue()

    def offer(self, batch: PendingBatch) -> bool:
        """Enqueue unless `capacity` batches already wait."""
        if self._queue.qsize() >= self.capacity:
            return False
        self._queue.put(batch)
        return True

    def take(self) -> PendingBatch | None:
        """Next batch, blocking; None means stop."""
        return self._queue.get()

    def stop(self, consumers: int) -> None:
        """Wake every consumer with a stop marker."""
        for _ in range(consumers):
            self._queue.put(None)

    @property
    def depth(self) -> int:
        return self._queue.qsize()
