"""The one job type: a unit of queued work (a whole request, or one chunk of a large scoring
request), the same in the gateway and the simulator (pure: no I/O, no asyncio).

What the scheduler reads and records of it lives here: its deadline and priority, its size (one
WorkSize, shared/work.py: a shared prefix sent once and counted once in `tokens`; `latency_tokens`
leave out the tokens its worker reuses), its prefix's routing key, where it is (queued, sent,
done) and the finish predicted when it was sent. What only its shell needs rides in `handle`: the
gateway's future and timer (gateway/job.py), the simulator's trace index (loadgen/sim_world.py).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.policy.admission import Prediction
from shared.work import NO_REUSE, Reuse, WorkSize, counted_by_work


class JobState(enum.StrEnum):
    """Where a job is: in the queue, sent to a worker, or finished (answered or failed)."""

    QUEUED = "queued"
    SENT = "sent"
    DONE = "done"


QUEUED, SENT, DONE = JobState


@counted_by_work
@dataclass(eq=False)
class Job:
    """Work for one request (or chunk) on its way through queue, batch and worker."""

    request_id: str
    """Unique on the wire: the request's id, plus `#k` for chunk k of a split request."""
    workload: str
    """score | beam"""
    deadline: float
    """Absolute, seconds on the caller's clock."""
    token_ids: Sequence[Sequence[int]]
    """score: one sequence per sample, whole (prefix included); beam: one (the prompt). The simulator's
    are stand-ins (ranges) of the recorded lengths."""
    label_ids: tuple[int, ...] = ()
    top_k: int = 0
    return_hidden: bool = False
    beam_key: tuple[int, int, int] | None = None
    """beam: (num_beams, max_new_tokens, num_return_sequences); batches share one key."""
    prefix_len: int = 0
    """score: the first prefix_len ids of every sample are the same and are sent and computed once."""
    prompt_logprobs: int | None = None
    """score: per-token prompt log-probs with this many top tokens per position (None: not asked)."""
    reuse: Any = NO_REUSE
    """Where leading tokens' keys/values already exist: a shared/work Reuse (the gateway: the static
    prefix and the held prefixes of the worker it is expected on), or what `sizer` reads."""
    prefix_key: int | None = None
    """score with a shared prefix: its routing key (shared/policy/routing.py); None: placed on the least busy."""
    priority: int = 0
    """Larger is served first and given up last (shared/policy/deadline_queue.py)."""
    catalog: str = ""
    """beam, constrained: the loaded catalogue it decodes in (a market, ...); "": the default one."""
    sizer: Callable[[Job, Any], WorkSize] | None = None
    """What it sends and computes where `reuse` holds (None: WorkSize.of its ids; the simulator's
    modelled prefix caches name contexts, not ids: loadgen/sim_world.py)."""
    handle: Any = None
    """Its shell's: the gateway's future and timer, the simulator's trace index."""
    state: JobState = QUEUED
    enqueued_at: float = 0.0
    compute_ms: float = 0.0
    """Its share of the compute of the batch that served it, as the worker reported it."""
    dispatched: Prediction | None = None
    """The finish predicted when it was sent (its batch's, behind the worker's work in flight)."""

    work: WorkSize = field(init=False)
    """What it sends, computes and reuses; the policy's counts (samples, tokens, batch_items,
    latency_tokens) are its answers (shared/work.counted_by_work)."""

    def __post_init__(self) -> None:
        self.work = self._size(self.reuse)

    def resize(self, reuse: Reuse | Any) -> None:
        """Size it for a worker with `reuse` (never while it is queued: the queue keeps totals)."""
        if not self.beam_key and (self.sizer is not None or reuse != self.reuse):  # a sizer's reuse may change inside
            self.reuse, self.work = reuse, self._size(reuse)

    def _size(self, reuse: Any) -> WorkSize:
        if self.beam_key:
            return WorkSize.prompt(len(self.token_ids[0]), self.beam_key[0])
        if self.sizer is not None:
            return self.sizer(self, reuse)
        return WorkSize.of(self.token_ids, self.prefix_len, reuse)
