"""Admission control: the gateway's side of the scheduler's `precheck` and `submit`.

It reads the pool (ready workers, the soonest-free worker's work in flight, the fastest worker's
corrected latency model), asks the workload's scheduler (shared/policy/scheduler.py, which queues
what it admits) and raises a refusal as an ApiError (429 queue_full with Retry-After, 503
deadline_unmeetable); what is admitted gets its timers from the batcher. A refusal costs no compute.
"""

from __future__ import annotations

from gateway.batcher import Batcher
from gateway.errors import ApiError
from gateway.job import Job
from gateway.worker_pool import WorkerPool
from shared.policy import PoolView, Prediction, Refusal
from shared.request_ids import client_id

__all__ = ["Admission", "Prediction"]


class Admission:
    """Decides admit or refuse (a value: Prediction, or ApiError raised) for a request's jobs."""

    def __init__(self, pool: WorkerPool) -> None:
        self._pool = pool

    def check_workers(self, workload: str) -> None:
        if self._pool.ready_count(workload) == 0:
            known = len(self._pool.links)
            raise ApiError("no_workers", f"none of the {known} configured worker(s) is ready to serve {workload}; "
                                         "retry shortly")

    def precheck(self, batcher: Batcher, request_id: str, deadline: float, now: float, items: int,
                 priority: int = 0) -> None:
        """Refuse before any tokenizing when the predicted wait where the request would run, with the
        least its `items` (samples or beams) can take, misses the deadline."""
        self.check_workers(batcher.workload)
        refusal = batcher.scheduler.precheck(client_id(request_id), deadline, items, now, self._view(batcher.workload),
                                             self._pool.model(batcher.workload), priority)
        if refusal is not None:
            raise _error(refusal)

    def submit(self, batcher: Batcher, jobs: list[Job], now: float) -> Prediction:
        """Queue the request's jobs, or refuse it with 429 queue_full or 503 deadline_unmeetable (or 503
        batcher_stopped when the batcher's loop has ended)."""
        if batcher.stopped:
            raise batcher.stopped_error()
        self.check_workers(batcher.workload)
        model = self._pool.model(batcher.workload)
        assert model is not None
        decision = batcher.scheduler.submit(jobs, now, self._view(batcher.workload), model)
        if isinstance(decision, Refusal):
            raise _error(decision)
        batcher.queued(jobs)
        return decision

    def _view(self, workload: str) -> PoolView:
        return PoolView(self._pool.ready_count(workload), self._pool.soonest_free_ms(workload),
                        self._pool.in_flight_batches())


def _error(refusal: Refusal) -> ApiError:
    return ApiError(refusal.code, refusal.message, retry_after_s=refusal.retry_after_s)
