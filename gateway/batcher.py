"""Deadline-ordered micro-batching: the async shell around shared/policy's batch plan and drops.

One Batcher per workload. Its loop asks the pool for the least-loaded worker with a free slot, and
the policy what to do with the head of the queue (`dispatch`): hold the batch while that worker is
predicted busy for longer than `max_batch_wait_ms` plus the event loop's present lag (the timer
that sends it fires late by as much: `Lateness.lead_ms`; a worker's answer wakes the loop, so a
wrong prediction costs no idle time), or send it, answering the jobs that cannot finish in time 504
instead (predicted late, before any compute). Its `lateness` learns how late answers come against
the finish predicted when their batch was sent, beyond the event loop's present lag (sampled by
gateway/loop_lag.py): the slack of those drops. A job whose deadline
passes while queued is answered 504 at once by its own timer (`take_expired`) and never sent. If the
loop ever ends (cancelled, or failing step after step), it logs why and answers every job it holds
503 at once, and so every later submit.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.errors import ApiError
from gateway.job import Job
from gateway.metrics import Metrics
from gateway.worker_link import WorkerLink
from gateway.worker_pool import WorkerPool
from shared.policy import BatchBounds, DeadlineQueue, DropReason, Hold, Lateness, Prediction, Send, FinishEstimate, take_expired
from shared.policy.routing import dispatch_routed

__all__ = ["BatchBounds", "Batcher"]
log = logging.getLogger("gateway.batcher")
RETRY_STEP_S = 0.01
MAX_FAILED_STEPS = 20
"""Steps failing in a row before the loop gives up (a bug that does not go away: answer, not hang)."""


class Batcher:
    """The queue and batching loop of one workload."""

    def __init__(self, workload: str, pool: WorkerPool, bounds: BatchBounds, max_wait_ms: float,
                 answer_grace_ms: float, metrics: Metrics, drop_late: bool = True, margin_ms: float = 0.0,
                 order: str = "deadline", shed_by_cost: bool = False) -> None:
        self.workload = workload
        self.bounds = bounds
        self.queue: DeadlineQueue[Job] = DeadlineQueue(order)
        self.stopped = ""
        """Why the loop ended ("" while it runs)."""
        self._pool = pool
        self._max_wait_ms = max_wait_ms
        self._drop_late = drop_late
        self._shed_by_cost = shed_by_cost
        self.lateness = Lateness()
        """How much later than predicted at send its requests are answered (learnt): the slack of its
        drops and of admission's refusals."""
        self._margin_ms = margin_ms
        self._grace_s = answer_grace_ms / 1000.0
        self._metrics = metrics
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()

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

    def submit(self, job: Job) -> None:
        """Queue a job; its expiry timer answers 504 if it is still here at its deadline."""
        if self.stopped:
            job.fail(self._stopped_error())
            return
        job.enqueued_at = self._loop.time()
        self.queue.push(job)
        job.expiry = self._loop.call_at(job.deadline, self._expire, job)
        self._wake.set()

    def learn(self, jobs: list[Job], answered_at: float) -> None:
        """A request was answered: how late against the finish predicted when its jobs were sent."""
        for job in jobs:
            if job.dispatched is not None:
                self.lateness.observe(job.dispatched, answered_at)

    def learn_missed(self, jobs: list[Job], deadline: float) -> None:
        """A request's sent work missed its deadline (expired in the worker, or overdue): it would
        have been answered no earlier than the deadline."""
        for job in jobs:
            if job.dispatched is not None:
                self.lateness.observe_missed(job.dispatched, deadline)

    def abandon(self, job: Job, error: ApiError) -> None:
        """Answer a job of a request that failed (a sibling chunk failed) with `error`: taken out of the
        queue if still there; if already sent, its answer will find it done (its compute is wasted)."""
        self.queue.remove(job)
        job.fail(error)

    def _expire(self, job: Job) -> None:
        # a timer may fire a hair before its time: the job's own deadline has passed by definition
        for expired in take_expired(self.queue, max(self._loop.time(), job.deadline)):
            expired.fail(ApiError("deadline_exceeded", "the deadline passed while the request waited in the "
                                                       "queue; it was never sent to a worker",
                                  drop_reason=DropReason.EXPIRED_IN_QUEUE))

    def _overdue(self, job: Job) -> None:
        job.expiry = None
        job.fail(ApiError("deadline_exceeded", f"the worker did not answer within {self._grace_s * 1000:.0f} ms "
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
        """Send one batch if it is time; else seconds until it will be (None: wait for a wake-up)."""
        if not self.queue:
            return None
        now = self._loop.time()
        workers = self._pool.serving(self.workload)
        decision = dispatch_routed(self.queue, self.workload, self.bounds, workers, lambda link: link.latency_models[
            self.workload], now, self._pool.max_inflight_batches, self._pool.recent,
            self.lateness.lead_ms(self._max_wait_ms, now),
            self._drop_late, self.lateness.slack_ms(self._margin_ms, now), self._shed_by_cost)
        if decision is None:
            return None  # the pool wakes us when a slot frees or a worker becomes ready, a submit when a job comes
        if isinstance(decision, Hold):
            return decision.wait_ms / 1000.0
        link, plan = decision
        self._send(link, plan, now)
        return 0.0

    def _send(self, link: WorkerLink, plan: Send[Job], now: float) -> None:
        for job in plan.late:
            self.queue.remove(job)
            job.fail(ApiError("deadline_exceeded", "the request is predicted to finish past its deadline behind the "
                                                   "worker's work in flight; it was dropped before any compute",
                              drop_reason=DropReason.PREDICTED_LATE))
        if not plan.live:
            return
        for job in plan.live:  # sized for where they run: out of the queue first (it keeps totals)
            self.queue.remove(job)
            job.resize(link.reuse)
        timing = FinishEstimate(link.latency_models[self.workload], now, link.busy_ms(now))
        items, computed = sum(j.batch_items for j in plan.live), sum(j.latency_tokens for j in plan.live)
        predicted_ms = timing.predict_ms(items, computed)
        dispatched = Prediction(link.busy_ms(now), predicted_ms, 0.0, timing.finish_at(items, computed))
        if not link.send_batch(self._pool.next_batch_id(), self.workload, plan.live, predicted_ms):
            for job in plan.live:
                self.queue.push(job)  # they stay queued for another worker
            link.declare_lost("its socket is disconnected")
            return
        now = self._loop.time()
        for job in plan.live:
            job.dispatched = dispatched
            self._metrics.observe_stage("queue", (now - job.enqueued_at) * 1000.0)
            if job.expiry is not None:
                job.expiry.cancel()
            job.expiry = self._loop.call_at(job.deadline + self._grace_s, self._overdue, job)
        used = sum(j.samples for j in plan.live) if self.workload == "score" else len(plan.live)
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
            job.fail(self._stopped_error())

    def _stopped_error(self) -> ApiError:
        return ApiError("batcher_stopped", f"the gateway's {self.workload} batching loop stopped ({self.stopped}); "
                                           "nothing was computed for this request")
