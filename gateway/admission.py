"""Admission control: admit a request only if its predicted finish time meets its deadline.

predicted finish = now + predicted wait (work in flight on the soonest-free worker, plus the queued
work, shared by the ready workers) + predicted service of the request itself,
from the workers' fitted latency models corrected online. The queue has a token budget per
workload: beyond it the answer is 429 with Retry-After. A refusal costs no compute.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.batcher import Batcher
from gateway.errors import ApiError
from gateway.job import Job
from gateway.latency import CorrectedModel, QuantileTracker
from gateway.worker_pool import WorkerPool

LATE_QUANTILE, LATE_STEP_MS = 0.9, 0.25


@dataclass(frozen=True)
class Prediction:
    """Why a request was admitted: the predicted milliseconds of each part."""

    wait_ms: float
    service_ms: float
    budget_ms: float
    finish_at: float = 0.0
    """Predicted finish on the loop clock, before the learnt lateness is added."""


class Admission:
    """Decides admit or refuse (a value: Prediction, or ApiError raised) for a request's jobs."""

    def __init__(self, pool: WorkerPool, max_queue_tokens: int, margin_ms: float, enabled: bool = True) -> None:
        self._pool = pool
        self._max_queue_tokens = max_queue_tokens
        self._margin_ms = margin_ms
        self.enabled = enabled
        # how much later than predicted admitted requests really finish (its 90th percentile)
        self.lateness_ms = {w: QuantileTracker(LATE_QUANTILE, LATE_STEP_MS) for w in ("score", "beam")}

    def observe(self, workload: str, prediction: Prediction, finished_at: float) -> None:
        """Learn from an admitted request's real finish time (the end-to-end online correction)."""
        self.lateness_ms[workload].observe((finished_at - prediction.finish_at) * 1000.0)

    def _probe(self, batcher: Batcher, model: CorrectedModel) -> bool:
        """Admit anyway while no measured batch has confirmed the start-up profile and nothing else is
        queued or running: a profile taken on a busy machine may be far off, and refusing everything
        would never produce the measurements that correct it."""
        return not model.verified and batcher.queued_jobs == 0 and self._pool.in_flight_batches() == 0

    def _slack_ms(self, workload: str) -> float:
        return self._margin_ms + max(0.0, self.lateness_ms[workload].value)

    def check_workers(self, workload: str) -> None:
        if self._pool.ready_count(workload) == 0:
            known = len(self._pool.links)
            raise ApiError("no_workers", f"none of the {known} configured worker(s) is ready to serve {workload}; "
                                         "retry shortly")

    def precheck(self, batcher: Batcher, deadline: float, now: float) -> None:
        """Refuse before any tokenizing when the queue's predicted wait alone misses the deadline."""
        self.check_workers(batcher.workload)
        model = self._pool.model(batcher.workload)
        if not self.enabled or model is None:
            return
        workers = max(1, self._pool.ready_count(batcher.workload))
        wait_ms = self._pool.soonest_free_ms(batcher.workload) + model.backlog_ms(*batcher.backlog()) / workers
        budget_ms = (deadline - now) * 1000.0
        slack_ms = self._slack_ms(batcher.workload)
        if wait_ms + slack_ms > budget_ms and not self._probe(batcher, model):
            raise ApiError("deadline_unmeetable", f"the predicted queue wait of {wait_ms:.1f} ms (+ margin "
                                                  f"{slack_ms:.1f} ms) is already past the deadline of "
                                                  f"{budget_ms:.1f} ms; refused before any work")

    def admit(self, batcher: Batcher, jobs: list[Job], now: float) -> Prediction:
        """Refuse with 429 queue_full or 503 deadline_unmeetable, else return the prediction."""
        self.check_workers(batcher.workload)
        model = self._pool.model(batcher.workload)
        assert model is not None
        deadline = min(j.deadline for j in jobs)
        budget_ms = (deadline - now) * 1000.0
        tokens = sum(j.latency_tokens for j in jobs)
        items = sum(j.batch_items for j in jobs)
        ahead_items, ahead_tokens = batcher.backlog()
        workers = max(1, self._pool.ready_count(batcher.workload))
        # this request finishes with the queue ahead of it, served in full batches by the ready workers
        finish_ms = (self._pool.soonest_free_ms(batcher.workload)
                     + model.backlog_ms(ahead_items + items, ahead_tokens + tokens) / workers)
        service_ms = model.backlog_ms(items, tokens)
        wait_ms = max(0.0, finish_ms - service_ms)
        prediction = Prediction(wait_ms, service_ms, budget_ms, now + finish_ms / 1000.0)
        if not self.enabled:
            return prediction
        real_tokens = sum(j.tokens for j in jobs)
        if batcher.queued_tokens + real_tokens > self._max_queue_tokens and batcher.queued_jobs > 0:
            drain_s = (self._pool.soonest_free_ms(batcher.workload)
                       + model.backlog_ms(*batcher.backlog()) / workers) / 1000.0
            raise ApiError("queue_full", f"the {batcher.workload} queue holds {batcher.queued_tokens} tokens; with "
                                         f"this request's {real_tokens} it would pass its budget of "
                                         f"{self._max_queue_tokens}", retry_after_s=drain_s)
        slack_ms = self._slack_ms(batcher.workload)
        if wait_ms + service_ms + slack_ms > budget_ms and not self._probe(batcher, model):
            raise ApiError("deadline_unmeetable",
                           f"predicted finish in {wait_ms + service_ms:.1f} ms (queue wait {wait_ms:.1f} ms + service "
                           f"{service_ms:.1f} ms + margin {slack_ms:.1f} ms) is past the deadline of "
                           f"{budget_ms:.1f} ms; refused before any work")
        return prediction
