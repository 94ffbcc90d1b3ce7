"""Admission: precheck, predicted finish, probes, learnt lateness, the queue budget (pure)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from shared.policy.batching import shed_costliest
from shared.policy.cost import CostModel
from shared.policy.deadline_queue import DeadlineQueue, Work
from shared.policy.drops import DropReason, Refusal

LATE_QUANTILE, LATE_STEP_MS, LATE_STEP_SHARE = 0.98, 0.25, 0.25
LAG_HALF_LIFE_MS = 50.0
"""The present lag (`PresentLag`) halves every this many ms once the loop is on time again, so a burst's
lag is gone a few half-lives after it ends."""
ADMIT_SHED_GAIN = 1.05
"""With shed_by_cost, a new request gets in by shedding a queued one only if that one costs more than
this x the request (the batcher, among admitted work, sheds any costlier one: `shed_costliest`'s
gain 1). A cost difference within the model's error is no reason to give up a request already
admitted: with any costlier one, the simulator (bench/overload_sim.py) answered a large share of
requests 504 after admitting them, nearly all swaps of a queued request for a newcomer a few tokens
cheaper, for a goodput gain within the model's error (docs/design/scheduling.md)."""


@dataclass(frozen=True)
class AdmissionSettings:
    """[gateway] max_queue_tokens, admission_margin_ms, admission (refusing early on the predicted
    finish) and shed_by_cost (under overload, refuse and shed the costliest per answer first)."""

    max_queue_tokens: int
    margin_ms: float
    refuse_early: bool = True
    shed_by_cost: bool = False
    """With refuse_early: a request is refused when `shed_costliest`, run over the queue with it in
    its place, sheds it (not when its own finish misses its deadline: it may get in by shedding a
    costlier queued job, which the batcher then drops before compute); the batcher sheds the same
    way. Under overload the largest requests are the first refused or dropped."""


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


class PresentLag:
    """How late the gateway's event loop runs now, in ms: the largest lag sampled, halved every
    `half_life_ms` since it was sampled. A burst of arrivals that keeps the loop busy delays every
    answer on its way back by as much; the lag raises this at once, and once the loop is on time
    again it is gone within a few hundred ms (a slowly learnt percentile held it for seconds)."""

    def __init__(self, half_life_ms: float = LAG_HALF_LIFE_MS) -> None:
        self.half_life_ms = half_life_ms
        self._ms, self._at = 0.0, 0.0

    def sample(self, now_s: float, lag_ms: float) -> None:
        self._ms, self._at = max(lag_ms, self.ms(now_s)), now_s

    def ms(self, now_s: float) -> float:
        if self._ms <= 0.0:
            return 0.0
        return self._ms * 0.5 ** (max(0.0, now_s - self._at) * 1000.0 / self.half_life_ms)


class Lateness:
    """How much later than predicted at send a workload's requests are answered, in two parts learnt
    at their own speeds: the loop's present lag (`lag`, sampled by the caller: the gateway's event
    loop running late in a burst delays every answer on its way back, and is gone soon after), and
    beyond it an online estimate of the 98th percentile of the rest (`value`: the model's error over
    one batch; stochastic approximation in steps of LATE_STEP_MS, or LATE_STEP_SHARE of the estimate
    when that is more, each answer in time taking (1 - quantile) x the step off it). Their sum is the
    slack of the batcher's predicted-late drops; admission adds the same slack, so that it refuses
    what the batcher would drop were the queue to stay as it is.

    The lag is taken out of each answer's lateness before the percentile learns it: learnt into the
    percentile, which comes down by 0.5 % per answer in time, a burst's lag would be held through
    the lull after it, refusing tight requests an idle worker would serve in time. (Live, the loop's
    lag was found small against the percentile beyond it: docs/design/scheduling.md.)

    The quantile is the share of work sent at the edge that comes back in time: under overload
    nearly every batch is sent as late as its slack allows, so about 1 - quantile of them are
    answered past their deadline, compute wasted. A lower percentile wastes more of the worker's
    compute at the same goodput; a higher one, on a noisy machine, widens the slack enough to cost
    the tightest deadlines goodput (docs/design/scheduling.md).

    It is not learnt from the finish predicted at admission: a request is overtaken afterwards by
    tighter ones that arrive after it, and that lateness, tens to hundreds of ms on a bursty trace,
    says nothing about whether it meets its deadline (a loose one is served late but in time, one
    pushed past its deadline is dropped before compute, which wastes nothing); added to admission's
    predictions it refused most tight and loose requests that would have been served in time
    (docs/design/scheduling.md)."""

    def __init__(self, quantile: float = LATE_QUANTILE, step_ms: float = LATE_STEP_MS,
                 lag_half_life_ms: float = LAG_HALF_LIFE_MS) -> None:
        self.quantile = quantile
        self.step_ms = step_ms
        self.value = 0.0
        """Milliseconds, beyond the present lag."""
        self.lag = PresentLag(lag_half_life_ms)

    def observe(self, prediction: Prediction, finished_at: float) -> None:
        late_ms = (finished_at - prediction.finish_at) * 1000.0 - self.lag.ms(finished_at)
        if math.isfinite(late_ms):
            self.value += self._step() * (self.quantile - (1.0 if late_ms < self.value else 0.0))

    def observe_missed(self, prediction: Prediction, deadline: float) -> None:
        """Work sent that was dropped for its deadline (given up as overdue): it would have finished no
        earlier than `deadline`, so it was at least that late. Counted when that alone (less the
        present lag) is above the estimate (the answers that never come would otherwise bias the
        estimate low); otherwise unknown, skipped."""
        late_ms = (deadline - prediction.finish_at) * 1000.0 - self.lag.ms(deadline)
        if math.isfinite(late_ms) and late_ms >= self.value:
            self.value += self._step() * self.quantile

    def slack_ms(self, margin_ms: float, now_s: float) -> float:
        """Added to a prediction checked against a deadline at `now_s`: the margin, the loop's present
        lag, and the estimate beyond it when positive."""
        return margin_ms + self.lag.ms(now_s) + max(0.0, self.value)

    def lead_ms(self, max_wait_ms: float, now_s: float) -> float:
        """How long before a busy worker is predicted free the batcher sends it its next batch:
        max_batch_wait_ms plus the loop's present lag. The batcher holds a batch by a timer on the
        same loop, which fires late by the lag: with the wait alone, a batch would reach its worker the
        lag later than meant, after the worker had gone idle whenever the lag exceeds the wait."""
        return max_wait_ms + self.lag.ms(now_s)

    def _step(self) -> float:
        return max(self.step_ms, LATE_STEP_SHARE * abs(self.value))


def is_probe(model: CostModel, queue: DeadlineQueue, pool: PoolView, fits_unpadded: bool) -> bool:
    """Admit anyway while nothing else is queued or running, when the start-up profile is unconfirmed
    or the prediction meets the deadline without the learnt lateness: refusing everything would
    never produce the measurements that confirm the profile or bring a learnt lateness back down."""
    return queue.jobs == 0 and pool.batches_in_flight == 0 and (fits_unpadded or not model.verified)


def finish_ms(queue: DeadlineQueue, pool: PoolView, model: CostModel) -> float:
    """Predicted ms until everything queued now is served (in full batches shared by the ready workers)."""
    return _done_ms(pool, model, queue.items, queue.latency_tokens)


def _done_ms(pool: PoolView, model: CostModel, items: int, tokens: int) -> float:
    return pool.soonest_free_ms + model.backlog_ms(items, tokens) / max(1, pool.ready_workers)


def place(queue: DeadlineQueue, pool: PoolView, model: CostModel, now_s: float, margin_ms: float,
          deadline: float, items_new: int = 0, tokens_new: int = 0, priority: int = 0) -> float:
    """Predicted ms until `items_new`/`tokens_new` of new work with `deadline` is served where it would
    run: the soonest-free worker's work in flight, then the queued jobs served before it (those of a
    larger `priority`, and of its own those due no later in deadline order, all of them in arrival
    order) in full batches shared by the ready
    workers, then itself. The queue is walked as the batcher will serve it: a job predicted to
    finish past its deadline (+ `margin_ms`) will be dropped before compute and takes no time. The
    jobs it is served before are not counted: it delays them, and those it makes late are dropped
    in turn (refusing it to spare them was measured to lose goodput in every deadline class but the
    loosest)."""
    free_ms, workers, backlog_ms = pool.soonest_free_ms, max(1, pool.ready_workers), model.backlog_ms
    now_ms = now_s * 1000.0 + margin_ms
    kept_items = kept_tokens = 0
    for job in queue.ahead_of(deadline, priority):  # hot: a pass per admission, so plain arithmetic
        items, tokens = kept_items + job.batch_items, kept_tokens + job.latency_tokens
        if free_ms + backlog_ms(items, tokens) / workers <= job.deadline * 1000.0 - now_ms:
            kept_items, kept_tokens = items, tokens
    return free_ms + backlog_ms(kept_items + items_new, kept_tokens + tokens_new) / workers


def precheck(queue: DeadlineQueue, pool: PoolView, model: CostModel, deadline_s: float, now_s: float,
             settings: AdmissionSettings, lateness: Lateness, items: int = 0, priority: int = 0) -> Refusal | None:
    """Refuse before any tokenizing when the predicted wait where the request would run (at its
    `priority`), plus the least its `items` (samples, or beams) can take (one token each), already
    misses the deadline."""
    if not settings.refuse_early:
        return None
    budget_ms = (deadline_s - now_s) * 1000.0
    slack_ms = lateness.slack_ms(settings.margin_ms, now_s)
    least = [_Least(deadline_s, items, priority)]
    least_ms, shed = _walk(least, queue, pool, model, now_s, settings, slack_ms)
    if is_probe(model, queue, pool, least_ms + settings.margin_ms <= budget_ms):
        return None
    late = None if least_ms + slack_ms <= budget_ms else Refusal(
        DropReason.DEADLINE_UNMEETABLE, f"the predicted wait where it would run, with the least its {items} item(s) "
                                        f"can take, is {least_ms:.1f} ms (+ margin {slack_ms:.1f} ms), already past the "
                                        f"deadline of {budget_ms:.1f} ms; refused before any work")
    if not settings.shed_by_cost:
        return late
    return None if not shed else late or _by_cost_refusal(least, model, slack_ms,
                                                            f"at the least its {items} item(s) can take")


def admit(jobs: Sequence[Work], queue: DeadlineQueue, pool: PoolView, model: CostModel, now_s: float,
          settings: AdmissionSettings, lateness: Lateness) -> Prediction | Refusal:
    """The prediction for a request's jobs, or why it is refused (queue_full, deadline_unmeetable)."""
    deadline = min(j.deadline for j in jobs)
    budget_ms = (deadline - now_s) * 1000.0
    items, tokens = sum(j.batch_items for j in jobs), sum(j.latency_tokens for j in jobs)
    slack_ms = lateness.slack_ms(settings.margin_ms, now_s)
    done_ms, shed = _walk(jobs, queue, pool, model, now_s, settings, slack_ms)
    service_ms = model.backlog_ms(items, tokens)
    wait_ms = max(0.0, done_ms - service_ms)
    prediction = Prediction(wait_ms, service_ms, budget_ms, now_s + done_ms / 1000.0)
    real_tokens = sum(j.tokens for j in jobs)
    if queue.tokens + real_tokens > settings.max_queue_tokens and queue.jobs > 0:
        return Refusal(DropReason.QUEUE_FULL, f"the queue holds {queue.tokens} tokens; with this request's "
                                              f"{real_tokens} it would pass its budget of {settings.max_queue_tokens}",
                       retry_after_s=finish_ms(queue, pool, model) / 1000.0)
    if not settings.refuse_early or is_probe(model, queue, pool, done_ms + settings.margin_ms <= budget_ms):
        return prediction
    late = None if wait_ms + service_ms + slack_ms <= budget_ms else Refusal(
        DropReason.DEADLINE_UNMEETABLE, f"predicted finish in {wait_ms + service_ms:.1f} ms (queue wait {wait_ms:.1f} ms "
                                        f"+ service {service_ms:.1f} ms + margin {slack_ms:.1f} ms) is past the deadline "
                                        f"of {budget_ms:.1f} ms; refused before any work")
    if not settings.shed_by_cost:
        return late or prediction
    return prediction if not shed else late or _by_cost_refusal(jobs, model, slack_ms)


def _walk(jobs: Sequence[Work], queue: DeadlineQueue, pool: PoolView, model: CostModel, now_s: float,
          settings: AdmissionSettings, slack_ms: float) -> tuple[float, bool]:
    """Predicted ms until the request's `jobs` are served where they would run, and (with
    shed_by_cost) whether the queue sheds one of them: one walk of the queue either way.

    Without shed_by_cost: `place`. With it: `shed_costliest` over the queue in serving order with
    the jobs in their place (after every queued job due no later; in an arrival-order queue, last),
    its slack the margin and the learnt lateness, the prediction where the walk reaches them:
    while every job is in time that is `place`'s; under overload a request gets in by shedding a
    queued job that costs more than ADMIT_SHED_GAIN x as much per answer, even one whose own finish
    where it runs misses its deadline, and is refused otherwise (the queued work keeps its place).
    The batcher sheds by the same walk."""
    deadline, priority = min(j.deadline for j in jobs), jobs[0].priority
    if not settings.shed_by_cost:
        return place(queue, pool, model, now_s, settings.margin_ms, deadline, sum(j.batch_items for j in jobs),
                     sum(j.latency_tokens for j in jobs), priority), False
    reached = {id(job): 0.0 for job in jobs}
    shed = shed_costliest(queue.in_order_with(jobs, deadline, priority), model, pool.soonest_free_ms,
                          max(1, pool.ready_workers), now_s * 1000.0 + slack_ms, reached, ADMIT_SHED_GAIN)
    return max(reached.values()), any(id(job) in shed for job in jobs)


@dataclass(frozen=True)
class _Least:
    """A request at the least it can cost (one token an item), for the precheck before tokenizing."""

    deadline: float
    batch_items: int
    priority: int = 0
    label_ids: tuple[int, ...] = ()
    beam_key: None = None

    @property
    def samples(self) -> int:
        return self.batch_items

    @property
    def tokens(self) -> int:
        return self.batch_items

    @property
    def latency_tokens(self) -> int:
        return self.batch_items


def _by_cost_refusal(jobs: Sequence[Work], model: CostModel, slack_ms: float, at: str = "") -> Refusal:
    """The refusal of a request the queue sheds for its cost (`_walk`); the caller words the refusal
    of a request that misses its deadline where it runs as such, this one's words are for the rest."""
    cost_ms = sum(model.backlog_ms(j.batch_items, j.latency_tokens) for j in jobs)
    return Refusal(DropReason.DEADLINE_UNMEETABLE, f"with this request the queue cannot finish every request by its "
                                                   f"deadline (+ margin {slack_ms:.1f} ms), and this one "
                                                   f"({cost_ms:.1f} ms of predicted compute{', ' + at if at else ''}) "
                                                   f"costs the most per answer of the work it competes with; "
                                                   f"refused before any work")
