"""How many workers an offered load needs to meet its deadlines: Kingman's G/G/N estimate, shared by
`loadgen tune --capacity` (on a trace) and the gateway's `boundserve_desired_workers` (on its recent
arrivals), so the two agree on the same requests.

Kingman (DESIGN.md, seed 000 §1.3): E[W] ≈ ρ/(1−ρ) · (c_a² + c_s²)/2 · τ for one G/G/1 server.
Applied with each request served alone (unbatched, so an upper bound on the work):
  λ      the mean arrival rate over the span of the arrivals (n − 1 gaps); c_a the coefficient of
         variation of the gaps
  τ, c_s mean and coefficient of variation of T(request alone) from the fitted latency model
  N workers: each gets a random 1/N split, rate λ/N and c_a² → c_a²/N + (1 − 1/N) (thinning)
  tail    waiting time taken as exponential beyond its mean (heavy-traffic): the q-quantile of the
          wait is E[W]/ρ · ln(ρ/(1−q)) (0 when ρ ≤ 1−q); latency_q ≈ wait_q + τ_q.
N may be fractional (`desired_workers`): below one worker the thinning is none (c_a² stays), and the
estimate is continuous in N, so the fractional count is where it crosses the SLO, and its ceiling is
the fewest whole workers (`kingman_workers`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

MAX_WORKERS = 64
BISECTION_STEPS = 60  # halvings of a one-worker interval: far below a float's resolution of a count


@dataclass(frozen=True)
class WorkloadFacts:
    """Arrival and service statistics of a set of requests under a latency model."""

    rate_rps: float
    ca: float
    tau_ms: float
    cs: float
    tau_pct_ms: float

    @classmethod
    def of(cls, arrivals_ms: Sequence[float], alone_ms: Sequence[float], pct: float = 99.0) -> WorkloadFacts:
        """From the requests' arrival times (ms, ascending) and each one's service time alone (ms)."""
        span_ms = arrivals_ms[-1] - arrivals_ms[0] if arrivals_ms else 0.0
        rate = (len(arrivals_ms) - 1) / (span_ms / 1000.0) if span_ms > 0 else 0.0
        gaps = [b - a for a, b in zip(arrivals_ms, arrivals_ms[1:])]
        return cls(rate_rps=rate, ca=_cv(gaps), tau_ms=statistics.fmean(alone_ms) if alone_ms else 0.0,
                   cs=_cv(alone_ms), tau_pct_ms=quantile(alone_ms, pct) or 0.0)


def kingman_wait_ms(rho: float, ca: float, cs: float, tau_ms: float) -> float:
    """Mean queueing delay of a G/G/1 server (infinite when rho >= 1)."""
    if rho >= 1.0:
        return math.inf
    return rho / (1.0 - rho) * (ca * ca + cs * cs) / 2.0 * tau_ms


def kingman_latency_ms(facts: WorkloadFacts, workers: float, pct: float = 99.0) -> dict[str, float]:
    """Utilisation, mean wait and the pct-th latency estimate with `workers` servers (> 0)."""
    rho = facts.rate_rps / workers * facts.tau_ms / 1000.0
    split = max(1.0, workers)
    ca2 = facts.ca**2 / split + (1.0 - 1.0 / split)
    mean_wait = kingman_wait_ms(rho, math.sqrt(ca2), facts.cs, facts.tau_ms)
    q = pct / 100.0
    if math.isinf(mean_wait):
        tail = math.inf
    elif rho <= 1.0 - q or rho == 0.0:
        tail = 0.0
    else:
        tail = mean_wait / rho * math.log(rho / (1.0 - q))
    return {"rho": rho, "mean_wait_ms": mean_wait, "latency_pct_ms": tail + facts.tau_pct_ms}


def kingman_workers(facts: WorkloadFacts, slo_ms: float, pct: float = 99.0,
                    max_workers: int = MAX_WORKERS) -> int | None:
    """Fewest whole workers whose Kingman latency estimate meets the SLO (None if none up to the max)."""
    for workers in range(1, max_workers + 1):
        if _meets(facts, workers, slo_ms, pct):
            return workers
    return None


def desired_workers(facts: WorkloadFacts, slo_ms: float, pct: float = 99.0, max_workers: int = MAX_WORKERS) -> float:
    """The fractional worker count at which the Kingman estimate meets the SLO: the gateway's
    boundserve_desired_workers (an autoscaler sums it over gateways and rounds up).

    0 with no load. Its ceiling is `kingman_workers`. When no count up to `max_workers` meets the SLO,
    `max_workers`; when none could (a request alone takes longer than the SLO: more workers do not
    help), the workers the load keeps busy, λ·τ.
    """
    busy = facts.rate_rps * facts.tau_ms / 1000.0
    if busy <= 0.0:
        return 0.0
    if facts.tau_pct_ms > slo_ms:
        return busy
    whole = kingman_workers(facts, slo_ms, pct, max_workers)
    if whole is None:
        return float(max_workers)
    low, high = max(busy, whole - 1.0), float(whole)  # low misses the SLO (rho >= 1, or by whole's definition)
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2.0
        low, high = (low, middle) if _meets(facts, middle, slo_ms, pct) else (middle, high)
    return high


def quantile(values: Sequence[float], pct: float) -> float | None:
    """The pct-th percentile (0..100), linear interpolation between ranks; None for no values (loadgen.stats.percentile
    is this one)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _meets(facts: WorkloadFacts, workers: float, slo_ms: float, pct: float) -> bool:
    return kingman_latency_ms(facts, workers, pct)["latency_pct_ms"] <= slo_ms


def _cv(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else 0.0
