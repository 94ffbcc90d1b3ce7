"""How a request's jobs end: the results joined, the predictions learnt from, wasted compute counted.

When a request's jobs are all answered (or the first fails, or its client closes the connection,
and the others are abandoned: taken out of the queue, or failed if already sent), the scheduler
(its `on_answer` / `on_failed`, the failure's drop reason passed on) learns how late the answer came against the finish it predicted when it sent the jobs (a request
dropped for its deadline would have come no earlier than that; the lateness is the slack of its
drops and of admission), and the compute the workers spent on the request (each job's share of its
batch, gateway/worker_link.py) is wasted if the answer comes after the deadline (`late`) or the
request fails after some of it was computed (`dropped`). A job answered after its request gave up
on it is counted on arrival, by the link.
Work dropped before compute (refused, expired, predicted late) wastes none.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from gateway.batcher import Batcher
from gateway.errors import ApiError
from gateway.job import Job, wait_all
from gateway.metrics import Metrics


@dataclass(frozen=True)
class RequestEnd:
    """One workload's end of the request path (see module docstring)."""

    batcher: Batcher
    metrics: Metrics

    async def results(self, jobs: list[Job], budget_ms: float | None = None) -> list[Any]:
        """The jobs' results in order, once all are answered; raises the first failure. `budget_ms`:
        the request's budget (its deadline class in the goodput counters)."""
        workload, deadline, loop = self.batcher.workload, min(job.deadline for job in jobs), asyncio.get_running_loop()
        try:
            results = await wait_all(jobs, self.batcher.abandon)
        except asyncio.CancelledError:  # the client closed its connection: aiohttp cancels the handler
            gone = ApiError("client_closed", "the client closed its connection before the answer")
            for job in jobs:
                self.batcher.abandon(job, gone)  # out of the queue; a job already sent is wasted on arrival
            self.batcher.scheduler.on_failed(jobs, None, loop.time())
            self.metrics.count_wasted(workload, "dropped", sum(job.compute_ms for job in jobs))
            raise
        except ApiError as error:
            self.batcher.scheduler.on_failed(jobs, error.drop_reason, loop.time())
            self.metrics.count_wasted(workload, "dropped", sum(job.compute_ms for job in jobs))
            if len(jobs) == 1:
                raise
            sent = sum(job.dispatched is not None for job in jobs)  # the error's words are its own batch's
            answered = sum(job.compute_ms > 0 for job in jobs)
            raise ApiError(error.code, f"{error.message} (one of the {len(jobs)} batches this request was split "
                                       f"into; {sent} had been sent to a worker, {answered} answered)",
                           error.retry_after_s, error.drop_reason) from None
        answered_at = loop.time()
        self.batcher.scheduler.on_answer(jobs, answered_at)
        self.metrics.count_answer(workload, answered_at <= deadline, jobs[0].priority, budget_ms)
        if answered_at > deadline:
            self.metrics.count_wasted(workload, "late", sum(job.compute_ms for job in jobs))
        return results
