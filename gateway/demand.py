"""The offered load a gateway sees, and the workers it needs: `boundserve_desired_workers`.

Every request that reaches a work route is an arrival (refused ones too: they are the demand the
workers did not meet): when it came, its workload, its batch items (samples, or beams) and, once it
is tokenized, its tokens per item (an arrival refused before tokenizing counts with the mean of its
workload's others), and its deadline budget. At each scrape the arrivals of the last `window_s`
(at most `max_arrivals`) become shared/policy/capacity.py's WorkloadFacts, each request's service
time alone from the workers' fitted (and online-corrected) latency model, and `desired_workers` of
those facts at the SLO they carry: the (100 − pct)th percentile of their deadline budgets, so pct
of the requests ask for at least that. This is what `loadgen tune --capacity` computes on a trace
(its `desired_workers`), so the two agree on the same requests.

The count is fractional and this gateway's own: an autoscaler sums it over the gateways (deploy/k8s
keda/hpa) and rounds up. A gateway's share is computed as if its traffic had workers of its own,
which slightly overstates the sum (several gateways' traffic pooled on shared workers queues less).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from shared.policy.capacity import WorkloadFacts, desired_workers, quantile

WINDOW_S = 60.0
MAX_ARRIVALS = 20_000
PCT = 99.0


class Predicts(Protocol):
    """What the demand needs of a latency model (shared/latency_model.py's B and L)."""

    def predict_ms(self, batch_items: float, tokens_per_item: float) -> float: ...


@dataclass(slots=True)
class Arrival:
    """One request as offered: when (loop seconds), what, and how long it may take (ms)."""

    at_s: float
    workload: str
    items: int
    budget_ms: float
    tokens_per_item: float | None = None
    """Set once tokenized; None: refused before (the mean of its workload's others stands in)."""


class Demand:
    """The recent arrivals of one gateway, and the worker count they need (see module docstring)."""

    def __init__(self, window_s: float = WINDOW_S, pct: float = PCT, max_arrivals: int = MAX_ARRIVALS) -> None:
        self.window_s, self.pct = window_s, pct
        self.arrivals: deque[Arrival] = deque(maxlen=max_arrivals)
        self._models: dict[str, Predicts] = {}

    def arrive(self, at_s: float, workload: str, items: int, budget_ms: float) -> Arrival:
        """Record an arrival; the caller sets `tokens_per_item` on it once it is known."""
        arrival = Arrival(at_s, workload, items, budget_ms)
        self.arrivals.append(arrival)
        return arrival

    def desired_workers(self, now_s: float, model_of: Callable[[str], Predicts | None]) -> float:
        """Workers the arrivals of the last window need (fractional; 0 with fewer than two arrivals).
        `model_of(workload)`: the latency model now (None when no worker serves it: the last one seen)."""
        while self.arrivals and self.arrivals[0].at_s < now_s - self.window_s:
            self.arrivals.popleft()
        recent = list(self.arrivals)
        for workload in {a.workload for a in recent}:
            model = model_of(workload)
            if model is not None:
                self._models[workload] = model
        recent = [a for a in recent if a.workload in self._models]
        if len(recent) < 2:
            return 0.0
        facts = WorkloadFacts.of([a.at_s * 1000.0 for a in recent], self._alone_ms(recent), self.pct)
        slo_ms = quantile([a.budget_ms for a in recent], 100.0 - self.pct) or 0.0
        return desired_workers(facts, slo_ms, self.pct)

    def _alone_ms(self, recent: list[Arrival]) -> list[float]:
        """Each arrival's service time alone (ms) under its workload's model."""
        means = {}
        for workload in {a.workload for a in recent}:
            known = [a.tokens_per_item for a in recent if a.workload == workload and a.tokens_per_item is not None]
            means[workload] = statistics.fmean(known) if known else 0.0
        return [self._models[a.workload].predict_ms(a.items, means[a.workload] if a.tokens_per_item is None
                                                    else a.tokens_per_item) for a in recent]
