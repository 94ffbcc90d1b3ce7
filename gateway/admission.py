"""Admission control: the shell around shared/policy's precheck and admit for the gateway.

It reads the pool (ready workers, the soonest-free worker's work in flight, the fastest worker's
corrected latency model), the batcher's queue and its learnt lateness (the slack of its drops), asks
the policy, and raises the refusal as an
ApiError (429 queue_full with Retry-After, 503 deadline_unmeetable). A refusal costs no compute.
"""

from __future__ import annotations

from gateway.batcher import Batcher
from gateway.errors import ApiError
from gateway.job import Job
from gateway.worker_pool import WorkerPool
from shared.policy import AdmissionSettings, PoolView, Prediction, Refusal, admit, precheck

__all__ = ["Admission", "Prediction"]


class Admission:
    """Decides admit or refuse (a value: Prediction, or ApiError raised) for a request's jobs."""

    def __init__(self, pool: WorkerPool, max_queue_tokens: int, margin_ms: float, enabled: bool = True,
                 shed_by_cost: bool = False) -> None:
        self._pool = pool
        self.settings = AdmissionSettings(max_queue_tokens, margin_ms, refuse_early=enabled, shed_by_cost=shed_by_cost)

    @property
    def enabled(self) -> bool:
        return self.settings.refuse_early

    def check_workers(self, workload: str) -> None:
        if self._pool.ready_count(workload) == 0:
            known = len(self._pool.links)
            raise ApiError("no_workers", f"none of the {known} configured worker(s) is ready to serve {workload}; "
                                         "retry shortly")

    def precheck(self, batcher: Batcher, deadline: float, now: float, items: int) -> None:
        """Refuse before any tokenizing when the predicted wait where the request would run, with the
        least its `items` (samples or beams) can take, misses the deadline."""
        self.check_workers(batcher.workload)
        model = self._pool.model(batcher.workload)
        if model is None:
            return
        refusal = precheck(batcher.queue, self._view(batcher.workload), model, deadline, now, self.settings,
                           batcher.lateness, items)
        if refusal is not None:
            raise _error(refusal)

    def admit(self, batcher: Batcher, jobs: list[Job], now: float) -> Prediction:
        """Refuse with 429 queue_full or 503 deadline_unmeetable, else return the prediction."""
        self.check_workers(batcher.workload)
        model = self._pool.model(batcher.workload)
        assert model is not None
        decision = admit(jobs, batcher.queue, self._view(batcher.workload), model, now, self.settings,
                         batcher.lateness)
        if isinstance(decision, Refusal):
            raise _error(decision)
        return decision

    def _view(self, workload: str) -> PoolView:
        return PoolView(self._pool.ready_count(workload), self._pool.soonest_free_ms(workload),
                        self._pool.in_flight_batches())


def _error(refusal: Refusal) -> ApiError:
    return ApiError(refusal.code, refusal.message, retry_after_s=refusal.retry_after_s)
