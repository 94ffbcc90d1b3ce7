"""The gateway's side of a job (shared/policy/job.py's Job, the one job type): the future its request
handler awaits and its timer, kept in the job's `handle`, and how a job is finished.

Jobs carry their deadline on the loop's monotonic clock. Whoever finishes a job first (result,
expiry timer, lost worker) wins; later attempts are no-ops. Its size is its WorkSize's
(shared/work.py): a shared prefix is sent once (`wire_ids`) and counted once in `tokens` (what the
queue budget and batch packing use, as the compiled bound does); `latency_tokens`, what latency
predictions use, leave out the tokens the node reuses.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gateway.errors import ApiError
from shared.policy.job import DONE, QUEUED, SENT, Job, JobState
from shared.prefix import prefix_key
from shared.work import NO_REUSE, Reuse

__all__ = ["DONE", "QUEUED", "SENT", "Job", "JobState", "Waiting", "fail", "finish", "new_job", "timer_of",
           "wait_all", "wire_ids"]


@dataclass(eq=False)
class Waiting:
    """A job's handle in the gateway: the future its handler awaits, and its pending timer (expiry in
    the queue, then overdue once sent)."""

    future: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    timer: asyncio.TimerHandle | None = None


def new_job(request_id: str, workload: str, deadline: float, token_ids: list[list[int]], *,
            label_ids: tuple[int, ...] = (), top_k: int = 0, return_hidden: bool = False,
            beam_key: tuple[int, int, int] | None = None, prefix_len: int = 0, prompt_logprobs: int | None = None,
            reuse: Reuse = NO_REUSE, priority: int = 0, catalog: str = "") -> Job:
    """A job of a request on this loop (its future made), its prefix keyed by its ids."""
    key = prefix_key(token_ids[0][:prefix_len]) if prefix_len and not beam_key else None
    return Job(request_id, workload, deadline, token_ids, label_ids, top_k, return_hidden, beam_key, prefix_len,
               prompt_logprobs, reuse, key, priority, catalog=catalog, handle=Waiting())


def timer_of(job: Job) -> Waiting:
    return job.handle


def wire_ids(job: Job) -> tuple[np.ndarray, tuple[int, ...]]:
    """score: (ids int32 [prefix_len + sum of suffixes]: the prefix once, then each sample's suffix;
    the suffix lengths), the layout of shared.protocol.ScoreRequest."""
    cut = job.prefix_len
    parts = [itertools.islice(job.token_ids[0], cut), *(itertools.islice(ids, cut, None) for ids in job.token_ids)]
    flat = np.fromiter(itertools.chain.from_iterable(parts), dtype="<i4", count=job.tokens)
    return flat, tuple(len(ids) - cut for ids in job.token_ids)


def finish(job: Job, result: Any) -> bool:
    """Complete with a result; False when the job was already finished."""
    if job.state == DONE:
        return False
    future = _close(job)
    if not future.cancelled():
        future.set_result(result)
    return True


def fail(job: Job, error: ApiError) -> bool:
    """Complete with an error answer; False when the job was already finished."""
    if job.state == DONE:
        return False
    future = _close(job)
    if not future.cancelled():
        future.set_exception(error)
        future.exception()  # an error answer is an expected outcome: never log it as "unretrieved"
    return True


def _close(job: Job) -> asyncio.Future[Any]:
    job.state = DONE
    waiting: Waiting = job.handle
    if waiting.timer is not None:
        waiting.timer.cancel()
        waiting.timer = None
    return waiting.future


async def wait_all(jobs: list[Job], on_error: Callable[[Job, ApiError], None]) -> list[Any]:
    """Results of all jobs in order; at the first error, `on_error` each other job, then raise it."""
    futures = [timer_of(job).future for job in jobs]
    if len(jobs) == 1:  # shielded: a handler cancelled (its client gone) leaves the job for the batcher to end
        return [await asyncio.shield(futures[0])]
    pending = set(futures)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
        error = next((f.exception() for f in done if f.exception() is not None), None)
        if error is not None:
            for job in jobs:
                on_error(job, error)  # type: ignore[arg-type]
            raise error
    return [future.result() for future in futures]
