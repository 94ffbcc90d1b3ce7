"""All workers of the deployment: connection, liveness watchdog, least-loaded choice, predictions.

The watchdog declares a worker lost when it has been silent for `worker_timeout_ms` (its batches
fail at once with 503 worker_lost) and keeps saying Hello to workers that are not ready, so a
restarted worker rejoins by itself.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Callable

import zmq.asyncio

from gateway.latency import CorrectedModel
from gateway.worker_link import CONNECTING, LOST, READY, WorkerLink

log = logging.getLogger("gateway.pool")
HELLO_INTERVAL_S = 0.2


class WorkerPool:
    """The gateway's workers; `pick` chooses the least-loaded ready one with a free batch slot."""

    def __init__(self, endpoints: tuple[str, ...], worker_timeout_ms: int, max_inflight_batches: int,
                 observe_worker_ms: Callable[[float], None] = lambda ms: None) -> None:
        self.gateway_id = f"gw-{uuid.uuid4().hex[:8]}"
        self.timeout_s = worker_timeout_ms / 1000.0
        self.max_inflight_batches = max_inflight_batches
        self._loop = asyncio.get_running_loop()
        self.links = [WorkerLink(e, self.gateway_id, self._loop.time, self._changed, observe_worker_ms)
                      for e in endpoints]
        self._listeners: list[Callable[[], None]] = []
        self._batch_ids = itertools.count(1)
        self._context: zmq.asyncio.Context | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` when a worker becomes ready or lost, or a batch slot frees up."""
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    async def start(self) -> None:
        self._context = zmq.asyncio.Context()
        for link in self.links:
            link.open(self._context)
            link.hello()
            self._tasks.append(asyncio.create_task(link.receive_forever(), name=f"recv {link.endpoint}"))
        self._tasks.append(asyncio.create_task(self._watch(), name="worker watchdog"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for link in self.links:
            if link.in_flight:
                link.declare_lost("the gateway is stopping")
            link.close()
        if self._context is not None:
            self._context.term()
            self._context = None

    async def _watch(self) -> None:
        period = min(self.timeout_s / 4, HELLO_INTERVAL_S)
        while True:
            await asyncio.sleep(period)
            now = self._loop.time()
            for link in self.links:
                silent_s = now - link.last_seen
                allowed_s = self.timeout_s + link.silence_allowance_s()
                if link.state not in (CONNECTING, LOST) and silent_s > allowed_s and not self._stopping:
                    link.declare_lost(f"no heartbeat for {silent_s * 1000:.0f} ms")
                if link.state in (CONNECTING, LOST):
                    link.hello()

    def declare_lost(self, endpoint: str, why: str) -> None:
        """For the supervisor: a worker process it watches has exited."""
        for link in self.links:
            if link.endpoint == endpoint:
                link.declare_lost(why)

    def shutdown_workers(self, reason: str) -> None:
        self._stopping = True  # workers going quiet from here on is expected, not a loss
        for link in self.links:
            link.shutdown(reason)

    # ---- choice and prediction ---------------------------------------------------------------

    def ready_count(self, workload: str | None = None) -> int:
        if workload is None:
            return sum(link.state == READY for link in self.links)
        return sum(link.serves(workload) for link in self.links)

    def pick(self, workload: str) -> WorkerLink | None:
        """The ready worker with the least predicted work in flight and a free slot, or None."""
        now = self._loop.time()
        free = [link for link in self.links
                if link.serves(workload) and len(link.in_flight) < self.max_inflight_batches]
        return min(free, key=lambda link: (link.busy_ms(now), len(link.in_flight)), default=None)

    def model(self, workload: str) -> CorrectedModel | None:
        """The latency model of the fastest ready worker for `workload` (used for admission)."""
        models = [link.models[workload] for link in self.links if link.serves(workload)]
        return min(models, key=lambda m: m.predict_ms(1, 64), default=None)

    def soonest_free_ms(self, workload: str) -> float:
        """Predicted milliseconds until some ready worker has finished its work in flight."""
        now = self._loop.time()
        return min((link.busy_ms(now) for link in self.links if link.serves(workload)), default=0.0)

    def clock(self) -> float:
        """Seconds on the event loop's monotonic clock (deadlines are kept on it)."""
        return self._loop.time()

    def next_batch_id(self) -> int:
        return next(self._batch_ids)

    def in_flight_batches(self) -> int:
        return sum(len(link.in_flight) for link in self.links)
