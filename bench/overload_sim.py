"""The overload benchmark replayed offline: the same policies, workloads and loads through the simulator.

bench/overload.py's five policies (its POLICIES, the bounded queue sized as there) and workloads
(bench/harness/overload_load.py) run through loadgen/simulator.py, which drives the gateway's own policy
code (shared/policy) around simulated workers. The worker is a latency model of the tiny demo model
(`--service`, alpha,beta,gamma,delta of shared/latency_model.py; the default is a quiet estimate
from bench/results/overload-*.json's measured batch service halved for its worker's ~0.47 of a
core: a request of 8 x 60 tokens alone ~20 ms, two together ~28 ms), with a measured-like jitter
and request/batch overheads. Capacity is the best goodput of a rate sweep on `admission` and
`edf_late_drop`, as live. Direction only, never a headline: no machine, no contention, no client.

    python bench/overload_sim.py [--workload uniform|trace|both] [--windows 3]

Prints one JSON object per workload (goodput median and spread, the shares refused and dropped after
admission, batch fill, wasted share per policy and load; goodput by class at 2x for the trace) and
writes bench/results/overload-sim-<workload>.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path
from typing import Any

from bench.harness import overload_load
from bench.harness.overload_policies import POLICIES, UNBOUNDED
from bench.harness.provenance import write_result
from loadgen.service import ServiceModel
from loadgen.simulator import SimSettings, Simulator
from shared.config import load_config
from shared.latency_model import LatencyModel

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "overload.toml"
QUIET_SERVICE = "0.0015,0.004,0.0,12.0"
"""T_ms = (alpha*B + beta)*L + gamma*B + delta: B=8, L=60 -> 20.6 ms; B=16 -> 27.8 ms."""
BUSY_SERVICE = "0.0032,0.006,0.0,24.0"
"""The busy run's measured batches (bc8f0f4, load ~10): B=8, L=60 -> 40 ms; B=16 -> 55 ms."""
SWEEP = (0.7, 0.85, 1.0, 1.15, 1.3, 1.5)


COMMITTED_TRACE = Path(__file__).resolve().parent / "results" / "overload-sim-trace.json"
"""This benchmark's committed trace run: its measured capacity and windows anchor the replays built on it."""


def committed_trace(requests_per_window: int) -> tuple[ServiceModel, float, overload_load.Workload]:
    """The quiet service model, the capacity the committed trace run measured (requests/s) and its trace
    windows: what bench/overload_bound.py and bench/overload_replay.py replay at multiples of that capacity."""
    service = ServiceModel({"score": LatencyModel(*(float(v) for v in QUIET_SERVICE.split(",")))})
    committed = json.loads(COMMITTED_TRACE.read_text())
    workload = overload_load.trace(overload_load.TRACE, committed["windows"], requests_per_window,
                                   tuple(float(c) for c in committed.get("deadlines_ms", (50, 100, 300))))
    return service, committed["capacity_rps"], workload


def settings_for(policy: str, args, **extra: Any) -> SimSettings:
    base = SimSettings.from_config(load_config(CONFIG), request_overhead_ms=args.request_overhead_ms,
                                   batch_overhead_ms=args.batch_overhead_ms,
                                   gateway_ms_per_request=args.gateway_ms_per_request)
    rng = random.Random(7)
    jitter = tuple(rng.lognormvariate(0.0, args.jitter_cv) for _ in range(1000))
    product = {"shed_by_cost": args.shed_by_cost == "on"} if policy == "admission" else {}
    knobs = {**POLICIES[policy], "max_queue_tokens": UNBOUNDED, "compute_jitter": jitter, **product, **extra}
    return base.with_knobs(knobs)


def window(policy: str, trace, args, service, **extra: Any) -> dict[str, Any]:
    sim = Simulator(settings_for(policy, args, **extra), service)
    results = sim.run(trace)
    span_s = max(r.t_ms for r in trace.records) / 1000.0 or 1.0
    good = [r for r, rec in zip(results, trace.records)
            if r.outcome == "ok" and r.latency_ms <= (rec.deadline_ms or args.slo_ms)]
    good_ids = {r.index for r in good}
    compute = sum(sim.compute_ms.values())
    wasted = sum(ms for index, ms in sim.compute_ms.items() if index not in good_ids)
    by_class: dict[str, list[int]] = {}
    by_size: dict[str, list[int]] = {}
    for r, rec in zip(results, trace.records):
        by_class.setdefault(f"{rec.deadline_ms or args.slo_ms:g}", []).append(r.index in good_ids)
        by_size.setdefault(size_class(rec), []).append(r.index in good_ids)
    return {"goodput_rps": len(good) / span_s, "offered": len(results),
            "refused": sum(r.outcome in ("deadline_unmeetable", "queue_full") for r in results),
            "dropped": sum(r.outcome == "deadline_exceeded" for r in results),
            "wasted_share": wasted / compute if compute else 0.0,
            "batch_fill": statistics.fmean(sim.batch_fill) if sim.batch_fill else None,
            "by_class": {c: sum(v) / span_s for c, v in by_class.items()},
            "by_size": {c: (sum(v), len(v)) for c, v in by_size.items()}}


SIZES = ((256, "tokens<=256"), (767, "257-767"), (1023, "768-1023"))


def size_class(record) -> str:
    """A request's size bucket by its tokens (the trace's largest, 8 x 128 clipped, are their own)."""
    tokens = sum(record.sample_tokens or ())
    return next((name for most, name in SIZES if tokens <= most), "tokens>=1024")


def sweep_capacity(workload: overload_load.Workload, args, service) -> float:
    """As live: double from 25 requests/s until goodput falls below 85 % of the offered rate, then
    SWEEP x that knee on admission and edf_late_drop; the best goodput. Admission is swept with
    shed_by_cost off (as before the rule), so that runs with the rule off and on offer the same rates."""
    def goodput(policy: str, rate: float, seed: int) -> float:
        return window(policy, workload.poisson(rate, 10.0, seed), args, service, shed_by_cost=False)["goodput_rps"]
    rate, knee = 25.0, 0.0
    while rate < 5000:
        knee = max(knee, goodput("admission", rate, 0))
        if knee < 0.85 * rate:
            break
        rate *= 2.0
    return max(goodput(policy, f * knee, 100 + k) for k, f in enumerate(SWEEP) for policy in ("admission", "edf_late_drop"))


def run(workload: overload_load.Workload, args) -> dict[str, Any]:
    service = ServiceModel({"score": LatencyModel(*(float(v) for v in args.service.split(",")))})
    capacity = sweep_capacity(workload, args, service)
    budget = int(0.8 * capacity * workload.budget_deadline_ms / 1000.0 * workload.mean_tokens())
    table: dict[str, dict[str, Any]] = {}
    for policy in POLICIES:
        extra = {"max_queue_tokens": max(1, budget)} if policy == "edf_bounded" else {}
        for load in args.loads:
            rows = [window(policy, workload.window(i, load * capacity, args.window_s, seed=1000 * i + int(10 * load)),
                           args, service, **extra) for i in range(args.windows)]
            goodputs = sorted(r["goodput_rps"] for r in rows)
            classes = rows[0]["by_class"]
            table.setdefault(policy, {})[f"{load:g}x"] = {
                "goodput_rps": round(statistics.median(goodputs), 2),
                "spread": [round(goodputs[0], 2), round(goodputs[-1], 2)],
                "refused_share": round(statistics.median(r["refused"] / r["offered"] for r in rows), 3),
                "dropped_share": round(statistics.median(r["dropped"] / r["offered"] for r in rows), 3),
                "wasted_share": round(statistics.median(r["wasted_share"] for r in rows), 4),
                "batch_fill": round(statistics.median(r["batch_fill"] or 0.0 for r in rows), 3),
                "by_class": {c: round(statistics.median(r["by_class"][c] for r in rows), 2) for c in classes},
                "in_time_by_size": {c: round(sum(r["by_size"].get(c, (0, 0))[0] for r in rows)
                                             / max(1, sum(r["by_size"].get(c, (0, 0))[1] for r in rows)), 3)
                                    for c in sorted({c for r in rows for c in r["by_size"]})}}
    ablations = [p for p in POLICIES if p != "admission"]
    at2 = {p: table[p]["2x"]["goodput_rps"] for p in POLICIES} if "2x" in table["admission"] else {}
    best = max(ablations, key=lambda p: at2[p]) if at2 else None
    own_best = max(f["goodput_rps"] for f in table["admission"].values())
    return {"bench": "overload_sim", "workload": workload.name, "service": args.service,
            "shed_by_cost": args.shed_by_cost,
            "jitter_cv": args.jitter_cv, "request_overhead_ms": args.request_overhead_ms,
            "gateway_ms_per_request": args.gateway_ms_per_request,
            "batch_overhead_ms": args.batch_overhead_ms, "windows": args.windows,
            "capacity_rps": round(capacity, 1), "token_budget_edf_bounded": budget,
            "admission_at_2x_over_best_ablation": round(at2["admission"] / at2[best], 3) if best else None,
            "best_ablation_at_2x": best,
            "admission_at_4x_over_own_best": (round(table["admission"]["4x"]["goodput_rps"] / own_best, 3)
                                              if "4x" in table["admission"] else None),
            "wasted_compute_share": {p: table[p]["2x"]["wasted_share"] for p in POLICIES} if at2 else None,
            "goodput_by_class_at_2x": {p: table[p]["2x"]["by_class"] for p in POLICIES} if at2 else None,
            "table": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("uniform", "trace", "both"), default="both")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 1.5, 2.0, 4.0])
    parser.add_argument("--service", default=QUIET_SERVICE, help="alpha,beta,gamma,delta of the worker's batches "
                        f"(default: the quiet estimate; the busy run's: {BUSY_SERVICE})")
    parser.add_argument("--jitter-cv", type=float, default=0.1, help="spread of compute around the model")
    parser.add_argument("--request-overhead-ms", type=float, default=2.0, help="HTTP etc. per request, half each way")
    parser.add_argument("--gateway-ms-per-request", type=float, default=0.0,
                        help="the gateway event loop's work per arrival: bursts make it run late (0: not modelled)")
    parser.add_argument("--batch-overhead-ms", type=float, default=1.0, help="messages per batch, half each way")
    parser.add_argument("--slo-ms", type=float, default=100.0)
    parser.add_argument("--requests-per-window", type=int, default=900)
    parser.add_argument("--shed-by-cost", choices=("on", "off"), default="on", help="the product policy "
                        "(admission) with [gateway] shed_by_cost on (the default) or off; the ablations keep it off")
    args = parser.parse_args()
    chosen = ("uniform", "trace") if args.workload == "both" else (args.workload,)
    for name in chosen:
        workload = (overload_load.uniform(args.slo_ms) if name == "uniform" else
                    overload_load.trace(overload_load.TRACE, args.windows, args.requests_per_window, (50.0, 100.0, 300.0)))
        suffix = "-shed-off" if args.shed_by_cost == "off" else ""
        write_result(f"overload-sim-{name}{suffix}", run(workload, args), quick=False, threads=None)


if __name__ == "__main__":
    main()
