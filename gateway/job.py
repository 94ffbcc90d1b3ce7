"""A Job: one unit of queued work (a whole request, or one chunk of a large scoring request).

Jobs carry their deadline on the loop's monotonic clock and a future the request handler awaits.
Whoever finishes a job first (result, expiry timer, lost worker) wins; later attempts are no-ops.
Its size is one WorkSize (shared/work.py): a shared prefix is sent once (`wire_ids`) and counted once
in `tokens` (what the queue budget and batch packing use, as the compiled bound does);
`latency_tokens`, what latency predictions use, leave out the tokens the node reuses.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gateway.errors import ApiError
from shared.policy import Prediction
from shared.prefix import prefix_key
from shared.work import NO_REUSE, Reuse, WorkSize, counted_by_work


class JobState(enum.StrEnum):
    """Where a job is: in the gateway's queue, sent to a worker, or finished (answered or failed)."""

    QUEUED = "queued"
    SENT = "sent"
    DONE = "done"


QUEUED, SENT, DONE = JobState


@counted_by_work
@dataclass(eq=False)
class Job:
    """Work for one request (or chunk) on its way through queue, batch and worker."""

    request_id: str
    """Unique on the wire: the HTTP request id, plus `#k` for chunk k of a split request."""
    workload: str
    """score | beam"""
    deadline: float
    """Absolute, in loop.time() seconds."""
    token_ids: list[list[int]]
    """score: one list per sample, whole (prefix included); beam: one list (the prompt)."""
    label_ids: tuple[int, ...] = ()
    top_k: int = 0
    return_hidden: bool = False
    beam_key: tuple[int, int, int] | None = None
    """beam: (num_beams, max_new_tokens, num_return_sequences); batches share one key."""
    prefix_len: int = 0
    """score: the first prefix_len ids of every sample are the same and are sent and computed once."""
    priority: int = 0
    """The request's priority: larger is served first and given up last (shared/policy/deadline_queue.py)."""
    reuse: Reuse = NO_REUSE
    """score: where leading tokens' keys/values already exist: the static prefix and the prefix cache
    of the worker it is expected to run on (`resize` when it goes elsewhere)."""
    future: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    state: JobState = QUEUED
    enqueued_at: float = 0.0
    expiry: asyncio.TimerHandle | None = None
    compute_ms: float = 0.0
    """Its share of the compute of the batch that served it, as the worker reported it."""
    dispatched: Prediction | None = None
    """The finish predicted when it was sent (its batch's, behind the worker's work in flight)."""

    work: WorkSize = field(init=False)
    """What it sends, computes and reuses; the policy's counts (samples, tokens, batch_items,
    latency_tokens) are its answers (shared/work.counted_by_work)."""
    prefix_key: int | None = field(init=False)
    """score with a shared prefix: the prefix's key (shared/prefix.prefix_key), which routing
    places by; None: no shared prefix (placed on the least busy worker)."""

    def __post_init__(self) -> None:
        if self.beam_key:
            self.work = WorkSize.prompt(len(self.token_ids[0]), self.beam_key[0])
        else:
            self.work = WorkSize.of(self.token_ids, self.prefix_len, self.reuse)
        self.prefix_key = prefix_key(self.token_ids[0][:self.prefix_len]) if self.prefix_len else None

    def resize(self, reuse: Reuse) -> None:
        """Size it for a worker with `reuse` (never while it is queued: the queue keeps totals)."""
        if not self.beam_key and reuse != self.reuse:
            self.reuse, self.work = reuse, WorkSize.of(self.token_ids, self.prefix_len, reuse)

    def wire_ids(self) -> tuple[np.ndarray, tuple[int, ...]]:
        """score: (ids int32 [prefix_len + sum of suffixes]: the prefix once, then each sample's
        suffix; the suffix lengths), the layout of shared.protocol.ScoreRequest."""
        cut = self.prefix_len
        parts = [itertools.islice(self.token_ids[0], cut),
                 *(itertools.islice(ids, cut, None) for ids in self.token_ids)]
        flat = np.fromiter(itertools.chain.from_iterable(parts), dtype="<i4", count=self.tokens)
        return flat, tuple(len(ids) - cut for ids in self.token_ids)

    def finish(self, result: Any) -> bool:
        """Complete with a result; False when the job was already finished."""
        if self.state == DONE:
            return False
        self._close()
        if not self.future.cancelled():
            self.future.set_result(result)
        return True

    def fail(self, error: ApiError) -> bool:
        """Complete with an error answer; False when the job was already finished."""
        if self.state == DONE:
            return False
        self._close()
        if not self.future.cancelled():
            self.future.set_exception(error)
            self.future.exception()  # an error answer is an expected outcome: never log it as "unretrieved"
        return True

    def _close(self) -> None:
        self.state = DONE
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None


async def wait_all(jobs: list[Job], on_error: Callable[[Job, ApiError], None]) -> list[Any]:
    """Results of all jobs in order; at the first error, `on_error` each other job, then raise it."""
    if len(jobs) == 1:  # shielded: a handler cancelled (its client gone) leaves the job for the batcher to end
        return [await asyncio.shield(jobs[0].future)]
    pending = {job.future for job in jobs}
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
        error = next((f.exception() for f in done if f.exception() is not None), None)
        if error is not None:
            for job in jobs:
                on_error(job, error)  # type: ignore[arg-type]
            raise error
    return [job.future.result() for job in jobs]
