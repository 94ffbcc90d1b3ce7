"""The overload benchmark's deterministic replay: the issue's summary keys that the simulator can give.

The trace windows of bench/overload_sim.py (the Azure code trace's slices, deadline classes 50 / 100
/ 300 ms, each load x the capacity that run measured, read from its committed result) replayed
through loadgen/simulator.py, which drives the gateway's own scheduler object
(shared/policy/scheduler.py), in overload_sim's default world (its quiet latency model with a 10 %
compute jitter, 2 ms per request and 1 ms per batch of overhead). Per load:
  admission_over_bound         requests admission answers in time over the clairvoyant bound of
                               that same world (loadgen/bound.py: every batch at the jitter's fastest
                               factor, so it provably holds), summed over the windows; by class
                               against the bound on each class alone (an upper bound for the class);
  admission_over_edf_late_drop in-time answers of the product over the ablation that drops the same
                               predicted-late work but never refuses early;
  worker_idle_share            per window, the share of its span the one worker was not computing,
                               beside the share in which no request was alive at all (arrived and
                               not yet due: idle no scheduler could fill) and how many refusals were
                               made while the worker was idle (the burst question: item 6);
  wasted_compute_share         compute spent on requests not answered in time, over all compute;
and at 2x, `priority_high_share`: with a fifth of the requests (seeded) at priority 1, the in-time
answers they get with the rest of the traffic over those they get alone (the same windows).
What only a live run measures is null here: time to refusal, the two-replica retries, replay
against live. The latency model is overload_sim's quiet estimate, not refitted on the live worker.

    python bench/overload_replay.py [--loads 1,2,4]

Prints one JSON object and writes bench/results/overload-replay-trace.json.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import math
import random
import time
from typing import Any

from bench.harness.provenance import write_result
from bench.overload_sim import QUIET_SERVICE, committed_trace, settings_for
from loadgen.bound import clairvoyant_bound, class_bounds
from loadgen.bound_problem import problem_of
from loadgen.service import ServiceModel
from loadgen.simulator import SimSettings, Simulator
from loadgen.trace import Trace, make_trace
from shared.policy.scheduler import DecisionLog

HIGH_SHARE = 0.2
"""The share of requests at the higher priority in the priority run."""
POLICIES = ("admission", "edf_late_drop")


def world(policy: str) -> SimSettings:
    """bench/overload_sim.py's default world for `policy` (10 % jitter, 2 ms a request, 1 ms a batch)."""
    return settings_for(policy, argparse.Namespace(request_overhead_ms=2.0, batch_overhead_ms=1.0,
                                                   gateway_ms_per_request=0.0, jitter_cv=0.1, shed_by_cost="on"))


def replay(trace: Trace, policy: str, service: ServiceModel) -> dict[str, Any]:
    """In-time answers (all, per class, per priority), the worker's compute and the compute wasted,
    and how many refusals were made while the worker was idle."""
    log = DecisionLog()
    simulator = Simulator(world(policy), service, log=log)
    results = simulator.run(trace)
    computing = sorted((start, end) for _, start, end in simulator.computing)
    refusals = [entry[1] / 1e6 for entry in log.entries if entry[0] == "refuse"]
    good = [r.outcome == "ok" and r.latency_ms <= rec.deadline_ms for r, rec in zip(results, trace.records)]
    by_class: dict[str, int] = {}
    by_priority: dict[str, int] = {}
    for ok, record in zip(good, trace.records):
        by_class[f"{record.deadline_ms:g}"] = by_class.get(f"{record.deadline_ms:g}", 0) + ok
        by_priority[str(record.priority)] = by_priority.get(str(record.priority), 0) + ok
    compute_ms = sum(simulator.compute_ms.values())
    wasted_ms = sum(ms for index, ms in simulator.compute_ms.items() if not good[index])
    span_ms = max(rec.t_ms for rec in trace.records) or 1.0
    idle_ms = sum(max(0.0, b - a) for a, b in _gaps(computing, span_ms / 1000.0)) * 1000.0
    queued_idle_ms = _overlap_ms(_queued(log), _gaps(computing, span_ms / 1000.0))
    return {"in_time": sum(good), "by_class": by_class, "by_priority": by_priority, "compute_ms": compute_ms,
            "wasted_ms": wasted_ms, "idle_share": max(0.0, 1.0 - compute_ms / (span_ms * world(policy).workers)),
            "refusals": len(refusals), "refused_while_idle": sum(not _inside(computing, t) for t in refusals),
            "idle_with_work_queued_share": queued_idle_ms / idle_ms if idle_ms else 0.0}


def _gaps(intervals: list[tuple[float, float]], end_s: float) -> list[tuple[float, float]]:
    """The stretches of [0, end_s) outside the sorted, disjoint intervals (when the worker is idle)."""
    gaps, at = [], 0.0
    for start, stop in intervals:
        if start > at:
            gaps.append((at, min(start, end_s)))
        at = max(at, stop)
    return gaps + ([(at, end_s)] if at < end_s else [])


def _queued(log: DecisionLog) -> list[tuple[float, float]]:
    """When each admitted request had work queued: from its admission to its last batch or its drop."""
    admitted: dict[str, float] = {}
    left: dict[str, float] = {}
    for kind, t_us, *what in log.entries:
        if kind == "admit":
            admitted[what[0]] = t_us / 1e6
        elif kind == "batch":
            for request in what[1]:
                left[request] = t_us / 1e6
        elif kind == "drop" and what[0] in admitted:
            left[what[0]] = min(left.get(what[0], t_us / 1e6), t_us / 1e6)
    return sorted((t, left.get(request, t)) for request, t in admitted.items())


def _overlap_ms(spans: list[tuple[float, float]], gaps: list[tuple[float, float]]) -> float:
    """Milliseconds of the gaps covered by at least one of the spans."""
    merged: list[list[float]] = []
    for start, stop in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        elif stop > start:
            merged.append([start, stop])
    total = 0.0
    for start, stop in gaps:
        for a, b in merged:
            total += max(0.0, min(b, stop) - max(a, start))
    return total * 1000.0


def _inside(intervals: list[tuple[float, float]], t: float) -> bool:
    """Whether `t` falls in one of the sorted, disjoint (start, end) intervals."""
    k = bisect.bisect_right(intervals, (t, math.inf)) - 1
    return k >= 0 and intervals[k][0] <= t < intervals[k][1]


def nothing_alive_share(trace: Trace) -> float:
    """The share of the window in which no request is alive (arrived, deadline not passed): time no
    scheduler, clairvoyant or not, could fill with work that counts."""
    span_ms, covered, end = max(r.t_ms for r in trace.records), 0.0, -math.inf
    for start, due in sorted((r.t_ms, r.t_ms + r.deadline_ms) for r in trace.records):
        due = min(due, span_ms)
        if due > end:
            covered, end = covered + due - max(start, end), due
    return 1.0 - covered / span_ms if span_ms else 0.0


def load_row(traces: list[Trace], service: ServiceModel) -> dict[str, Any]:
    rows = {p: [replay(trace, p, service) for trace in traces] for p in POLICIES}
    problems = [problem_of(trace, world("admission"), service) for trace in traces]
    bounds = [clairvoyant_bound(problem) for problem in problems]
    alone = [class_bounds(problem) for problem in problems]
    bound = sum(b.served for b in bounds)
    served = {p: sum(r["in_time"] for r in rows[p]) for p in POLICIES}
    classes = sorted(alone[0], key=float)
    admitted = {c: sum(r["by_class"].get(c, 0) for r in rows["admission"]) for c in classes}
    class_alone = {c: sum(a[c] for a in alone) for c in classes}
    compute = sum(r["compute_ms"] for r in rows["admission"])
    return {
        "offered": sum(len(t.records) for t in traces), "bound_served": bound,
        **{f"{p}_served": served[p] for p in POLICIES},
        "admission_over_bound": round(served["admission"] / bound, 3) if bound else None,
        "admission_over_class_alone_bound": {c: round(admitted[c] / max(1, class_alone[c]), 3) for c in classes},
        "admission_over_edf_late_drop": round(served["admission"] / max(1, served["edf_late_drop"]), 3),
        "worker_idle_share_by_window": [round(r["idle_share"], 3) for r in rows["admission"]],
        "nothing_alive_share_by_window": [round(nothing_alive_share(t), 3) for t in traces],
        "refusals_made_while_worker_idle": [f"{r['refused_while_idle']}/{r['refusals']}" for r in rows["admission"]],
        "idle_with_work_queued_share_by_window": [round(r["idle_with_work_queued_share"], 4) for r in rows["admission"]],
        "wasted_compute_share": round(sum(r["wasted_ms"] for r in rows["admission"]) / compute, 4) if compute else 0.0,
        "windows": [{"bound": b.served, **{p: rows[p][i]["in_time"] for p in POLICIES}}
                    for i, b in enumerate(bounds)],
    }


def with_priorities(trace: Trace, seed: int) -> Trace:
    """The window with HIGH_SHARE of its requests (seeded) at priority 1."""
    rng = random.Random(seed)
    return make_trace(dataclasses.replace(r, priority=1 if rng.random() < HIGH_SHARE else 0) for r in trace.records)


def priority_row(traces: list[Trace], service: ServiceModel) -> dict[str, Any]:
    mixed = [with_priorities(trace, seed=k) for k, trace in enumerate(traces)]
    high_alone = [make_trace(r for r in trace.records if r.priority) for trace in mixed]
    flat = [replay(trace, "admission", service) for trace in traces]
    together = [replay(trace, "admission", service) for trace in mixed]
    alone = [replay(trace, "admission", service) for trace in high_alone]
    high = sum(r["by_priority"].get("1", 0) for r in together)
    high_alone_served = sum(r["in_time"] for r in alone)
    high_ids = [{i for i, r in enumerate(trace.records) if r.priority} for trace in mixed]
    return {"high_share_of_requests": HIGH_SHARE, "high_requests": sum(len(s) for s in high_ids),
            "high_in_time_with_all": high, "high_in_time_alone": high_alone_served,
            "priority_high_share": round(high / high_alone_served, 3) if high_alone_served else None,
            "low_in_time_with_all": sum(r["by_priority"].get("0", 0) for r in together),
            "all_in_time_without_priorities": sum(r["in_time"] for r in flat),
            "all_in_time_with_priorities": sum(r["in_time"] for r in together)}


def checks(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Before any figure counts: the bound at least what every policy served in every window."""
    windows = [w for row in result["loads"].values() for w in row["windows"]]
    return [{"check": "bound_at_least_every_policy_per_window",
             "ok": all(w["bound"] >= w[p] for w in windows for p in POLICIES)}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 2.0, 4.0])
    parser.add_argument("--requests-per-window", type=int, default=900)
    args = parser.parse_args()
    started = time.perf_counter()
    service, capacity, workload = committed_trace(args.requests_per_window)

    def windows(load: float) -> list[Trace]:
        return [workload.window(i, load * capacity, 10.0, seed=1000 * i + int(10 * load))
                for i in range(len(workload.slices))]

    loads = {f"{load:g}x": load_row(windows(load), service) for load in args.loads}
    at2 = loads.get("2x")
    result = {
        "bench": "overload_replay", "workload": "trace", "service": QUIET_SERVICE, "capacity_rps": capacity,
        "capacity_from": "bench/results/overload-sim-trace.json", "windows": len(workload.slices),
        "world": "overload_sim's default: 10 % compute jitter, 2 ms per request, 1 ms per batch",
        "admission_over_bound": {k: row["admission_over_bound"] for k, row in loads.items()},
        "admission_over_bound_by_class": {k: row["admission_over_class_alone_bound"] for k, row in loads.items()},
        "admission_over_edf_late_drop": {k: row["admission_over_edf_late_drop"] for k, row in loads.items()},
        "worker_idle_share_at_2x": at2 and at2["worker_idle_share_by_window"],
        "wasted_compute_share": {k: row["wasted_compute_share"] for k, row in loads.items()},
        "priority_high_share": None, "time_to_refusal_ms_p99": None, "pair_retry_over_edf_late_drop": None,
        "replay_vs_live_max_rel_err": None,
        "not_measured_here": "time to refusal, the two-replica retries and replay against live need live runs",
        "loads": loads,
    }
    if at2 is not None:
        result["priority_at_2x"] = priority_row(windows(2.0), service)
        result["priority_high_share"] = result["priority_at_2x"]["priority_high_share"]
    result["parity"] = checks(result)
    result["wall_s"] = round(time.perf_counter() - started, 1)
    write_result("overload-replay-trace", result, quick=False, threads=None)


if __name__ == "__main__":
    main()
