"""The overload benchmark's trace windows against the clairvoyant bound (loadgen/bound.py), offline.

The windows of bench/overload_sim.py (the Azure code trace's slices, deadline classes 50 / 100 /
300 ms, each load x the capacity that run measured, read from its committed result) and its quiet
latency model. Per load and window:
  bound        loadgen/bound.py on the window: the most requests any scheduler that knew every
               arrival and service time could answer in time (an upper bound, floored);
  admission,   the simulator (the project's policy code) on the same window, in the world where the
  edf_late_drop bound provably holds: service times exactly the model's, no request or batch overhead;
  committed    the committed overload-sim-trace.json's admission goodput (its world adds a 10 %
               compute jitter and 2 ms + 1 ms of overheads), against the jitter-free bound and the
               bound of that world (every batch at the jitter's fastest factor: provable, looser);
per class also the bound on the class alone (an upper bound for the class, which the bound's own
schedule's split is not); and on small windows (GROUP consecutive requests of the 2x windows, each
alone, deadlines cut to contend), the relaxation (floored; loadgen/bound.py's bound is the exact
optimum itself on a window this small) against the exact optimum (loadgen/bound_exact.py) and the
policy: how much of the gap is the relaxation's. bench/overload_replay.py measures admission
against the bound in a jittered world whose speeds the bound knows (loadgen/machine_pace.py).

    python bench/overload_bound.py [--loads 1,1.5,2,4] [--groups 20]

Prints one JSON object (ratios per load and class) and writes bench/results/overload-bound-trace.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
from typing import Any

from bench.harness import overload_load
from bench.overload_sim import COMMITTED_TRACE, QUIET_SERVICE, committed_trace, settings_for
from bench.harness.provenance import write_result
from loadgen.bound import clairvoyant_bound, class_bounds
from loadgen.bound_exact import exact_optimum
from loadgen.bound_problem import problem_of
from loadgen.service import ServiceModel
from loadgen.simulator import Simulator
from loadgen.trace import Trace, make_trace

GROUP = 10
"""Requests in a small window: the exact search is 3^GROUP steps."""
SMALL_DEADLINE_CUT = 4.0
"""A small window's deadlines are the classes / this (12.5, 25, 75 ms): ten requests of the trace
alone hardly contend at their own deadlines (every one is served; nothing to compare)."""


def ideal(policy: str) -> Any:
    """bench/overload_sim.py's settings for `policy` with no jitter and no overheads."""
    world = argparse.Namespace(request_overhead_ms=0.0, batch_overhead_ms=0.0, gateway_ms_per_request=0.0,
                               jitter_cv=0.0, shed_by_cost="on")
    return settings_for(policy, world)


def committed_world() -> Any:
    """bench/overload_sim.py's default world (10 % jitter, 2 ms per request, 1 ms per batch), where
    the bound must take every batch at the jitter's fastest factor (loadgen/bound_problem.py)."""
    world = argparse.Namespace(request_overhead_ms=2.0, batch_overhead_ms=1.0, gateway_ms_per_request=0.0,
                               jitter_cv=0.1, shed_by_cost="on")
    return settings_for("admission", world)


def in_time(trace: Trace, policy: str, service: ServiceModel) -> dict[str, int]:
    """Requests the simulator answers within their deadline, per class and in all ("all")."""
    results = Simulator(ideal(policy), service).run(trace)
    counts: dict[str, int] = {"all": 0}
    for result, record in zip(results, trace.records):
        good = int(result.outcome == "ok" and result.latency_ms <= record.deadline_ms)
        counts["all"] += good
        counts[f"{record.deadline_ms:g}"] = counts.get(f"{record.deadline_ms:g}", 0) + good
    return counts


def window_row(trace: Trace, service: ServiceModel) -> dict[str, Any]:
    problem = problem_of(trace, ideal("admission"), service)
    bound = clairvoyant_bound(problem)
    return {"offered": len(trace.records), "bound": bound.served, "bound_by_class": bound.by_class,
            "class_alone": class_bounds(problem),
            "bound_committed_world": clairvoyant_bound(problem_of(trace, committed_world(), service)).served,
            "delta_shares": bound.shares, **{p: in_time(trace, p, service) for p in ("admission", "edf_late_drop")}}


def by_load(workload: overload_load.Workload, capacity: float, loads: list[float], window_s: float,
            service: ServiceModel) -> dict[str, Any]:
    committed = json.loads(COMMITTED_TRACE.read_text())["table"]["admission"]
    out = {}
    for load in loads:
        traces = [workload.window(i, load * capacity, window_s, seed=1000 * i + int(10 * load))
                  for i in range(len(workload.slices))]
        rows = [window_row(trace, service) for trace in traces]
        span_s = [max(rec.t_ms for rec in trace.records) / 1000.0 for trace in traces]  # as overload_sim counts
        windows = [{"bound": r["bound"], **{p: r[p]["all"] for p in ("admission", "edf_late_drop")}} for r in rows]
        out[f"{load:g}x"] = {**load_row(rows, span_s, committed.get(f"{load:g}x")), "windows": windows}
    return out


def load_row(rows: list[dict[str, Any]], span_s: list[float], committed: dict[str, Any] | None) -> dict[str, Any]:
    """One load's windows summed (counts) or their median (per second, as the committed table)."""
    def median_rps(value) -> float:
        return statistics.median(value(r) / s for r, s in zip(rows, span_s))

    classes = sorted(rows[0]["bound_by_class"], key=float)
    bound = sum(r["bound"] for r in rows)
    served = {p: sum(r[p]["all"] for r in rows) for p in ("admission", "edf_late_drop")}
    split = {c: sum(r["bound_by_class"][c] for r in rows) for c in classes}
    alone = {c: sum(r["class_alone"][c] for r in rows) for c in classes}
    admitted = {c: sum(r["admission"].get(c, 0) for r in rows) for c in classes}
    bound_rps = median_rps(lambda r: r["bound"])
    class_rps = {c: median_rps(lambda r, c=c: r["bound_by_class"][c]) for c in classes}
    return {
        "offered": sum(r["offered"] for r in rows), "bound_served": bound,
        **{f"{p}_served": n for p, n in served.items()},
        "bound_goodput_rps_median": round(bound_rps, 2),
        "admission_over_bound": round(served["admission"] / bound, 3) if bound else None,
        "edf_late_drop_over_bound": round(served["edf_late_drop"] / bound, 3) if bound else None,
        "bound_served_by_class": {c: round(v, 1) for c, v in split.items()},
        "admission_over_bound_by_class": {c: round(admitted[c] / split[c], 3) for c in classes if split[c] > 0},
        "class_alone_bound": alone,
        "admission_over_class_alone_bound": {c: round(admitted[c] / max(1, alone[c]), 3) for c in classes},
        "committed_admission_goodput_rps": committed and committed["goodput_rps"],
        "bound_committed_world_goodput_rps_median": round(median_rps(lambda r: r["bound_committed_world"]), 2),
        "committed_admission_over_bound": round(committed["goodput_rps"] / bound_rps, 3) if committed else None,
        "committed_admission_over_bound_by_class": {c: round(committed["by_class"][c] / class_rps[c], 3)
                                                    for c in classes if committed and class_rps[c] > 0},
    }


def small_windows(workload: overload_load.Workload, capacity: float, groups: int, service: ServiceModel) -> dict:
    """The bound, the exact optimum and admission on GROUP consecutive requests of the 2x windows,
    their deadlines cut by SMALL_DEADLINE_CUT so that a group alone contends as a whole window does."""
    rows = []
    for k in range(groups):
        window = workload.window(k % len(workload.slices), 2.0 * capacity, 10.0, seed=1000 * (k % 3) + 20)
        part = window.records[(k // 3) * GROUP:(k // 3 + 1) * GROUP]
        trace = make_trace(dataclasses.replace(r, t_ms=r.t_ms - part[0].t_ms,
                                               deadline_ms=r.deadline_ms / SMALL_DEADLINE_CUT) for r in part)
        problem = problem_of(trace, ideal("admission"), service)
        relaxation = math.floor(clairvoyant_bound(problem).fluid_served + 1e-6)  # bound.served is the exact here
        rows.append((relaxation, exact_optimum(problem)[0], in_time(trace, "admission", service)["all"]))
    bound, exact, admission = (sum(r[i] for r in rows) for i in range(3))
    return {"groups": groups, "requests_each": GROUP, "bound": bound, "exact": exact, "admission": admission,
            "exact_over_bound": round(exact / bound, 3), "admission_over_exact": round(admission / exact, 3),
            "groups_where_bound_above_exact": sum(r[0] > r[1] for r in rows),
            "deadlines_cut_by": SMALL_DEADLINE_CUT, "rows": rows}


def checks(result: dict[str, Any]) -> list[dict[str, Any]]:
    """What must hold before any figure counts (write_result refuses the file otherwise): the bound at
    least what every policy served in every window, and on the small windows bound >= exact >= admission."""
    windows = [w for row in result["loads"].values() for w in row["windows"]]
    small = result["small_windows_at_2x"]["rows"]
    return [
        {"check": "bound_at_least_every_policy_per_window",
         "ok": all(w["bound"] >= w[p] for w in windows for p in ("admission", "edf_late_drop"))},
        {"check": "bound_at_least_exact_at_least_admission_per_small_window",
         "ok": all(b >= e >= a for b, e, a in small)},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 1.5, 2.0, 4.0])
    parser.add_argument("--groups", type=int, default=20, help="small windows for the exact optimum")
    parser.add_argument("--requests-per-window", type=int, default=900)
    args = parser.parse_args()
    started = time.perf_counter()
    service, capacity, workload = committed_trace(args.requests_per_window)
    result = {"bench": "overload_bound", "workload": "trace", "service": QUIET_SERVICE, "capacity_rps": capacity,
              "capacity_from": "bench/results/overload-sim-trace.json", "windows": len(workload.slices),
              "loads": by_load(workload, capacity, args.loads, 10.0, service),
              "small_windows_at_2x": small_windows(workload, capacity, args.groups, service)}
    result["parity"] = checks(result)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    write_result("overload-bound-trace", result, quick=False, threads=None)


if __name__ == "__main__":
    main()
