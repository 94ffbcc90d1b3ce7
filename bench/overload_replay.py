"""The overload benchmark's deterministic replay: the issue's summary keys that the simulator can give.

The trace windows of bench/overload_sim.py (the Azure code trace's slices, deadline classes 50 / 100
/ 300 ms, each load x the capacity that run measured, read from its committed result) replayed
through loadgen/simulator.py, which drives the gateway's own scheduler object
(shared/policy/scheduler.py), in overload_sim's default world (its quiet latency model with a 10 %
compute jitter, 2 ms per request and 1 ms per batch of overhead) with one change: the jitter is the
machine's by time (JITTER_SLOT_MS slots, loadgen/machine_pace.py), not each batch's draw in send
order, so that every schedule meets the same speeds and the bound can know them. Per load:
  admission_over_bound         requests admission answers in time over the clairvoyant bound of
                               that same world (loadgen/bound.py, at the realised pace), summed
                               over the windows; by class over what the bound's own schedule serves
                               of the class (the goal's yardstick), and over the bound on each class
                               alone (an upper bound for the class, looser);
  per_batch_jitter_world       the same in overload_sim's world unchanged: admission there, and the
                               bound that world allows (every batch at the jitter's fastest factor);
                               and admission with no jitter at all (what the jitter costs it);
  admission_over_edf_late_drop in-time answers of the product over the ablation that drops the same
                               predicted-late work but never refuses early;
  idle shares                  per window, the share of its span the one worker computed nothing,
                               split (bench/overload_idle.py) into no request alive (the trace's
                               gaps), the scheduler's (a request that could still be served in time
                               not yet sent: queued, or only refused ones) and alive requests none
                               of which could still be served unsent (answered, in flight, too late);
                               `worker_idle_share_at_2x` is the scheduler's share (item 6);
  wasted_compute_share         compute spent on requests not answered in time, over all compute;
and at 2x, `priority_high_share`: with a fifth of the requests (seeded) at priority 1, the in-time
answers they get with the rest of the traffic over those they get alone (the same windows, the
priority-0 requests removed: the goal's "with the low-priority traffic absent").
What only a live run measures is null here: time to refusal, the two-replica retries, replay
against live. The latency model is overload_sim's quiet estimate, not refitted on the live worker.

    python bench/overload_replay.py [--loads 1,2,4]

Prints one JSON object and writes bench/results/overload-replay-trace.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from typing import Any

from bench.harness.provenance import write_result
from bench.overload_idle import idle_split
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


JITTER_SLOT_MS = 20.0
"""The machine's jitter by time (loadgen/machine_pace.py): each 20 ms (about one batch) at its own
factor of overload_sim's 10 % jitter, whatever the schedule, so that the bound knows every speed."""


def world(policy: str) -> SimSettings:
    """bench/overload_sim.py's default world for `policy` (10 % jitter, 2 ms a request, 1 ms a batch),
    its jitter the machine's by time (JITTER_SLOT_MS) rather than each batch's draw in send order."""
    return settings_for(policy, argparse.Namespace(request_overhead_ms=2.0, batch_overhead_ms=1.0,
                                                   gateway_ms_per_request=0.0, jitter_cv=0.1, shed_by_cost="on"),
                        jitter_slot_ms=JITTER_SLOT_MS)


def replay(trace: Trace, policy: str, service: ServiceModel, settings: SimSettings | None = None) -> dict[str, Any]:
    """In-time answers (all, per class, per priority), the worker's compute and the compute wasted,
    and why the worker idled (bench/overload_idle.py), in `settings` (default: world(policy))."""
    settings = settings or world(policy)
    log = DecisionLog()
    simulator = Simulator(settings, service, log=log)
    results = simulator.run(trace)
    good = [r.outcome == "ok" and r.latency_ms <= rec.deadline_ms for r, rec in zip(results, trace.records)]
    by_class: dict[str, int] = {}
    by_priority: dict[str, int] = {}
    for ok, record in zip(good, trace.records):
        by_class[f"{record.deadline_ms:g}"] = by_class.get(f"{record.deadline_ms:g}", 0) + ok
        by_priority[str(record.priority)] = by_priority.get(str(record.priority), 0) + ok
    compute_ms = sum(simulator.compute_ms.values())
    wasted_ms = sum(ms for index, ms in simulator.compute_ms.items() if not good[index])
    computing_ms = [(1000.0 * start, 1000.0 * end) for _, start, end in simulator.computing]
    idle = idle_split(problem_of(trace, settings, service), computing_ms, log, max(rec.t_ms for rec in trace.records))
    return {"in_time": sum(good), "by_class": by_class, "by_priority": by_priority, "compute_ms": compute_ms,
            "wasted_ms": wasted_ms, "idle": idle}


def per_batch_world(policy: str) -> SimSettings:
    """overload_sim's world itself: the jitter drawn per batch in send order (which batch is slowed
    depends on the schedule; the bound must take every batch at the fastest factor)."""
    return dataclasses.replace(world(policy), jitter_slot_ms=0.0)


def no_jitter_world(policy: str) -> SimSettings:
    """The replay's world with every batch at exactly the model's time: what the jitter costs."""
    return dataclasses.replace(world(policy), compute_jitter=())


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
    schedule = {c: sum(b.by_class.get(c, 0.0) for b in bounds) for c in classes}
    compute = sum(r["compute_ms"] for r in rows["admission"])
    per_batch = [replay(trace, "admission", service, per_batch_world("admission"))["in_time"] for trace in traces]
    per_batch_bound = sum(clairvoyant_bound(problem_of(trace, per_batch_world("admission"), service)).served
                          for trace in traces)
    split = [r["idle"] for r in rows["admission"]]
    return {
        "offered": sum(len(t.records) for t in traces), "bound_served": bound,
        **{f"{p}_served": served[p] for p in POLICIES},
        "admission_over_bound": round(served["admission"] / bound, 3) if bound else None,
        "bound_schedule_served_by_class": {c: round(schedule[c], 1) for c in classes},
        "admission_over_bound_schedule_by_class": {c: round(admitted[c] / schedule[c], 3) for c in classes
                                                   if schedule[c] > 0},
        "class_alone_bound": class_alone,
        "admission_over_class_alone_bound": {c: round(admitted[c] / max(1, class_alone[c]), 3) for c in classes},
        "admission_over_edf_late_drop": round(served["admission"] / max(1, served["edf_late_drop"]), 3),
        "per_batch_jitter_world": {
            "admission_served": sum(per_batch), "bound_at_fastest_factor": per_batch_bound,
            "admission_over_bound": round(sum(per_batch) / per_batch_bound, 3) if per_batch_bound else None},
        "no_jitter_world_admission_served": sum(replay(trace, "admission", service, no_jitter_world("admission"))
                                                ["in_time"] for trace in traces),
        "worker_idle_share_by_window": [round(x.idle, 4) for x in split],
        "idle_no_request_alive_share_by_window": [round(x.gap, 4) for x in split],
        "idle_scheduler_share_by_window": [round(x.scheduler, 4) for x in split],
        "idle_scheduler_queued_share_by_window": [round(x.queued, 4) for x in split],
        "idle_scheduler_refused_share_by_window": [round(x.refused, 4) for x in split],
        "idle_alive_nothing_servable_share_by_window": [round(x.nothing_servable, 4) for x in split],
        "idle_too_late_share_by_window": [round(x.too_late, 4) for x in split],
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
    bound_alone = sum(clairvoyant_bound(problem_of(trace, world("admission"), service)).served for trace in high_alone)
    return {"high_share_of_requests": HIGH_SHARE, "high_requests": sum(len(s) for s in high_ids),
            "high_in_time_with_all": high, "high_in_time_alone": high_alone_served,
            "priority_high_share": round(high / high_alone_served, 3) if high_alone_served else None,
            "high_bound_alone": bound_alone,
            "high_with_all_over_bound_alone": round(high / bound_alone, 3) if bound_alone else None,
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
        "world": "overload_sim's default (10 % compute jitter, 2 ms per request, 1 ms per batch), the jitter "
                 f"the machine's by time in {JITTER_SLOT_MS:g} ms slots",
        "admission_over_bound": {k: row["admission_over_bound"] for k, row in loads.items()},
        "admission_over_bound_by_class": {k: row["admission_over_bound_schedule_by_class"] for k, row in loads.items()},
        "admission_over_edf_late_drop": {k: row["admission_over_edf_late_drop"] for k, row in loads.items()},
        "worker_idle_share_at_2x": at2 and at2["idle_scheduler_share_by_window"],
        "worker_idle_share_at_2x_means": "the scheduler's share: of each 2x window's span, the time the worker "
                                         "computed nothing while a request that could still be served in time "
                                         "was not yet sent (bench/overload_idle.py); worker_idle_split_at_2x "
                                         "has the rest",
        "worker_idle_split_at_2x": at2 and {
            "idle": at2["worker_idle_share_by_window"],
            "no_request_alive": at2["idle_no_request_alive_share_by_window"],
            "scheduler": at2["idle_scheduler_share_by_window"],
            "scheduler_queued": at2["idle_scheduler_queued_share_by_window"],
            "scheduler_refused": at2["idle_scheduler_refused_share_by_window"],
            "alive_nothing_servable": at2["idle_alive_nothing_servable_share_by_window"],
            "too_late": at2["idle_too_late_share_by_window"]},
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
