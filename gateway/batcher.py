"""Deadline-ordered micro-batching: queued jobs are cut into packed batches up to the compiled bounds.

One Batcher per workload. A batch goes to the least-loaded worker with a free slot when it is full,
or when that worker is idle or predicted to finish its work in flight within `max_batch_wait_ms`:
until then jobs wait here, in deadline order, gathering companions, not in a worker's FIFO (a
worker's answer wakes the batcher, so a wrong prediction costs no idle time).
A job whose deadline passes while queued is answered 504 at once by its own timer and never sent;
one predicted to finish past its deadline is answered 504 instead of being sent.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from dataclasses import dataclass

from gateway.errors import ApiError
from gateway.job import QUEUED, Job
from gateway.metrics import Metrics
from gateway.worker_pool import WorkerPool

log = logging.getLogger("gateway.batcher")
SCAN_LIMIT = 8  # queued jobs that did not fit, looked past per batch (keeps a long queue cheap)


@dataclass(frozen=True)
class BatchBounds:
    """What one packed batch may hold (from the manifest's bounds)."""

    max_jobs: int
    """score: samples per batch; beam: requests per batch."""
    max_tokens: int
    max_labels: int


class Batcher:
    """The queue and batching loop of one workload."""

    def __init__(self, workload: str, pool: WorkerPool, bounds: BatchBounds, max_wait_ms: float,
                 answer_grace_ms: float, metrics: Metrics) -> None:
        self.workload = workload
        self.bounds = bounds
        self.queued_tokens = 0
        self.queued_jobs = 0
        self.queued_items = 0
        self.queued_latency_tokens = 0
        self._pool = pool
        self._max_wait_s = max_wait_ms / 1000.0
        self._grace_s = answer_grace_ms / 1000.0
        self._metrics = metrics
        self._loop = asyncio.get_running_loop()
        self._heap: list[tuple[float, int, Job]] = []
        self._seq = itertools.count()
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    def submit(self, job: Job) -> None:
        """Queue a job; its expiry timer answers 504 if it is still here at its deadline."""
        job.enqueued_at = self._loop.time()
        heapq.heappush(self._heap, (job.deadline, next(self._seq), job))
        self.queued_tokens += job.tokens
        self.queued_jobs += 1
        self.queued_items += job.batch_items
        self.queued_latency_tokens += job.latency_tokens
        job.expiry = self._loop.call_at(job.deadline, self._expire, job)
        self._wake.set()

    def cancel(self, job: Job, error: ApiError) -> None:
        """Take a still-queued job out (a sibling chunk failed) and answer it with `error`."""
        if job.state == QUEUED:
            self._leave(job)
            job.fail(error)

    def backlog(self) -> tuple[int, int]:
        """(items, latency tokens) waiting in the queue.

        All of it counts as ahead of a new request: with one SLO per route, later arrivals have later
        deadlines, and the bound errs on the side of refusing rather than answering late.
        """
        return self.queued_items, self.queued_latency_tokens

    def _expire(self, job: Job) -> None:
        if job.state == QUEUED:
            self._leave(job)
            self._metrics.count_drop("expired_in_queue")
            job.fail(ApiError("deadline_exceeded", "the deadline passed while the request waited in the queue; "
                                                   "it was never sent to a worker"))

    def _overdue(self, job: Job) -> None:
        job.expiry = None
        if job.fail(ApiError("deadline_exceeded", f"the worker did not answer within {self._grace_s * 1000:.0f} ms "
                                                  "after the deadline")):
            self._metrics.count_drop("worker_overdue")

    def _leave(self, job: Job) -> None:
        self.queued_tokens -= job.tokens
        self.queued_jobs -= 1
        self.queued_items -= job.batch_items
        self.queued_latency_tokens -= job.latency_tokens

    async def run(self) -> None:
        """The batching loop: form, send, sleep until the next reason to look again."""
        while True:
            try:
                delay = self._step()
            except Exception:  # a bug must not stop batching for good: log it and look again shortly
                log.exception("the %s batcher failed a step", self.workload)
                delay = 0.01
            if delay is not None and delay <= 0:
                continue
            timer = self._loop.call_later(delay, self._wake.set) if delay is not None else None
            await self._wake.wait()
            self._wake.clear()
            if timer is not None:
                timer.cancel()

    def _step(self) -> float | None:
        """Send one batch if it is time; else seconds until it will be (None: wait for a wake-up)."""
        while self._heap and self._heap[0][2].state != QUEUED:
            heapq.heappop(self._heap)
        if not self._heap:
            return None
        link = self._pool.pick(self.workload)
        if link is None:
            return None  # the pool wakes us when a slot frees or a worker becomes ready
        jobs, full = self._take()
        now = self._loop.time()
        # A batch sent to a busy worker would only wait in its FIFO: keep the jobs here (in deadline
        # order, gathering companions) until the worker is predicted to be free within max_batch_wait.
        hold_s = link.busy_ms(now) / 1000.0 - self._max_wait_s
        if not full and hold_s > 0:
            self._put_back(jobs)
            return hold_s
        model = link.models[self.workload]
        items = sum(j.batch_items for j in jobs)
        predicted_ms = model.predict_ms(items, sum(j.latency_tokens for j in jobs) / max(1, items))
        self._send(link, jobs, predicted_ms, now)
        return 0.0

    def _take(self) -> tuple[list[Job], bool]:
        """Pop the jobs of the next batch in deadline order; `full` when one did not fit."""
        taken: list[Job] = []
        skipped: list[tuple[float, int, Job]] = []
        samples, tokens, labels, full = 0, 0, set(), False
        while self._heap and len(skipped) < SCAN_LIMIT:
            entry = heapq.heappop(self._heap)
            job = entry[2]
            if job.state != QUEUED:
                continue
            if taken and not self._fits(job, taken[0], len(taken), samples, tokens, labels):
                skipped.append(entry)
                full = True
                continue
            taken.append(job)
            samples, tokens = samples + job.samples, tokens + job.tokens
            labels.update(job.label_ids)
            if (samples if self.workload == "score" else len(taken)) >= self.bounds.max_jobs:
                full = True
                break
        for entry in skipped:
            heapq.heappush(self._heap, entry)
        return taken, full

    def _fits(self, job: Job, first: Job, count: int, samples: int, tokens: int, labels: set[int]) -> bool:
        if self.workload == "beam":
            return job.beam_key == first.beam_key and count < self.bounds.max_jobs
        return (samples + job.samples <= self.bounds.max_jobs and tokens + job.tokens <= self.bounds.max_tokens
                and (labels.issuperset(job.label_ids) or len(labels.union(job.label_ids)) <= self.bounds.max_labels))

    def _put_back(self, jobs: list[Job]) -> None:
        for job in jobs:
            heapq.heappush(self._heap, (job.deadline, next(self._seq), job))

    def _send(self, link, jobs: list[Job], predicted_ms: float, now: float) -> None:
        live = []
        trusted = link.models[self.workload].verified  # an unconfirmed start-up profile drops nothing
        finish = now + (link.busy_ms(now) + predicted_ms) / 1000.0  # behind the worker's work in flight
        for job in jobs:
            if trusted and finish > job.deadline:
                self._leave(job)
                self._metrics.count_drop("predicted_late")
                job.fail(ApiError("deadline_exceeded", f"the request would finish {(finish - now) * 1000:.1f} ms from now, "
                                                       "past its deadline; it was dropped before any compute"))
            else:
                live.append(job)
        if not live:
            return
        if not link.send_batch(self._pool.next_batch_id(), self.workload, live, predicted_ms):
            self._put_back(live)
            link.declare_lost("its socket is disconnected")
            return
        for job in live:
            self._leave(job)
            self._metrics.observe_stage("queue", (now - job.enqueued_at) * 1000.0)
            if job.expiry is not None:
                job.expiry.cancel()
            job.expiry = self._loop.call_at(job.deadline + self._grace_s, self._overdue, job)
        fill = (sum(j.samples for j in live) if self.workload == "score" else len(live)) / self.bounds.max_jobs
        self._metrics.observe_batch(self.workload, fill)
