"""Capacity estimate: how many workers a trace needs for an SLO, by Kingman and by simulation.

Kingman (DESIGN.md, seed 000 §1.3): E[W] ≈ ρ/(1−ρ) · (c_a² + c_s²)/2 · τ for one G/G/1 server.
Applied here with each request served alone (unbatched, so an upper bound on the work):
  λ      the trace's mean arrival rate; c_a the coefficient of variation of its inter-arrival gaps
  τ, c_s mean and coefficient of variation of T(request alone) from the service-time function
  N workers: each gets a random 1/N split, rate λ/N and c_a² → c_a²/N + (1 − 1/N) (thinning)
  tail    waiting time taken as exponential beyond its mean (heavy-traffic): the q-quantile of the
          wait is E[W]/ρ · ln(ρ/(1−q)) (0 when ρ ≤ 1−q); latency_q ≈ wait_q + τ_q.
The simulator cross-checks twice: with batching off (one request per batch, infinite deadlines:
the same G/G/N system Kingman describes) and with the given gateway settings (batching on, which
amortises the fixed cost per call and so usually needs fewer workers).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from loadgen.service import ServiceFn
from loadgen.simulator import SimSettings, simulate
from loadgen.stats import percentile
from loadgen.trace import Trace

UNBOUNDED_MS = 1e12


@dataclass(frozen=True)
class WorkloadFacts:
    """Arrival and service statistics of a trace under a service-time function."""

    rate_rps: float
    ca: float
    tau_ms: float
    cs: float
    tau_pct_ms: float


def workload_facts(trace: Trace, service: ServiceFn, pct: float = 99.0, beam_width: int = 16) -> WorkloadFacts:
    times = [r.t_ms for r in trace.records]
    gaps = [b - a for a, b in zip(times, times[1:])]
    alone = [service(r.route, *r.shape(beam_width)) for r in trace.records]
    return WorkloadFacts(
        rate_rps=trace.rate_rps(), ca=_cv(gaps), tau_ms=statistics.fmean(alone), cs=_cv(alone),
        tau_pct_ms=percentile(alone, pct) or 0.0,
    )


def kingman_wait_ms(rho: float, ca: float, cs: float, tau_ms: float) -> float:
    """Mean queueing delay of a G/G/1 server (infinite when rho >= 1)."""
    if rho >= 1.0:
        return math.inf
    return rho / (1.0 - rho) * (ca * ca + cs * cs) / 2.0 * tau_ms


def kingman_latency_ms(facts: WorkloadFacts, workers: int, pct: float = 99.0) -> dict[str, float]:
    """Utilisation, mean wait and the pct-th latency estimate with `workers` servers."""
    rho = facts.rate_rps / workers * facts.tau_ms / 1000.0
    ca2 = facts.ca**2 / workers + (1.0 - 1.0 / workers)
    mean_wait = kingman_wait_ms(rho, math.sqrt(ca2), facts.cs, facts.tau_ms)
    q = pct / 100.0
    if math.isinf(mean_wait):
        tail = math.inf
    elif rho <= 1.0 - q or rho == 0.0:
        tail = 0.0
    else:
        tail = mean_wait / rho * math.log(rho / (1.0 - q))
    return {"rho": rho, "mean_wait_ms": mean_wait, "latency_pct_ms": tail + facts.tau_pct_ms}


def kingman_workers(facts: WorkloadFacts, slo_ms: float, pct: float = 99.0, max_workers: int = 64) -> int | None:
    """Fewest workers whose Kingman latency estimate meets the SLO (None if none up to the max)."""
    for workers in range(1, max_workers + 1):
        if kingman_latency_ms(facts, workers, pct)["latency_pct_ms"] <= slo_ms:
            return workers
    return None


def simulated_workers(trace: Trace, service: ServiceFn, settings: SimSettings, slo_ms: float,
                      pct: float = 99.0, attainment: float = 0.99, max_workers: int = 64) -> int | None:
    """Fewest workers for which the simulator meets pct-th latency <= SLO with that attainment."""
    for workers in range(1, max_workers + 1):
        results = simulate(trace, _with(settings, workers=workers), service)
        ok = [r.done_ms - r.scheduled_ms for r in results if r.outcome == "ok"]
        good = sum(1 for x in ok if x <= slo_ms)
        value = percentile(ok, pct)
        if value is not None and value <= slo_ms and good >= attainment * len(results):
            return workers
    return None


def capacity_report(trace: Trace, service: ServiceFn, settings: SimSettings, slo_ms: float,
                    pct: float = 99.0, max_workers: int = 64) -> dict[str, Any]:
    """Kingman's answer and the simulator's two cross-checks (see module docstring)."""
    facts = workload_facts(trace, service, pct, settings.default_beam_width)
    unbatched = _with(settings, max_batch_requests=1, score_deadline_ms=UNBOUNDED_MS,
                      generate_deadline_ms=UNBOUNDED_MS, max_queue_tokens=2**62, max_batch_wait_ms=0.0)
    kingman_n = kingman_workers(facts, slo_ms, pct, max_workers)
    return {
        "rate_rps": facts.rate_rps, "ca": facts.ca, "tau_ms": facts.tau_ms, "cs": facts.cs,
        "slo_ms": slo_ms, "pct": pct,
        "kingman_workers": kingman_n,
        "kingman_at_workers": kingman_latency_ms(facts, kingman_n, pct) if kingman_n else None,
        "simulated_unbatched_workers": simulated_workers(trace, service, unbatched, slo_ms, pct, 0.0, max_workers),
        "simulated_batched_workers": simulated_workers(trace, service, settings, slo_ms, pct, 0.99, max_workers),
    }


def _cv(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else 0.0


def _with(settings: SimSettings, **knobs: Any) -> SimSettings:
    return settings.with_knobs(knobs)
