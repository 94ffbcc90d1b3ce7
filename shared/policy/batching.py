"""Batching: deadline-ordered batch formation and fill, holds, predicted-late drops, expiry (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Sized
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from shared.policy.cost import CostModel
from shared.policy.deadline_queue import DeadlineQueue, W, Work

SCAN_LIMIT = 8
"""Queued jobs that did not fit, looked past per batch (keeps forming a batch cheap in a long queue)."""
MIN_HOLD_MS = 0.05
"""A shorter hold is not worth a timer: the batch goes now."""


@dataclass(frozen=True)
class BatchBounds:
    """What one packed batch may hold (from the manifest's bounds)."""

    max_jobs: int
    """score: samples per batch; beam: requests per batch."""
    max_tokens: int | None
    """Tokens sent per batch; None = no token bound (beam batches: each prompt is bounded alone)."""
    max_labels: int
    max_requests: int = 0
    """Jobs per batch besides the bounds; 0 = no limit (1 turns batching off: the simulator's G/G/1)."""


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


def busy_ms(in_flight: Iterable[tuple[float, float]], now_s: float) -> float:
    """Predicted ms until a worker has done its (sent_at_s, predicted_ms) batches, run one after another
    from the first send."""
    batches = list(in_flight)
    if not batches:
        return 0.0
    first = min(sent for sent, _ in batches)
    return max(0.0, sum(ms for _, ms in batches) - (now_s - first) * 1000.0)


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


def form_batch(queue: DeadlineQueue[W], workload: str, bounds: BatchBounds) -> tuple[list[W], bool]:
    """The next batch's jobs in deadline order, and whether it is full (a bound reached, or a
    queued job did not fit)."""
    taken: list[W] = []
    samples, tokens, labels, skipped, full = 0, 0, set(), 0, False
    for job in queue.in_order():
        if taken and not _fits(job, taken, samples, tokens, labels, workload, bounds):
            skipped, full = skipped + 1, True
            if skipped >= SCAN_LIMIT:
                break
            continue
        taken.append(job)
        samples, tokens = samples + job.samples, tokens + job.tokens
        labels.update(job.label_ids)
        reached = (samples if workload == "score" else len(taken)) >= bounds.max_jobs
        if reached or len(taken) == bounds.max_requests:
            full = True
            break
    return taken, full


def _fits(job: Work, taken: list[Work], samples: int, tokens: int, labels: set[int], workload: str,
          bounds: BatchBounds) -> bool:
    if bounds.max_requests and len(taken) >= bounds.max_requests:
        return False
    if workload == "beam":
        return job.beam_key == taken[0].beam_key and len(taken) < bounds.max_jobs
    return (samples + job.samples <= bounds.max_jobs
            and (bounds.max_tokens is None or tokens + job.tokens <= bounds.max_tokens)
            and (labels.issuperset(job.label_ids) or len(labels.union(job.label_ids)) <= bounds.max_labels))


def dispatch(queue: DeadlineQueue[W], workload: str, bounds: BatchBounds, model: CostModel, worker_busy_ms: float,
               max_wait_ms: float, now_s: float, predict: bool = True) -> Hold | Send[W]:
    """What to do with the head of the queue for a worker with a free slot that is predicted busy for
    `worker_busy_ms`. A partial batch sent to a busy worker would only wait in its FIFO: it stays here
    (in deadline order, gathering companions) until the worker is predicted free within max_wait_ms.
    A trusted model (measured batches confirmed it) drops the members predicted to finish late."""
    jobs, full = form_batch(queue, workload, bounds)
    hold_ms = worker_busy_ms - max_wait_ms
    if not full and hold_ms > MIN_HOLD_MS:
        return Hold(hold_ms)
    items = sum(j.batch_items for j in jobs)
    predicted_ms = model.predict_ms(items, sum(j.latency_tokens for j in jobs) / max(1, items))
    finish_at = now_s + (worker_busy_ms + predicted_ms) / 1000.0
    drop = predict and model.verified
    late = [j for j in jobs if drop and finish_at > j.deadline]
    live = [j for j in jobs if not (drop and finish_at > j.deadline)]
    return Send(live, late, predicted_ms, finish_at)


def take_expired(queue: DeadlineQueue[W], now_s: float) -> list[W]:
    """Remove and return the queued jobs whose deadline has passed (answered 504 expired_in_queue)."""
    expired = []
    while (deadline := queue.earliest_deadline()) is not None and deadline <= now_s:
        job = next(iter(queue.in_order()))
        queue.remove(job)
        expired.append(job)
    return expired


def chunk_bounds(lengths: Sequence[int], max_samples: int, max_tokens: int) -> list[tuple[int, int]]:
    """[start, end) sample ranges of a scoring request cut into consecutive chunks that each fit one
    batch (at most `max_samples` samples and `max_tokens` tokens; a longer sample stays alone)."""
    chunks, start, tokens = [], 0, 0
    for i, length in enumerate(lengths):
        if i > start and (i - start == max_samples or tokens + length > max_tokens):
            chunks.append((start, i))
            start, tokens = i, 0
        tokens += length
    if lengths:
        chunks.append((start, len(lengths)))
    return chunks
