"""Deadline-ordered micro-batching: the asyncio shell around one workload's Scheduler (shared/policy).

The scheduler owns the queue, the learnt lateness and every decision (admit or refuse, route, hold,
drop predicted-late work, shed, the batch and the finish predicted for it); this shell keeps only
what is asyncio's and the sockets': each queued job's expiry timer (a job whose deadline passes
while queued is answered 504 at once and never sent), the timer that looks again after a Hold (the
hold is the worker predicted busy for longer than `max_batch_wait_ms` plus the event loop's present
lag: a worker's answer wakes the loop, so a wrong prediction costs no idle time), each sent job's
overdue timer (504 worker_overdue at its deadline plus the grace), the futures, and the send. If
the loop ever ends (cancelled, or failing step after step), it logs why and answers every job it
holds 503 at once, and so every later submit.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.errors import ApiError
from gateway.job import QUEUED, Job, fail, timer_of
from gateway.metrics import Metrics
from gateway.worker_link import WorkerLink
from gateway.worker_pool import WorkerPool
from shared.policy import BatchBounds, DeadlineQueue, DropReason, Hold, Lateness
from shared.policy.scheduler import Batch, Drops, Scheduler

__all__ = ["BatchBounds", "Batcher"]
log = logging.getLogger("gateway.batcher")
RETRY_STEP_S = 0.01
MAX_FAILED_STEPS = 20
"""Steps failing in a row before the loop gives up (a bug that does not go away: answer, not hang)."""


class Batcher:
    """The timers, futures and sends of one workload's scheduler."""

    def __init__(self, scheduler: Scheduler[Job, WorkerLink], pool: WorkerPool, answer_grace_ms: float,
                 metrics: Metrics) -> None:
        self.scheduler = scheduler
        self.workload = scheduler.workload
        self.bounds = scheduler.settings.bounds
        self.stopped = ""
        """Why the loop ended ("" while it runs)."""
        self._pool = pool
        self._grace_s = answer_grace_ms / 1000.0
        self._metrics = metrics
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()

    @property
    def queue(self) -> DeadlineQueue[Job]:
        return self.scheduler.queue

    @property
    def lateness(self) -> Lateness:
        return self.scheduler.lateness

    def now(self) -> float:
        return self._loop.time()

    @property
    def queued_jobs(self) -> int:
        return self.queue.jobs

    @property
    def queued_tokens(self) -> int:
        return self.queue.tokens

    def wake(self) -> None:
        self._wake.set()

    def queued(self, jobs: list[Job]) -> None:
        """The scheduler queued `jobs`: each one's expiry timer answers 504 if it is still queued at its
        deadline; the loop looks at the queue."""
        for job in jobs:
            timer_of(job).timer = self._loop.call_at(job.deadline, self._expire, job)
        self._wake.set()

    def requeue_returned(self, jobs: list[Job]) -> None:
        """Jobs a draining worker refused uncomputed (one batch, one workload): their overdue timers
        cancelled, queued again for another worker, with their expiry timers."""
        for job in jobs:
            waiting = timer_of(job)
            if waiting.timer is not None:
                waiting.timer.cancel()
                waiting.timer = None
            job.state = QUEUED
        self.scheduler.requeue(jobs)
        self.queued(jobs)

    def abandon(self, job: Job, error: ApiError) -> None:
        """Answer a job of a request that failed (a sibling chunk failed) with `error`: taken out of the
        queue if still there; if already sent, its answer will find it done (its compute is wasted)."""
        self.queue.remove(job)
        fail(job, error)

    def _expire(self, job: Job) -> None:
        # a timer may fire a hair before its time: the job's own deadline has passed by definition
        for expired in self.scheduler.expire(max(self._loop.time(), job.deadline)):
            fail(expired, ApiError("deadline_exceeded", "the deadline passed while the request waited in the "
                                                       "queue; it was never sent to a worker",
                                  drop_reason=DropReason.EXPIRED_IN_QUEUE))

    def _overdue(self, job: Job) -> None:
        timer_of(job).timer = None
        fail(job, ApiError("deadline_exceeded", f"the worker did not answer within {self._grace_s * 1000:.0f} ms "
                                               "after the deadline", drop_reason=DropReason.WORKER_OVERDUE))

    async def run(self) -> None:
        """The batching loop; whatever ends it is logged and answered (see module docstring)."""
        why, expected = "its loop returned", False
        try:
            await self._serve()
        except asyncio.CancelledError:
            why, expected = "it was cancelled (the gateway is stopping)", True
            raise
        except BaseException as exc:
            why = f"it failed: {type(exc).__name__}: {exc}"
            raise
        finally:
            self._abandon(why, expected)

    async def _serve(self) -> None:
        """Form, send, sleep until the next reason to look again."""
        failed = 0
        while True:
            try:
                delay = self._step()
                failed = 0
            except Exception:  # a passing bug must not stop batching for good: log it and look again shortly
                failed += 1
                log.exception("the %s batcher failed a step (%d in a row)", self.workload, failed)
                if failed >= MAX_FAILED_STEPS:
                    raise RuntimeError(f"{failed} steps in a row failed") from None
                delay = RETRY_STEP_S
            if delay is not None and delay <= 0:
                continue
            timer = self._loop.call_later(delay, self._wake.set) if delay is not None else None
            await self._wake.wait()
            self._wake.clear()
            if timer is not None:
                timer.cancel()

    def _step(self) -> float | None:
        """Act on one decision of the scheduler; seconds until it should be asked again (None: wait
        for a wake-up: the pool's when a slot frees or a worker becomes ready, a submit's)."""
        workers = self._pool.serving(self.workload)
        decision = self.scheduler.step(self._loop.time(), workers, lambda link: link.latency_models[self.workload],
                                       self._pool.recent)
        if decision is None:
            return None
        if isinstance(decision, Hold):
            return decision.wait_ms / 1000.0
        self._drop_late(decision.jobs if isinstance(decision, Drops) else decision.dropped)
        if isinstance(decision, Batch):
            self._send(decision)
        return 0.0

    def _drop_late(self, jobs: list[Job]) -> None:
        for job in jobs:
            fail(job, ApiError("deadline_exceeded", "the request is predicted to finish past its deadline behind the "
                                                   "worker's work in flight; it was dropped before any compute",
                              drop_reason=DropReason.PREDICTED_LATE))

    def _send(self, batch: Batch[Job, WorkerLink]) -> None:
        link = batch.worker
        if not link.send_batch(self._pool.next_batch_id(), self.workload, batch.jobs, batch.predicted_ms):
            self.scheduler.requeue(batch.jobs)  # they stay queued for another worker
            link.declare_lost("its socket is disconnected")
            return
        now = self._loop.time()
        for job in batch.jobs:
            self._metrics.observe_stage("queue", (now - job.enqueued_at) * 1000.0)
            waiting = timer_of(job)
            if waiting.timer is not None:
                waiting.timer.cancel()
            waiting.timer = self._loop.call_at(job.deadline + self._grace_s, self._overdue, job)
        used = sum(j.samples for j in batch.jobs) if self.workload == "score" else len(batch.jobs)
        self._metrics.observe_batch(self.workload, used / self.bounds.max_items_per_batch)

    def _abandon(self, why: str, expected: bool) -> None:
        """The loop has ended: say why, and answer every queued job (and every later one) 503."""
        self.stopped = why
        jobs = list(self.queue.in_order())
        level = logging.INFO if expected and not jobs else logging.ERROR
        log.log(level, "the %s batcher stopped: %s; answering its %d queued request(s) 503", self.workload, why,
                len(jobs))
        for job in jobs:
            self.queue.remove(job)
            fail(job, self.stopped_error())

    def stopped_error(self) -> ApiError:
        return ApiError("batcher_stopped", f"the gateway's {self.workload} batching loop stopped ({self.stopped}); "
                                           "nothing was computed for this request")
