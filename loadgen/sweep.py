"""Offered-load sweep: replay (or simulate) a trace at several rates and find the highest that meets
the SLO.

The trace keeps its shape (burstiness, lengths, route mix); only its clock is scaled so that its
mean rate becomes each target rate. A rate meets the SLO when at least pct % of the requests *sent*
were answered successfully within slo_ms, i.e. the pct-th latency over all requests, counting
rejections as infinitely late, is within the SLO. (A shedding gateway keeps the latency of its
successes low at any load; counting rejections is what makes the sweep find a real limit.)
Optional bisection refines the boundary between the best passing and the first failing rate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loadgen.result import RequestResult
from loadgen.stats import percentile, summarize
from loadgen.trace import Trace

TraceEvaluator = Callable[[Trace], list[RequestResult]]


@dataclass(frozen=True)
class SweepResult:
    """Rows by offered rate and the highest rate meeting the SLO (None if none did)."""

    rows: list[dict[str, Any]]
    best_rps: float | None
    slo_ms: float
    pct: float


def at_rate(trace: Trace, rate_rps: float) -> Trace:
    """The trace with its clock scaled to a mean rate of rate_rps."""
    base = trace.rate_rps()
    if base <= 0:
        raise ValueError("the trace needs at least two requests at different times to be rescaled")
    return trace.scaled(rate_rps / base)


def measure(results: list[RequestResult], target_rps: float, slo_ms: float, pct: float) -> dict[str, Any]:
    summary = summarize(results, slo_ms)["routes"]["all"]
    ok = [r.done_ms - r.scheduled_ms for r in results if r.outcome == "ok"]
    attainment = summary["slo_attainment"] or 0.0
    return {
        "target_rps": target_rps, "offered_rps": summary["offered_rps"] or 0.0,
        "throughput_rps": summary["throughput_rps"] or 0.0, "goodput_rps": summary["goodput_rps"] or 0.0,
        "latency_pct_ms": percentile(ok, pct), "attainment": attainment,
        "outcomes": summary["outcomes"], "meets_slo": attainment >= pct / 100.0,
    }


def sweep(trace: Trace, rates: Sequence[float], evaluate: TraceEvaluator, slo_ms: float, pct: float = 99.0,
          refine_steps: int = 0, on_row: Callable[[dict[str, Any]], None] | None = None) -> SweepResult:
    """Evaluate each rate (ascending), then bisect the pass/fail boundary refine_steps times."""
    rows = []

    def run(rate: float) -> dict[str, Any]:
        row = measure(evaluate(at_rate(trace, rate)), rate, slo_ms, pct)
        rows.append(row)
        if on_row is not None:
            on_row(row)
        return row

    for rate in sorted(rates):
        run(rate)
    for _ in range(refine_steps):
        passing = [r["target_rps"] for r in rows if r["meets_slo"]]
        failing = [r["target_rps"] for r in rows if not r["meets_slo"] and r["target_rps"] > max(passing, default=0.0)]
        if not passing or not failing:
            break
        run((max(passing) + min(failing)) / 2.0)
    rows.sort(key=lambda r: r["target_rps"])
    best = max((r["target_rps"] for r in rows if r["meets_slo"]), default=None)
    return SweepResult(rows, best, slo_ms, pct)


def sweep_table(result: SweepResult) -> str:
    pname = "p" + format(result.pct, "g")
    header = f"{'target/s':>9} {'offered/s':>9} {'thru/s':>8} {'goodput/s':>9} {pname:>7} {'attain':>7}  slo"
    lines = [header]
    for r in result.rows:
        p = "-" if r["latency_pct_ms"] is None else f"{r['latency_pct_ms']:.1f}"
        lines.append(f"{r['target_rps']:9.1f} {r['offered_rps']:9.1f} {r['throughput_rps']:8.1f} "
                     f"{r['goodput_rps']:9.1f} {p:>7} {r['attainment']:7.3f}  {'yes' if r['meets_slo'] else 'no'}")
    return "\n".join(lines)
