"""Wasted compute: what the workers computed for a request whose answer was not delivered in time.

A request's jobs carry their share of the compute of the batches that served them (gateway/job.py,
filled from the workers' reports by gateway/worker_link.py). When the request ends, its compute is
wasted if the answer comes after its deadline (`late`) or it failed after some of it was computed
(`dropped`); a job whose answer comes after its request gave up on it is counted on arrival, by the
link. Work dropped before compute (refused, expired, predicted late) wastes none.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.batcher import Batcher
from gateway.errors import ApiError
from gateway.job import Job, wait_all
from gateway.metrics import Metrics


async def answered(jobs: list[Job], deadline: float, workload: str, batcher: Batcher, metrics: Metrics) -> list[Any]:
    """The jobs' results in order (wait_all); their compute is counted as wasted when the answer is late
    or the request fails (its other jobs are then abandoned: taken out of the queue, or failed). The
    batcher learns how late the answer came against the finish it predicted when it sent the jobs."""
    try:
        results = await wait_all(jobs, batcher.abandon)
    except ApiError:
        metrics.count_wasted(workload, "dropped", sum(job.compute_ms for job in jobs))
        raise
    answered_at = asyncio.get_running_loop().time()
    batcher.learn(jobs, answered_at)
    if answered_at > deadline:
        metrics.count_wasted(workload, "late", sum(job.compute_ms for job in jobs))
    return results
