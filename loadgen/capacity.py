"""Capacity estimate: how many workers a trace needs for an SLO, by Kingman and by simulation.

Kingman's estimate (shared/policy/capacity.py, where its assumptions are written down) is the one
the gateway's boundserve_desired_workers gauge computes on its recent arrivals: `desired_workers` in
the report is that gauge's value for the trace (fractional; `kingman_workers` is its ceiling).
The simulator cross-checks twice: with batching off (one request per batch, infinite deadlines:
the same G/G/N system Kingman describes) and with the given gateway settings (batching on, which
amortises the fixed cost per call and so usually needs fewer workers).
"""

from __future__ import annotations

from typing import Any

from loadgen.service import ServiceFn
from loadgen.simulator import SimSettings, simulate
from loadgen.stats import percentile
from loadgen.trace import Trace
from shared.policy.capacity import (WorkloadFacts, desired_workers, kingman_latency_ms, kingman_wait_ms,
                                    kingman_workers)

__all__ = ["WorkloadFacts", "capacity_report", "kingman_latency_ms", "kingman_wait_ms", "kingman_workers",
           "simulated_workers", "workload_facts"]
UNBOUNDED_MS = 1e12


def workload_facts(trace: Trace, service: ServiceFn, pct: float = 99.0, beam_width: int = 16) -> WorkloadFacts:
    """The trace's arrivals and each request's service time alone under `service`."""
    alone = [service(r.route, *r.shape(beam_width)) for r in trace.records]
    return WorkloadFacts.of([r.t_ms for r in trace.records], alone, pct)


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
        "desired_workers": desired_workers(facts, slo_ms, pct, max_workers),
        "kingman_at_workers": kingman_latency_ms(facts, kingman_n, pct) if kingman_n else None,
        "simulated_unbatched_workers": simulated_workers(trace, service, unbatched, slo_ms, pct, 0.0, max_workers),
        "simulated_batched_workers": simulated_workers(trace, service, settings, slo_ms, pct, 0.99, max_workers),
    }


def _with(settings: SimSettings, **knobs: Any) -> SimSettings:
    return settings.with_knobs(knobs)
