"""Report arithmetic: percentiles, throughput, goodput and SLO attainment per route, sender lag.

Definitions (the same for live replays and the simulator):
  window_s       the span of scheduled send times (first to last); if 0, first send to last answer
  throughput     successful answers per second of window
  latency        answer time minus *scheduled* send time, over successful answers only
  goodput        successful answers within the SLO, per second of window
  attainment     successful answers within the SLO / requests sent (rejections count as misses)
  percentiles    linear interpolation between closest ranks (numpy's default "linear" method)
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from shared.policy.capacity import quantile

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
LATE_SEND_MS = 1.0
"""A send this much behind schedule counts as late."""
SATURATED_P99_LAG_MS = 5.0
"""A p99 sender lag above this flags the client as saturated: its numbers are not the server's."""


class Outcome(Protocol):
    route: str
    scheduled_ms: float
    sent_ms: float
    done_ms: float
    outcome: str


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation; None for no values (the policy's rule:
    shared/policy/capacity.quantile, so that loadgen and the gateway's autoscaling signal agree)."""
    return quantile(values, q)


def percentile_interval(values: Sequence[float], q: float, coverage: float = 0.9, resamples: int = 1000,
                        seed: int = 0) -> tuple[float, float] | None:
    """A bootstrap interval of the q-th percentile: how far it moves when the same requests are drawn
    again at random (with replacement), `coverage` of the redraws inside. It measures only the
    sampling noise of the estimate (a p99 of a few hundred answers rests on its few largest ones);
    runs differ more than this when the machine's speed differs between them."""
    if not values:
        return None
    rng = random.Random(seed)
    draws = sorted(percentile(rng.choices(values, k=len(values)), q) for _ in range(resamples))
    cut = int(resamples * (1.0 - coverage) / 2.0)
    return draws[cut], draws[resamples - 1 - cut]


def latency_summary(latencies: Sequence[float]) -> dict[str, float | None]:
    out = {_pname(q): percentile(latencies, q) for q in PERCENTILES}
    out["mean"] = sum(latencies) / len(latencies) if latencies else None
    out["max"] = max(latencies) if latencies else None
    return out


def window_of(results: Sequence[Outcome]) -> float:
    """Seconds between the first and last scheduled send (see module docstring)."""
    if not results:
        return 0.0
    span = max(r.scheduled_ms for r in results) - min(r.scheduled_ms for r in results)
    if span > 0:
        return span / 1000.0
    done = [r.done_ms for r in results if not math.isnan(r.done_ms)]
    return max(0.0, (max(done, default=0.0) - results[0].scheduled_ms) / 1000.0)


def route_summary(results: Sequence[Outcome], window_s: float, slo_ms: float | None) -> dict[str, Any]:
    """Counts, throughput, latency percentiles, goodput and attainment of one set of requests."""
    ok = [r.done_ms - r.scheduled_ms for r in results if r.outcome == "ok"]
    good = sum(1 for x in ok if slo_ms is None or x <= slo_ms)
    per_s = (lambda n: n / window_s) if window_s > 0 else (lambda n: None)
    return {
        "sent": len(results),
        "ok": len(ok),
        "outcomes": dict(sorted(Counter(r.outcome for r in results).items())),
        "offered_rps": per_s(len(results)),
        "throughput_rps": per_s(len(ok)),
        "latency_ms": latency_summary(ok),
        "slo_ms": slo_ms,
        "within_slo": good,
        "goodput_rps": per_s(good),
        "slo_attainment": good / len(results) if results else None,
    }


def summarize(results: Sequence[Outcome], slo_ms: float | None,
              window_s: float | None = None) -> dict[str, Any]:
    """{"window_s", "routes": {route: summary, ..., "all": summary}, "sender": lag summary}."""
    window = window_s if window_s else window_of(results)
    routes = {route: route_summary([r for r in results if r.route == route], window, slo_ms)
              for route in sorted({r.route for r in results})}
    routes["all"] = route_summary(results, window, slo_ms)
    return {"window_s": window, "routes": routes, "sender": sender_summary(results)}


def sender_summary(results: Iterable[Outcome]) -> dict[str, Any]:
    """How far behind schedule the client sent; `saturated` means do not trust the latencies."""
    lags = [r.sent_ms - r.scheduled_ms for r in results if not math.isnan(r.sent_ms)]
    p99 = percentile(lags, 99.0)
    return {
        "lag_ms": {"p50": percentile(lags, 50.0), "p99": p99, "max": max(lags, default=None)},
        "late_sends": sum(1 for x in lags if x > LATE_SEND_MS),
        "late_threshold_ms": LATE_SEND_MS,
        "saturated": bool(p99 is not None and p99 > SATURATED_P99_LAG_MS),
    }


def meets_slo(summary: dict[str, Any], slo_ms: float, pct: float = 99.0) -> bool:
    """True when the route summary's pct-th latency percentile is within the SLO (False if none)."""
    value = summary["latency_ms"].get(_pname(pct))
    return value is not None and value <= slo_ms


def timeseries(results: Sequence[Outcome], bin_s: float = 1.0) -> list[dict[str, Any]]:
    """Per time bin (by scheduled send): sent, outcome counts, completions, p50/p99 latency of ok."""
    if not results:
        return []
    bin_ms = bin_s * 1000.0
    done = [r.done_ms for r in results if not math.isnan(r.done_ms)]
    last = max(max(r.scheduled_ms for r in results), max(done, default=0.0))
    bins = [{"t_s": i * bin_s, "sent": 0, "completed_ok": 0, "outcomes": Counter(), "lat": []}
            for i in range(int(last // bin_ms) + 1)]
    for r in results:
        slot = bins[int(r.scheduled_ms // bin_ms)]
        slot["sent"] += 1
        slot["outcomes"][r.outcome] += 1
        if r.outcome == "ok":
            slot["lat"].append(r.done_ms - r.scheduled_ms)
            bins[int(r.done_ms // bin_ms)]["completed_ok"] += 1
    for slot in bins:
        lat = slot.pop("lat")
        slot.update(p50_ms=percentile(lat, 50.0), p99_ms=percentile(lat, 99.0),
                    throughput_rps=slot["completed_ok"] / bin_s, outcomes=dict(slot["outcomes"]))
    return bins


def _pname(q: float) -> str:
    return "p" + (f"{q:g}".replace(".", ""))
