"""Batching: deadline-ordered batch formation and fill, holds, predicted-late drops, expiry (pure)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from shared.bounds import BatchBounds
from shared.policy.cost import CostModel
from shared.policy.deadline_queue import DeadlineQueue, W, Work

SCAN_LIMIT = 8
"""Queued jobs that did not fit, looked past per batch (keeps forming a batch cheap in a long queue)."""
FOREIGN_SCAN_LIMIT = 64
"""Queued jobs placed on another worker (`accept` said no), looked past per batch."""
MIN_HOLD_MS = 0.05
"""A shorter hold is not worth a timer: the batch goes now."""


@dataclass(frozen=True)
class Hold:
    """Keep the batch queued (gathering companions) for up to `wait_ms`."""

    wait_ms: float


@dataclass(frozen=True)
class Send(Generic[W]):
    """Send `live` as one batch now; answer `late` 504 predicted_late instead of sending them."""

    live: list[W]
    late: list[W]
    predicted_ms: float
    finish_at: float
    """Predicted finish of the batch behind the worker's work in flight (caller's clock, s)."""


def busy_ms(in_flight: Iterable[tuple[float, float, float]], now_s: float, free_since: float = -math.inf) -> float:
    """Predicted ms, from now, that a batch sent now would wait at a worker before it starts, given its
    (sent_at_s, predicted_ms, overhead_ms) batches in flight (`free_since`: when its last answer came).

    A prediction is the batch's round trip: its compute plus `overhead_ms`, the time outside the
    compute (messages, decoding, wake-ups), half on the way there and half on the way back. The
    worker computes one batch after another, so that time overlaps the batch before when several are
    in flight: each starts half its overhead after its send or when the one before it ends, whichever
    is later (the answered one ended half an overhead before its answer came), and takes its compute;
    a batch sent now arrives half an overhead from now. Summing whole round trips instead would count
    every overhead once per batch in flight and hold the next batch until the worker had gone idle."""
    batches = sorted(in_flight)
    if not batches:
        return 0.0
    half_s = batches[0][2] / 2000.0
    free = free_since - half_s
    for sent, predicted, overhead in batches:
        half_s = overhead / 2000.0
        free = max(sent + half_s, free) + max(0.0, predicted - overhead) / 1000.0
    return max(0.0, (free - now_s - half_s) * 1000.0)


class Worker(Protocol):
    """What placement reads of a worker (gateway.worker_link.WorkerLink, the simulator's SimWorker)."""

    in_flight: Sized

    def busy_ms(self, now_s: float) -> float: ...


K = TypeVar("K", bound=Worker)


def least_busy(workers: Iterable[K], now_s: float, max_inflight_batches: int) -> K | None:
    """Where the next batch goes: of the workers with a free slot, the one with the least predicted
    work in flight (then the fewest batches); None when every slot is taken."""
    free = [w for w in workers if len(w.in_flight) < max_inflight_batches]
    return min(free, key=lambda w: (w.busy_ms(now_s), len(w.in_flight)), default=None)


@dataclass(frozen=True)
class FinishEstimate:
    """When a batch sent now would finish: behind the worker's work in flight, at the model's speed."""

    model: CostModel
    now_s: float
    busy_ms: float
    slack_ms: float = 0.0
    """Added to a finish when it is checked against a deadline: the margin and the learnt lateness of
    the batches' answers (their way back to the client, the model's error)."""

    def finish_at(self, items: int, latency_tokens: int) -> float:
        """Predicted finish (caller's clock, s) of a batch of `items` items and `latency_tokens` tokens."""
        return self.now_s + (self.busy_ms + self.predict_ms(items, latency_tokens)) / 1000.0

    def in_time(self, items: int, latency_tokens: int, deadline: float) -> bool:
        return self.finish_at(items, latency_tokens) + self.slack_ms / 1000.0 <= deadline

    def predict_ms(self, items: int, latency_tokens: int) -> float:
        return self.model.predict_ms(items, latency_tokens / max(1, items))


def shed_costliest(jobs: Iterable[W], model: CostModel, free_ms: float, workers: int, now_ms: float,
                   reached: dict[int, float] | None = None, gain: float = 1.0) -> set[int]:
    """The jobs (their id()) that a schedule of `jobs`, served in this order in full batches shared
    by `workers` workers from `free_ms` on, sheds so that every other one finishes by its deadline
    (ms on the caller's clock: `now_ms` carries the slack): the costliest per answer first, not the
    latest in the order (Moore and Hodgson's rule for the most jobs in time on one machine).

    Walking the order, a job that would finish past its deadline sheds a kept job of a lower priority
    (the lowest first, the costliest of it) if shedding that brings it in time, else the kept job of
    its own priority that costs the most predicted ms alone (ties: the latest in the order), if that
    one costs more than `gain` x its own and shedding it brings it in time; else it is shed itself,
    and a job of a larger priority is never shed for it (so where every job costs the
    same this sheds exactly the jobs a walk that skips late ones skips; one late job never sheds
    more than one other, and a job late even alone sheds nothing but itself). Nothing is shed while
    every job is in time. Admission passes a `gain` above 1 (ADMIT_SHED_GAIN: admission.py).

    `reached`: for each job whose id() is a key, set to its predicted finish (ms from `free_ms`'s
    origin, the caller's now) where the walk reaches it, behind the jobs kept so far (less the one
    it sheds, if it sheds one): admission's prediction for a new request, in the same walk.

    A large request's fate, plainly: under overload it is the first shed, and is served only with
    the room the cheaper ones leave (docs/design/scheduling.md, "Shedding by cost")."""
    in_time: list[W] = []  # the jobs kept before the first late one (their costs are read only then)
    kept: list[tuple[int, float, int, W]] | None = None  # then a heap: lowest priority, then costliest, then latest
    shed: set[int] = set()
    items = tokens = 0
    for position, job in enumerate(jobs):  # hot: a pass per admission and per batch, so plain arithmetic
        items, tokens = items + job.batch_items, tokens + job.latency_tokens
        due_ms, finish_ms = job.deadline * 1000.0 - now_ms, free_ms + model.backlog_ms(items, tokens) / workers
        if reached is not None and id(job) in reached:
            reached[id(job)] = finish_ms
        if finish_ms <= due_ms:
            if kept is None:
                in_time.append(job)
            else:
                heapq.heappush(kept, (job.priority, -model.backlog_ms(job.batch_items, job.latency_tokens), -position,
                                      job))
            continue
        if kept is None:
            kept = [(j.priority, -model.backlog_ms(j.batch_items, j.latency_tokens), -p, j)
                    for p, j in enumerate(in_time)]
            heapq.heapify(kept)
        cost = model.backlog_ms(job.batch_items, job.latency_tokens)
        if kept and (kept[0][0] < job.priority or (kept[0][0] == job.priority and -kept[0][1] > gain * cost)):
            costliest = kept[0][3]
            less_items, less_tokens = items - costliest.batch_items, tokens - costliest.latency_tokens
            if (less_ms := free_ms + model.backlog_ms(less_items, less_tokens) / workers) <= due_ms:
                if reached is not None and id(job) in reached:
                    reached[id(job)] = less_ms
                heapq.heapreplace(kept, (job.priority, -cost, -position, job))
                shed.add(id(costliest))
                items, tokens = less_items, less_tokens
                continue
        shed.add(id(job))
        items, tokens = items - job.batch_items, tokens - job.latency_tokens
    return shed


def form_batch(queue: DeadlineQueue[W], workload: str, bounds: BatchBounds,
               timing: FinishEstimate | None = None, accept: Callable[[W], bool] | None = None) -> tuple[list[W], list[W]]:
    """The next batch's jobs in serving order, up to the compiled bounds (looking past at most
    SCAN_LIMIT jobs that do not fit). With `timing`, a job joins only if the batch still finishes
    before every member's deadline, its own included, and the jobs that cannot finish in time even
    alone are returned apart (second value) instead. With `accept`, only the jobs it accepts are
    considered (those placed on this batch's worker: routing.py; at most FOREIGN_SCAN_LIMIT others
    are looked past)."""
    taken: list[W] = []
    doomed: list[W] = []
    samples, tokens, items, computed, labels, skipped, foreign = 0, 0, 0, 0, set(), 0, 0
    due = math.inf  # the earliest deadline in the batch
    for job in queue.in_order():
        if accept is not None and not accept(job):
            foreign += 1
            if foreign >= FOREIGN_SCAN_LIMIT:
                break
            continue
        if timing is not None and not timing.in_time(job.batch_items, job.latency_tokens, job.deadline):
            doomed.append(job)
            continue
        late = timing is not None and taken and not timing.in_time(
            items + job.batch_items, computed + job.latency_tokens, min(due, job.deadline))
        if taken and (late or not _fits(job, taken, samples, tokens, labels, workload, bounds)):
            skipped += 1
            if skipped >= SCAN_LIMIT:
                break
            continue
        taken.append(job)
        samples, tokens, labels = samples + job.samples, tokens + job.tokens, labels | set(job.label_ids)
        items, computed, due = items + job.batch_items, computed + job.latency_tokens, min(due, job.deadline)
        if (samples if workload == "score" else len(taken)) >= bounds.max_items_per_batch or len(taken) == bounds.max_jobs_per_batch:
            break
    return taken, doomed


def _fits(job: Work, taken: list[Work], samples: int, tokens: int, labels: set[int], workload: str,
          bounds: BatchBounds) -> bool:
    if bounds.max_jobs_per_batch and len(taken) >= bounds.max_jobs_per_batch:
        return False
    if workload == "beam":
        return job.beam_key == taken[0].beam_key and len(taken) < bounds.max_items_per_batch
    return (samples + job.samples <= bounds.max_items_per_batch
            and (bounds.max_tokens_per_batch is None or tokens + job.tokens <= bounds.max_tokens_per_batch)
            and (labels.issuperset(job.label_ids) or len(labels.union(job.label_ids)) <= bounds.max_labels))


def dispatch(queue: DeadlineQueue[W], workload: str, bounds: BatchBounds, model: CostModel, worker_busy_ms: float,
             lead_ms: float, now_s: float, drop_late: bool = True, slack_ms: float = 0.0,
             shed_by_cost: bool = False, workers: int = 1,
             accept: Callable[[W], bool] | None = None) -> Hold | Send[W]:
    """What to do with the head of the queue for a worker with a free slot that is predicted busy for
    `worker_busy_ms`. A batch sent to a busy worker would only wait in its FIFO, where nothing can
    overtake it: it stays here (in serving order, where a later, tighter deadline can still join or
    pass it) until the worker is predicted free within lead_ms (the batch wait plus the loop's present lag: Lateness.lead_ms).

    With `drop_late` and a trusted model (measured batches confirmed it), a job that cannot finish
    in time even alone is dropped before any compute (when the slack would drop every queued job
    and the worker is idle, by its prediction alone: the slack is learnt from answers, and dropping
    everything would never produce one), and of two plans the one that answers more
    jobs in time per predicted millisecond is taken: the batch packed to the bounds, less the
    members it would make late (dropped); or the batch of only those companions that keep every
    member in time, then the rest of the packed batch after it (the second batch pays its own fixed
    cost, and what it would make late counts against the plan). Where a batch's fixed cost is large,
    packing wins; where a tight deadline would wait behind a large batch, the short batch goes.

    With `shed_by_cost` too, when the queue, served in order from this worker's free time in full
    batches shared by `workers` workers, cannot finish every job in time, the jobs `shed_costliest`
    picks (the costliest per answer) are dropped before compute (`late`), so that the rest can be;
    while every queued job is predicted in time it changes nothing. The shedding plans for the whole
    queue, whatever `accept` keeps.

    `accept`: the jobs placed on this worker (the others stay queued for theirs; form_batch)."""
    hold_ms = worker_busy_ms - lead_ms
    if hold_ms > MIN_HOLD_MS:
        return Hold(hold_ms)
    timing = FinishEstimate(model, now_s, worker_busy_ms, slack_ms)
    if not (drop_late and model.verified):
        return _send(form_batch(queue, workload, bounds, accept=accept)[0], [], timing)
    shed = shed_costliest(queue.in_order(), model, worker_busy_ms, workers, now_s * 1000.0 + slack_ms) \
        if shed_by_cost else ()
    if shed and not (worker_busy_ms <= 0 and len(shed) == queue.jobs):  # not all: the probe below decides
        return Send([], [j for j in queue.in_order() if id(j) in shed], 0.0, now_s)
    packed, _ = form_batch(queue, workload, bounds, accept=accept)
    short, doomed = form_batch(queue, workload, bounds, timing, accept)
    if not short and worker_busy_ms <= 0:  # a probe: a slack that drops everything would never be measured again
        timing = FinishEstimate(model, now_s, worker_busy_ms)
        short, doomed = form_batch(queue, workload, bounds, timing, accept)
    if doomed:
        return Send([], doomed, 0.0, now_s)
    packed_ms, late = _plan(packed, timing)
    rest = [j for j in packed if j not in short]
    if not rest:
        return _send(short, [], timing)
    short_ms, _ = _plan(short, timing)
    rest_ms, rest_late = _plan(rest, FinishEstimate(model, now_s, worker_busy_ms + short_ms, slack_ms))
    if (len(packed) - len(late)) * (short_ms + rest_ms) > (len(packed) - len(rest_late)) * packed_ms:
        return _send([j for j in packed if j not in late], late, timing)
    return _send(short, [], timing)


def _plan(jobs: list[W], timing: FinishEstimate) -> tuple[float, list[W]]:
    """The predicted ms of `jobs` as one batch, and those of them it would finish late."""
    items, computed = sum(j.batch_items for j in jobs), sum(j.latency_tokens for j in jobs)
    return timing.predict_ms(items, computed), [j for j in jobs if not timing.in_time(items, computed, j.deadline)]


def _send(live: list[W], late: list[W], timing: FinishEstimate) -> Send[W]:
    items, computed = sum(j.batch_items for j in live), sum(j.latency_tokens for j in live)
    return Send(live, late, timing.predict_ms(items, computed), timing.finish_at(items, computed))


def take_expired(queue: DeadlineQueue[W], now_s: float) -> list[W]:
    """Remove and return the queued jobs whose deadline has passed (answered 504 expired_in_queue)."""
    expired = []
    while (deadline := queue.earliest_deadline()) is not None and deadline <= now_s:
        job = queue.earliest()
        queue.remove(job)
        expired.append(job)
    return expired
