"""Admission: precheck, predicted finish, probes, learnt lateness, the queue budget (pure)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from shared.policy.cost import CostModel
from shared.policy.deadline_queue import DeadlineQueue, Work
from shared.policy.drops import DropReason, Refusal

LATE_QUANTILE, LATE_STEP_MS = 0.9, 0.25


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
    return Refusal(DropReason.DEADLINE_UNMEETABLE, f"the predicted queue wait of {wait_ms:.1f} ms (+ margin {slack_ms:.1f} "
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
        return Refusal(DropReason.QUEUE_FULL, f"the queue holds {queue.tokens} tokens; with this request's {real_tokens} it "
                                     f"would pass its budget of {settings.max_queue_tokens}",
                       retry_after_s=finish_ms(queue, pool, model) / 1000.0)
    slack_ms = lateness.slack_ms(settings.margin_ms)
    if not settings.predict or wait_ms + service_ms + slack_ms <= budget_ms or is_probe(model, queue, pool):
        return prediction
    return Refusal(DropReason.DEADLINE_UNMEETABLE, f"predicted finish in {wait_ms + service_ms:.1f} ms (queue wait "
                                          f"{wait_ms:.1f} ms + service {service_ms:.1f} ms + margin {slack_ms:.1f} "
                                          f"ms) is past the deadline of {budget_ms:.1f} ms; refused before any work")
