"""Thread-safe worker counters and in-flight gauge, snapshotted into Heartbeat messages."""

from __future__ import annotations

import threading

from shared.protocol import WorkerCounters


class WorkerStats:
    """Counters shared by the receive loop and the compute threads (one lock, tiny sections)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(WorkerCounters.__struct_fields__, 0)
        self._in_flight = 0

    def add(self, **deltas: int) -> None:
        """Increase counters by name, e.g. add(requests_expired=3)."""
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta

    def start_batch(self) -> None:
        with self._lock:
            self._in_flight += 1

    def end_batch(self) -> None:
        with self._lock:
            self._in_flight -= 1

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def counters(self) -> WorkerCounters:
        with self._lock:
            return WorkerCounters(**self._counts)
