"""The scheduling policy the gateway serves with and the simulator replays: one set of functions.

Pure: no I/O, no asyncio, no clock of its own. Callers pass the queue, the time (`now_s`, seconds
on their own monotonic clock, the clock deadlines are kept on) and the predictions (a cost model,
how busy the workers are); the functions return decisions. gateway/admission.py and
gateway/batcher.py are thin async shells around them and loadgen/simulator.py drives them from its
event loop, so a setting tuned offline means the same thing live.

  admission  precheck: the queue's predicted wait alone misses the deadline (refused before any
             tokenizing); admit: the queue's token budget is spent (429 queue_full) or the
             predicted finish is past the deadline (503 deadline_unmeetable). Predicted finish =
             the soonest-free worker's work in flight + the queued work and this request's, in full
             batches shared by the ready workers, + margin + learnt lateness. A probe is admitted
             anyway while no measured batch has confirmed the start-up profile and nothing else is
             queued or running (refusing everything would never produce the measurements).
  batching   one deadline-ordered queue per workload; a batch takes jobs in deadline order up to
             the compiled bounds, looking past at most SCAN_LIMIT jobs that do not fit; a partial
             batch waits while its worker is predicted busy for longer than max_batch_wait_ms.
  drops      one set of reasons (DROP_CODES); expired_in_queue, predicted_late (the batch would
             finish past a member's deadline behind the worker's work in flight), the worker's
             expired_in_worker and worker_overdue (no answer within the grace after the deadline)
             are all answered 504 deadline_exceeded.
Without deadline predictions (`AdmissionSettings.predict` false: the FCFS ablation) nothing is
refused for its deadline and nothing dropped as predicted late; the queue budget still holds and
requests still expire at their deadline.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

SCAN_LIMIT = 8
"""Queued jobs that did not fit, looked past per batch (keeps forming a batch cheap in a long queue)."""
MIN_HOLD_MS = 0.05
"""A shorter hold is not worth a timer: the batch goes now."""
LATE_QUANTILE, LATE_STEP_MS = 0.9, 0.25
DROP_CODES = {
    "queue_full": "queue_full",
    "deadline_unmeetable": "deadline_unmeetable",
    "expired_in_queue": "deadline_exceeded",
    "predicted_late": "deadline_exceeded",
    "expired_in_worker": "deadline_exceeded",
    "worker_overdue": "deadline_exceeded",
}
"""Drop reason -> the API error code it is answered with (gateway/errors.py gives the HTTP status)."""


class Work(Protocol):
    """What the policy reads of a queued job (gateway/job.py's Job; the simulator's jobs)."""

    deadline: float
    samples: int
    tokens: int
    """Tokens the worker computes for this job (the queue budget counts these)."""
    batch_items: int
    latency_tokens: int
    label_ids: tuple[int, ...]
    beam_key: tuple[int, int, int] | None


class CostModel(Protocol):
    """A worker's latency prediction (gateway/latency.py's CorrectedModel)."""

    @property
    def verified(self) -> bool: ...

    def predict_ms(self, batch_items: float, tokens_per_item: float) -> float: ...

    def backlog_ms(self, items: int, tokens: int) -> float: ...


W = TypeVar("W", bound=Work)


@dataclass(frozen=True)
class Refusal:
    """A request answered without compute: the drop reason, a message for the caller, Retry-After."""

    reason: str
    message: str
    retry_after_s: float | None = None

    @property
    def code(self) -> str:
        return DROP_CODES[self.reason]


class DeadlineQueue(Generic[W]):
    """Queued jobs of one workload in deadline order (ties: arrival order), with the totals
    admission reads. Removal is eager, so every job in it is still waiting."""

    def __init__(self) -> None:
        self._entries: list[tuple[float, int, W]] = []  # sorted by (deadline, arrival number)
        self._keys: dict[int, tuple[float, int]] = {}  # id(job) -> its sort key
        self._arrivals = itertools.count()
        self.jobs = self.tokens = self.items = self.latency_tokens = 0

    def __len__(self) -> int:
        return self.jobs

    def __contains__(self, job: object) -> bool:
        return id(job) in self._keys

    def push(self, job: W) -> None:
        key = (job.deadline, next(self._arrivals))
        self._keys[id(job)] = key
        bisect.insort(self._entries, (*key, job))
        self._count(job, 1)

    def remove(self, job: W) -> bool:
        """Take `job` out; False when it was not queued (sent, expired or cancelled already)."""
        key = self._keys.pop(id(job), None)
        if key is None:
            return False
        del self._entries[bisect.bisect_left(self._entries, key)]  # (d, n) sorts just before (d, n, job)
        self._count(job, -1)
        return True

    def in_order(self) -> Iterable[W]:
        return (entry[2] for entry in self._entries)

    def earliest_deadline(self) -> float | None:
        return self._entries[0][0] if self._entries else None

    def _count(self, job: W, sign: int) -> None:
        self.jobs += sign
        self.tokens += sign * job.tokens
        self.items += sign * job.batch_items
        self.latency_tokens += sign * job.latency_tokens


# ---- admission ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class AdmissionSettings:
    """[gateway] max_queue_tokens, admission_margin_ms and admission (deadline predictions on/off)."""

    max_queue_tokens: int
    margin_ms: float
    predict: bool = True


@dataclass(frozen=True)
class PoolView:
    """What admission needs to know about the workers serving one workload, now."""

    ready_workers: int
    soonest_free_ms: float
    """Predicted ms until some ready worker has finished its work in flight."""
    batches_in_flight: int


@dataclass(frozen=True)
class Prediction:
    """Why a request was admitted: the predicted milliseconds of each part."""

    wait_ms: float
    service_ms: float
    budget_ms: float
    finish_at: float = 0.0
    """Predicted finish on the caller's clock (s), before the learnt lateness is added."""


class Lateness:
    """How much later than predicted admitted requests of one workload really finish: an online
    estimate of its 90th percentile (stochastic approximation in steps of LATE_STEP_MS)."""

    def __init__(self, quantile: float = LATE_QUANTILE, step_ms: float = LATE_STEP_MS) -> None:
        self.quantile = quantile
        self.step_ms = step_ms
        self.value = 0.0
        """Milliseconds."""

    def observe(self, prediction: Prediction, finished_at: float) -> None:
        late_ms = (finished_at - prediction.finish_at) * 1000.0
        if math.isfinite(late_ms):
            self.value += self.step_ms * (self.quantile - (1.0 if late_ms < self.value else 0.0))

    def slack_ms(self, margin_ms: float) -> float:
        """Added to every predicted finish: the margin, plus the lateness when it is positive."""
        return margin_ms + max(0.0, self.value)


def is_probe(model: CostModel, queue: DeadlineQueue, pool: PoolView) -> bool:
    """Admit anyway: the start-up profile is unconfirmed and nothing else is queued or running."""
    return not model.verified and queue.jobs == 0 and pool.batches_in_flight == 0


def finish_ms(queue: DeadlineQueue, pool: PoolView, model: CostModel, items: int = 0, tokens: int = 0) -> float:
    """Predicted ms until the queue, plus `items`/`tokens` of new work behind it, is served: the
    soonest-free worker's work in flight, then that work in full batches shared by the ready
    workers. All of the queue counts as ahead: with one SLO per route later arrivals have later
    deadlines, and the bound errs on the side of refusing rather than answering late."""
    backlog = model.backlog_ms(queue.items + items, queue.latency_tokens + tokens)
    return pool.soonest_free_ms + backlog / max(1, pool.ready_workers)


def precheck(queue: DeadlineQueue, pool: PoolView, model: CostModel, deadline_s: float, now_s: float,
             settings: AdmissionSettings, lateness: Lateness) -> Refusal | None:
    """Refuse before any tokenizing when the queue's predicted wait alone misses the deadline."""
    if not settings.predict:
        return None
    wait_ms = finish_ms(queue, pool, model)
    budget_ms = (deadline_s - now_s) * 1000.0
    slack_ms = lateness.slack_ms(settings.margin_ms)
    if wait_ms + slack_ms <= budget_ms or is_probe(model, queue, pool):
        return None
    return Refusal("deadline_unmeetable", f"the predicted queue wait of {wait_ms:.1f} ms (+ margin {slack_ms:.1f} "
                                          f"ms) is already past the deadline of {budget_ms:.1f} ms; refused "
                                          "before any work")


def admit(jobs: Sequence[Work], queue: DeadlineQueue, pool: PoolView, model: CostModel, now_s: float,
          settings: AdmissionSettings, lateness: Lateness) -> Prediction | Refusal:
    """The prediction for a request's jobs, or why it is refused (queue_full, deadline_unmeetable)."""
    budget_ms = (min(j.deadline for j in jobs) - now_s) * 1000.0
    items, tokens = sum(j.batch_items for j in jobs), sum(j.latency_tokens for j in jobs)
    done_ms = finish_ms(queue, pool, model, items, tokens)
    service_ms = model.backlog_ms(items, tokens)
    wait_ms = max(0.0, done_ms - service_ms)
    prediction = Prediction(wait_ms, service_ms, budget_ms, now_s + done_ms / 1000.0)
    real_tokens = sum(j.tokens for j in jobs)
    if queue.tokens + real_tokens > settings.max_queue_tokens and queue.jobs > 0:
        return Refusal("queue_full", f"the queue holds {queue.tokens} tokens; with this request's {real_tokens} it "
                                     f"would pass its budget of {settings.max_queue_tokens}",
                       retry_after_s=finish_ms(queue, pool, model) / 1000.0)
    slack_ms = lateness.slack_ms(settings.margin_ms)
    if not settings.predict or wait_ms + service_ms + slack_ms <= budget_ms or is_probe(model, queue, pool):
        return prediction
    return Refusal("deadline_unmeetable", f"predicted finish in {wait_ms + service_ms:.1f} ms (queue wait "
                                          f"{wait_ms:.1f} ms + service {service_ms:.1f} ms + margin {slack_ms:.1f} "
                                          f"ms) is past the deadline of {budget_ms:.1f} ms; refused before any work")


# ---- batching and drops -------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchBounds:
    """What one packed batch may hold (from the manifest's bounds)."""

    max_jobs: int
    """score: samples per batch; beam: requests per batch."""
    max_tokens: int
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
    return (samples + job.samples <= bounds.max_jobs and tokens + job.tokens <= bounds.max_tokens
            and (labels.issuperset(job.label_ids) or len(labels.union(job.label_ids)) <= bounds.max_labels))


def plan_batch(queue: DeadlineQueue[W], workload: str, bounds: BatchBounds, model: CostModel, worker_busy_ms: float,
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
