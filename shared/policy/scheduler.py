"""One workload's scheduler: the queue, the learnt lateness and every state change, for the gateway
and the simulator alike (pure: no I/O, no asyncio, no clock of its own).

The decisions were always pure functions (admission.py, batching.py, routing.py); what lived twice,
once in the gateway (gateway/batcher.py, admission.py, request_end.py) and once in the simulator
(loadgen/simulator.py), were the state changes around them, and the copies drifted (a worker's
expiry taught the simulator's lateness and not the gateway's; the finish recorded for a batch
resized for its worker was the resized one live and the plan's in the simulator). Here they are
made once, in the spirit of vLLM v1's SchedulerInterface (`schedule` / `update_from_output`):

  submit     precheck (before tokenizing) and admit: refuse (a Refusal), or queue the jobs;
             a queued job expires at its `deadline` (the shell's timer or event calls `expire`)
  step       route, drop predicted-late work, shed, pick the batch for a worker; its jobs leave the
             queue, are resized for that worker and carry the finish predicted for what it will
             compute (`dispatched`, the learnt lateness's reference); or a Hold, or nothing
  on_answer  a request's jobs were all answered: learn how late against `dispatched`
  on_failed  a request ended without an answer, for a reason (on_expired: the worker found it
             expired; on_overdue: no answer within the grace; on_lost: its worker was lost):
             its queued jobs leave the queue, and sent work that missed its deadline is learnt as
             at least that late

The shells keep only what is theirs: the gateway its asyncio timers, futures and sockets
(gateway/batcher.py), the simulator its event heap and fake clock (loadgen/simulator.py). Both can
keep a `DecisionLog`, so a test can show that one arrival sequence gets the same decisions in both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from shared.bounds import BatchBounds
from shared.policy.admission import AdmissionSettings, Lateness, PoolView, Prediction, admit, precheck
from shared.policy.batching import FinishEstimate, Hold, Worker, take_expired
from shared.policy.cost import CostModel
from shared.policy.deadline_queue import DeadlineQueue, QueueOrder, W
from shared.policy.drops import SENT_AND_MISSED, DropReason, Refusal
from shared.policy.routing import RecentHolders, dispatch_routed

K = TypeVar("K", bound=Worker)


@dataclass(frozen=True)
class SchedulerSettings:
    """[gateway] settings one workload's scheduler decides by (the bounds are its compiled batch's)."""

    bounds: BatchBounds
    admission: AdmissionSettings
    max_batch_wait_ms: float
    max_inflight_batches: int
    drop_late: bool = True
    """[gateway] drop_predicted_late."""
    order: QueueOrder = QueueOrder.DEADLINE


@dataclass(frozen=True)
class Batch(Generic[W, K]):
    """A step's batch: send `jobs` to `worker` (named `name`), predicted to take `predicted_ms`; the
    `dropped` jobs were answered predicted_late instead (already out of the queue)."""

    worker: K
    name: str
    jobs: list[W]
    predicted_ms: float
    dropped: list[W]


@dataclass(frozen=True)
class Drops(Generic[W]):
    """A step that only dropped (predicted late, or shed): answer them 504 predicted_late."""

    jobs: list[W]


@dataclass
class DecisionLog:
    """Every decision, in order: ("admit", t_us, request), ("refuse", t_us, request, reason),
    ("drop", t_us, request, reason), ("batch", t_us, worker, requests in the batch). Times in whole
    microseconds of the caller's clock (so two clocks that agree to the microsecond log alike)."""

    entries: list[tuple[Any, ...]] = field(default_factory=list)

    def add(self, kind: str, now_s: float, *what: Any) -> None:
        self.entries.append((kind, round(now_s * 1e6), *what))


class Scheduler(Generic[W, K]):
    """One workload's queue, learnt lateness and decisions (see the module docstring).

    `key_of(job)`: the request a job belongs to, as the log names it. `reuse_of(worker)`: what a job
    sent there is resized with (`job.resize(reuse_of(worker))`: the worker's held prefixes)."""

    def __init__(self, workload: str, settings: SchedulerSettings, key_of: Callable[[W], Any],
                 reuse_of: Callable[[K], Any], log: DecisionLog | None = None) -> None:
        self.workload = workload
        self.settings = settings
        self.queue: DeadlineQueue[W] = DeadlineQueue(settings.order)
        self.lateness = Lateness()
        """How much later than predicted at send its requests are answered: the slack of its drops
        and of admission's refusals."""
        self.log = log
        self._key_of = key_of
        self._reuse_of = reuse_of

    # -- arrivals ----------------------------------------------------------------------------------
    def precheck(self, request: Any, deadline: float, items: int, now_s: float, pool: PoolView,
                 model: CostModel | None, priority: int = 0) -> Refusal | None:
        """Before tokenizing: refuse when the wait where the request would run (at its `priority`), with
        the least its `items` can take, already misses `deadline`."""
        if model is None:
            return None
        refusal = precheck(self.queue, pool, model, deadline, now_s, self.settings.admission, self.lateness, items,
                           priority)
        if refusal is not None and self.log is not None:
            self.log.add("refuse", now_s, request, refusal.reason)
        return refusal

    def submit(self, jobs: Sequence[W], now_s: float, pool: PoolView, model: CostModel) -> Prediction | Refusal:
        """Admit the request's `jobs` (queued, each until its deadline) or refuse it (nothing queued)."""
        decision = admit(jobs, self.queue, pool, model, now_s, self.settings.admission, self.lateness)
        if self.log is not None:
            request = self._key_of(jobs[0])
            if isinstance(decision, Refusal):
                self.log.add("refuse", now_s, request, decision.reason)
            else:
                self.log.add("admit", now_s, request)
        if isinstance(decision, Prediction):
            for job in jobs:
                job.enqueued_at = now_s
                self.queue.push(job)
        return decision

    def expire(self, now_s: float) -> list[W]:
        """Take out the queued jobs whose deadline has passed (answer them 504 expired_in_queue)."""
        return take_expired(self.queue, now_s)

    # -- batching ----------------------------------------------------------------------------------
    def step(self, now_s: float, workers: Mapping[str, K], model_of: Callable[[K], CostModel],
             recent: RecentHolders) -> Batch[W, K] | Drops[W] | Hold | None:
        """The next decision for the queue's head: a Batch to send now, Drops to answer, a Hold (look
        again in `wait_ms`), or None (nothing to do until a job arrives or a worker frees a slot)."""
        if not self.queue:
            return None
        s = self.settings
        decision = dispatch_routed(self.queue, self.workload, s.bounds, workers, model_of, now_s,
                                   s.max_inflight_batches, recent, self.lateness.lead_ms(s.max_batch_wait_ms, now_s),
                                   s.drop_late, self.lateness.slack_ms(s.admission.margin_ms, now_s),
                                   s.admission.shed_by_cost)
        if decision is None or isinstance(decision, Hold):
            return decision
        worker, plan = decision
        for job in plan.late:
            self.queue.remove(job)
        if not plan.live:
            return Drops(plan.late)
        name = next(n for n, w in workers.items() if w is worker)
        predicted_ms = self._take(plan.live, worker, model_of(worker), now_s)
        if self.log is not None:
            self.log.add("batch", now_s, name, tuple(self._key_of(job) for job in plan.live))
        return Batch(worker, name, plan.live, predicted_ms, plan.late)

    def _take(self, jobs: list[W], worker: K, model: CostModel, now_s: float) -> float:
        """Out of the queue (it keeps totals), resized for `worker`, and the finish predicted for
        what it will compute recorded on each job; returns the batch's predicted ms."""
        reuse = self._reuse_of(worker)
        for job in jobs:
            self.queue.remove(job)
            job.resize(reuse)
        busy = worker.busy_ms(now_s)
        timing = FinishEstimate(model, now_s, busy)
        items, computed = sum(j.batch_items for j in jobs), sum(j.latency_tokens for j in jobs)
        predicted_ms = timing.predict_ms(items, computed)
        dispatched = Prediction(busy, predicted_ms, 0.0, timing.finish_at(items, computed))
        for job in jobs:
            job.dispatched = dispatched
        return predicted_ms

    def requeue(self, jobs: Iterable[W]) -> None:
        """A batch that could not be sent (its worker's socket would block): its jobs wait again."""
        for job in jobs:
            job.dispatched = None
            self.queue.push(job)

    # -- outcomes ----------------------------------------------------------------------------------
    def on_answer(self, jobs: Sequence[W], answered_at: float) -> None:
        """A request's jobs were all answered at `answered_at`: learn how late against the finish
        predicted when each was sent."""
        for job in jobs:
            if job.dispatched is not None:
                self.lateness.observe(job.dispatched, answered_at)

    def on_failed(self, jobs: Sequence[W], reason: str | None, now_s: float) -> None:
        """A request ended without an answer (`reason`: its drop reason, None when it was not a drop:
        a sibling's worker error, the client gone). Its queued jobs leave the queue; sent work that
        missed its deadline (SENT_AND_MISSED) would have been answered no earlier than the deadline,
        and is learnt as at least that late."""
        for job in jobs:
            self.queue.remove(job)
        if reason in SENT_AND_MISSED:
            deadline = min(job.deadline for job in jobs)
            for job in jobs:
                if job.dispatched is not None:
                    self.lateness.observe_missed(job.dispatched, deadline)
        if reason is not None and self.log is not None:
            self.log.add("drop", now_s, self._key_of(jobs[0]), str(reason))

    def on_expired(self, jobs: Sequence[W], now_s: float) -> None:
        """The worker found the request's work expired before computing it."""
        self.on_failed(jobs, DropReason.EXPIRED_IN_WORKER, now_s)

    def on_overdue(self, jobs: Sequence[W], now_s: float) -> None:
        """No answer came within the grace after the deadline."""
        self.on_failed(jobs, DropReason.WORKER_OVERDUE, now_s)

    def on_lost(self, jobs: Sequence[W], now_s: float) -> None:
        """The worker computing it was lost."""
        self.on_failed(jobs, DropReason.WORKER_LOST, now_s)
