"""Overload: goodput, tail and wasted compute of deadline-aware admission against fair ablations, 1x-4x capacity.

The tiny demo model compiled with configs/overload.toml, one real CPU worker (`python -m worker`,
profiled before it serves) shared by one real gateway per policy (`python -m gateway`,
loadgen/stack.py). Where the machine has two CPUs or more, the worker runs alone on the
last one with one thread, and the gateways and this client on the others, so a policy's refusals
never take CPU from the model. Every policy serves with the same gateway code and settings except:
  admission       the product: refused at once (503) when the predicted finish where the request
                  would run misses its deadline; queued work predicted late dropped before compute;
                  under overload the costliest per answer shed first (`shed_by_cost`; the
                  ablations below have it off: deadline order alone decides what is given up)
  edf_late_drop   no early refusal; deadline order; predicted-late drops (what early refusal adds)
  fcfs_late_drop  the fair FCFS: first come first served, predicted-late drops, no early refusal
  edf_bounded     the bounded queue handed the measured capacity: a token budget of `queue_factor`
                  x (what capacity drains within the median deadline), 429 beyond it; deadline
                  order, no predictions (requests still expire at their deadline)
  edf_expiry      no predictions, no budget: deadline order, a request still queued at its
                  deadline is answered 504 (what the old `fcfs_expiry` was)
Every request carries its deadline (`deadline_ms` in the body); goodput counts the answers within it.

Capacity is the best goodput of an open-loop sweep: Poisson arrivals of the workload's own request
mix, doubling from 25 requests/s until the goodput falls below 85 % of the offered rate, then 0.7x
to 1.5x that knee on `admission` and `edf_late_drop` alike, and on up in steps of 15 % while the
best is at the top. Then, per load (x capacity) and window,
every policy replays the same requests, the order rotated from window to window; figures are the
median of the windows with their spread. Every gateway first serves one discarded sweep-length
window at 0.5x.
Workloads (bench/harness/overload_load.py): `uniform` (Poisson, 8 x ~60-token samples, one deadline) and
`trace` (the Azure code trace's slices, a third each at 50, 100 and 300 ms).

Then two replicas (bench/harness/overload_pair.py): two more workers, a gateway per policy on each,
and a client that spreads each window over the pair and retries a refused (429, 503), 504 or
timed-out request once on the other within what is left of its deadline, honouring Retry-After
(loadgen/retry.py), at `--pair-load` x twice the capacity. Last, the deterministic replay of the very
windows sent live (bench/overload_replay.py's machinery, with the latency model the live worker fitted)
against the clairvoyant bound and against the live windows, replayed for that in the world each load's
windows measured: each window's requests carry X-Request-Id `w<n>-<i>`, so the worker's batch_done lines
give the compute it took for the window's batches (`computed`) beside the gateway's and the worker's CPU.
The issue's keys lead the result
(bench/harness/overload_keys.py): admission_over_bound, admission_over_edf_late_drop,
time_to_refusal_ms_p99, pair_retry_over_edf_late_drop, priority_high_share, worker_idle_share_at_2x,
wasted_compute_share, replay_vs_live_max_rel_err.

    python bench/overload.py [--workload uniform|trace|both] [--quick] [--windows 3] [--window-s 10]
                             [--pair-policies admission,edf_late_drop] [--retry-try-share 0.5]

Each workload prints one JSON line and writes bench/results/overload-<workload>.json (quick runs:
overload-<workload>-quick.json) with its provenance (bench/harness/provenance.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from bench.harness import overload_keys, overload_load, overload_summary
from bench.harness.overload_load import window_seed
from bench.harness.overload_pair import Pair, pair_cpus, pair_windows
from bench.harness.overload_policies import POLICIES, knobs
from bench.harness.overload_window import computed_batches, idle, run_window
from bench.harness.provenance import ROOT, write_result
from bench.overload_replay import checks as replay_checks
from loadgen.bodies import BodyFactory, BodyOptions
from loadgen.retry import RetryOptions
from loadgen.service import load_service_model
from loadgen.calibrate import request_shape
from loadgen.simulator import SimSettings
from loadgen.stack import GatewayProcess, Pinning, SharedWorkers, batch_lines
from loadgen.trace import Trace
from shared.config import load_config

CONFIG = ROOT / "configs" / "overload.toml"
SHAPES = SimSettings.from_config(load_config(CONFIG))
"""What a request is to the latency model (B, B*L), as the replay cuts it (bench/overload_sim.py's settings)."""
PER_REQUEST = ("seconds", "refusal_answer_ms", "expired_answer_ms", "body_to_answer")
"""A window's per-second and per-request rows and its histograms: summarised in the result, not kept whole."""
SWEEP_FACTORS = (0.7, 0.85, 1.0, 1.15, 1.3, 1.5)
SWEEP_STEP_UP, MAX_SWEEP_STEPS = 1.15, 12
"""While the best goodput is at the highest rate tried, the sweep goes on in steps of 15 % (at most
12 rates in all), so that capacity is a peak with a lower goodput above it, not the sweep's edge."""


def artifacts_folder(given: str | None) -> Path:
    """The compiled demo model (built here once when missing; the build skips when up to date)."""
    if given:
        return Path(given)
    model, out = ROOT / "models" / "demo", ROOT / "artifacts" / "overload"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if not (model / "config.json").exists():
        subprocess.run([sys.executable, "-m", "compile.demo", "--out", str(model)], cwd=ROOT, env=env, check=True)
    subprocess.run([sys.executable, "-m", "compile", "--model", str(model), "--config", str(CONFIG), "--out", str(out)],
                   cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return out


class Bench:
    """One workload's run: the shared workers, a gateway per policy, and the windows."""

    def __init__(self, workload: overload_load.Workload, workers: SharedWorkers, bodies: BodyFactory, args) -> None:
        self.workload, self.workers, self.bodies, self.args = workload, workers, bodies, args
        self.gateways: dict[str, GatewayProcess] = {}
        self.windows_run = 0

    async def start(self, name: str, **extra: Any) -> None:
        gateway = GatewayProcess(self.workers, name, knobs(name, self.workload.classes_ms, self.args.shed_by_cost, **extra)).start()
        self.gateways[name] = gateway
        await gateway.ready()

    def stop(self) -> None:
        for gateway in self.gateways.values():
            gateway.stop()

    async def window(self, name: str, rate_rps: float, index: int, seed: int, poisson: bool = False) -> dict:
        trace = (self.workload.poisson(rate_rps, self.args.sweep_s, seed) if poisson
                 else self.workload.window(index, rate_rps, self.args.window_s, seed))
        gateway = self.gateways[name]
        prefix, log = f"w{self.windows_run}-", self.workers.log_path(0)
        self.windows_run += 1
        offset = log.stat().st_size  # the worker is idle between windows: no line is half written
        result = await run_window(gateway.url, trace, self.bodies, self.workers.pids, id_prefix=prefix)
        await idle(gateway.url)
        shapes = {f"{prefix}{i}": request_shape(record, SHAPES) for i, record in enumerate(trace.records)}
        result["computed"] = computed_batches(batch_lines(log, offset), shapes)
        return result

    async def capacity(self) -> dict[str, Any]:
        """The best goodput of an open-loop sweep (see module docstring)."""
        rate, steps = 25.0, []
        while True:
            row = await self.window("admission", rate, 0, seed=len(steps), poisson=True)
            steps.append({"policy": "admission", "offered_rps": round(rate, 1), "goodput_rps": row["goodput_rps"]})
            if row["goodput_rps"] < 0.85 * rate or rate > 5000:
                break
            rate *= 2.0
        knee = max(s["goodput_rps"] for s in steps)
        rates = [factor * knee for factor in SWEEP_FACTORS]
        k = 0
        while k < len(rates):
            for name in ("admission", "edf_late_drop")[:: 1 if k % 2 == 0 else -1]:
                row = await self.window(name, rates[k], 0, seed=100 + k, poisson=True)
                steps.append({"policy": name, "offered_rps": round(rates[k], 1), "goodput_rps": row["goodput_rps"],
                              "ok_p99_ms": row["ok_p99_ms"]})
            best = max(steps, key=lambda s: s["goodput_rps"])
            if k == len(rates) - 1 and best["offered_rps"] >= round(rates[-1], 1) and len(rates) < MAX_SWEEP_STEPS:
                rates.append(rates[-1] * SWEEP_STEP_UP)  # the best is at the top: the peak is not bracketed yet
            k += 1
        return {"capacity_rps": best["goodput_rps"], "capacity_found_by": best, "sweep": steps}

    async def measure(self) -> dict[str, Any]:
        for name in ("admission", "edf_late_drop"):
            await self.start(name)
        for name in self.gateways:
            await self.window(name, 12.0, 0, seed=999, poisson=True)  # a first measured batch of each size
        capacity = await self.capacity()
        cap = capacity["capacity_rps"]
        budget = int(self.args.queue_factor * cap * self.workload.budget_deadline_ms / 1000.0
                     * self.workload.mean_tokens())
        await self.start("edf_bounded", max_queue_tokens=max(1, budget))
        for name in ("fcfs_late_drop", "edf_expiry"):
            await self.start(name)
        names = list(self.gateways)
        for name in names:  # every gateway's learnt state warmed alike, at half the capacity
            await self.window(name, 0.5 * cap, 0, seed=998, poisson=True)
        windows: dict[str, dict[str, list[dict]]] = {name: {} for name in names}
        turn = 0
        for load in self.args.loads:
            for index in range(self.args.windows):
                for name in names[turn % len(names):] + names[:turn % len(names)]:
                    row = await self.window(name, load * cap, index, seed=window_seed(index, load))
                    windows[name].setdefault(f"{load:g}x", []).append(row)
                turn += 1
        settings = {name: g.config_text for name, g in self.gateways.items()}
        return {**capacity, "token_budget": budget, "windows": windows, "gateway_configs": settings}


def live_windows(workload: overload_load.Workload, args, capacity_rps: float, load: float) -> list[Trace]:
    """The measured windows at `load` x capacity, as the live run sent them (for the replay)."""
    return [workload.window(index, load * capacity_rps, args.window_s, window_seed(index, load))
            for index in range(args.windows)]


async def run(workload: overload_load.Workload, args, pinning: Pinning | None,
              pair_pinning: Pinning | None) -> dict[str, Any]:
    """The one-replica windows, the latency model the live worker fitted, then the two replicas."""
    artifacts = artifacts_folder(args.artifacts)
    bodies = BodyFactory(BodyOptions(tokenizer_path=str(artifacts / "tokenizer.json"), label_token_ids=(10, 11)))
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    pair = None
    with tempfile.TemporaryDirectory(prefix="bench-overload-") as scratch:
        with SharedWorkers(CONFIG, artifacts, scratch, pinning) as workers:
            bench = Bench(workload, workers, bodies, args)
            try:
                measured = await bench.measure()
            finally:
                bench.stop()
            measured["fitted_service"] = load_service_model(str(workers.log_path(0)))
        if args.pair_policies:
            retry = RetryOptions(first_try_timeout_share=args.retry_try_share)
            with Pair(CONFIG, artifacts, Path(scratch) / "pair", pair_pinning, bodies, retry) as replicas:
                pair = await pair_windows(workload, args, measured, replicas)
            measured["pair_pinning"] = pair_pinning.to_json() if pair_pinning else "none: --no-pinning"
    return assemble(workload, measured, pair, pinning, args, load_before, time.perf_counter() - started)


def assemble(workload: overload_load.Workload, measured: dict, pair: dict[str, list[dict]] | None,
             pinning: Pinning | None, args, load_before: float, wall_s: float) -> dict[str, Any]:
    """The result: the issue's keys first (bench/harness/overload_keys.py), then the table, the windows
    and the replay they were checked against."""
    windows = measured.pop("windows")
    service = measured.pop("fitted_service")
    figures = overload_summary.table({name: loads for name, loads in windows.items()})
    keys = overload_summary.ratios(figures, measured["capacity_rps"])
    traces = {f"{load:g}x": live_windows(workload, args, measured["capacity_rps"], load) for load in args.loads}
    replay = overload_keys.replayed(traces, service, list(windows), measured["token_budget"],
                                    overload_keys.measured_world(windows, service))
    issue = overload_keys.keys(figures, windows, replay, pair, keys)
    median_window = {name: {load: rows[len(rows) // 2]["seconds"] for load, rows in loads.items()}
                     for name, loads in windows.items()}
    return {
        "bench": "overload", "workload": workload.name, "deadlines_ms": list(workload.classes_ms),
        "admission_shed_by_cost": args.shed_by_cost,
        **issue, **{k: v for k, v in keys.items() if k not in issue},
        "goals": overload_summary.goals(figures, keys, workload.name),
        "replay": {"latency_model_fitted_on_the_live_worker": service.to_dict(),
                   "world": "bench/overload_replay.py's: 10 % compute jitter, 2 ms per request, 1 ms per batch; "
                            "against live, with what the live windows measured in place of the per-batch overhead, "
                            "a busy gateway loop, the worker's own time per batch and its speed against the "
                            "fitted model (measured_world per load)",
                   **replay},
        "parity": replay_checks(replay),
        "pair": pair and {"load": f"{args.pair_load:g}x of twice the capacity", "windows": pair,
                          "pinning": measured.pop("pair_pinning"),
                          "retry": {"first_try_timeout_share": args.retry_try_share,
                                    "statuses": "429, 503, 504, and a first try timed out"}},
        "capacity_rps": measured["capacity_rps"], "capacity_found_by": measured["capacity_found_by"],
        "capacity_check": overload_summary.capacity_check(figures, measured["capacity_rps"]),
        "loads": [f"{load:g}x" for load in args.loads], "windows": args.windows,
        "window_s": args.window_s if workload.name == "uniform" else "one trace slice each (its mean rate at the load)",
        "requests_per_window": args.requests_per_window if workload.name == "trace" else None,
        "trace_clipped_rows": workload.clipped_rows if workload.name == "trace" else None,
        "token_budget_edf_bounded": measured["token_budget"], "queue_factor": args.queue_factor,
        "policies": {name: POLICIES[name] for name in figures}, "table": figures,
        "capacity_sweep": measured["sweep"],
        "pinning": pinning.to_json() if pinning else "none: fewer than 2 CPUs, or --no-pinning",
        "worker_threads": load_config(CONFIG).worker.cpu_threads, "cpus": os.cpu_count(),
        "load_average_before": round(load_before, 2), "load_average_after": round(os.getloadavg()[0], 2),
        "wall_s": round(wall_s, 1),
        "per_second_of_median_window": median_window,
        "window_summaries": {name: {load: [{k: v for k, v in row.items() if k not in PER_REQUEST} for row in rows]
                                    for load, rows in loads.items()} for name, loads in windows.items()},
        "gateway_configs": measured["gateway_configs"],
    }


def workloads(args) -> list[overload_load.Workload]:
    chosen = ("uniform", "trace") if args.workload == "both" else (args.workload,)
    out = []
    for name in chosen:
        if name == "uniform":
            out.append(overload_load.uniform(args.slo_ms))
        else:
            out.append(overload_load.trace(Path(args.trace), args.windows, args.requests_per_window,
                                           tuple(args.classes)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("uniform", "trace", "both"), default="both")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 window of 3 s per load, loads 1x, 2x, 4x")
    parser.add_argument("--windows", type=int, help="windows per policy and load (default 3, quick 1)")
    parser.add_argument("--window-s", type=float, help="seconds of a uniform window (default 10, quick 3)")
    parser.add_argument("--sweep-s", type=float, help="seconds of a capacity-sweep step (default 6, quick 2)")
    parser.add_argument("--loads", type=lambda s: [float(x) for x in s.split(",")],
                        help="offered load, x capacity (default 1,1.5,2,4; quick 1,2,4)")
    parser.add_argument("--slo-ms", type=float, default=100.0, help="uniform: every request's deadline (default 100)")
    parser.add_argument("--classes", type=lambda s: [float(x) for x in s.split(",")], default=[50.0, 100.0, 300.0],
                        help="trace: the deadline classes, drawn with equal chance (default 50,100,300)")
    parser.add_argument("--trace", default=str(overload_load.TRACE), help="an Azure LLM inference trace CSV "
                        "(default: the committed slice, bench/data/azure_code_2023_slice.csv)")
    parser.add_argument("--requests-per-window", type=int, help="trace: requests in a window's slice (default 900)")
    parser.add_argument("--queue-factor", type=float, default=0.8,
                        help="edf_bounded: its token budget as a fraction of what drains within the median deadline")
    parser.add_argument("--artifacts",
                        help="compiled artifacts (default: build the demo model with configs/overload.toml)")
    parser.add_argument("--no-pinning", action="store_true", help="leave every process on every CPU")
    parser.add_argument("--pair-policies", type=lambda s: [x for x in s.split(",") if x],
                        help="two replicas with retries: the policies run so (default: all; quick: admission,"
                             "edf_late_drop; empty: no pair run)")
    parser.add_argument("--result-suffix", default="", help="appended to the result's name (a run on a busy machine "
                        "kept beside the quiet one: overload-<workload>-busy.json with -busy)")
    parser.add_argument("--pair-load", type=float, default=2.0, help="two replicas: offered load, x twice the capacity")
    parser.add_argument("--retry-try-share", type=float, help="two replicas: give up a first try unanswered after "
                        "this share of its deadline and retry it (default: a first try waits for its answer)")
    parser.add_argument("--shed-by-cost", choices=("on", "off"), default="on", help="admission (the product) with "
                        "[gateway] shed_by_cost on (the default) or off (results: overload-<workload>-shed-off.json); "
                        "the ablations keep it off")
    args = parser.parse_args()
    args.windows = args.windows or (1 if args.quick else 3)
    args.window_s = args.window_s or (3.0 if args.quick else 10.0)
    args.sweep_s = args.sweep_s or (2.0 if args.quick else 6.0)
    args.loads = args.loads or ([1.0, 2.0, 4.0] if args.quick else [1.0, 1.5, 2.0, 4.0])
    args.requests_per_window = args.requests_per_window or (300 if args.quick else 900)
    if args.pair_policies is None:
        args.pair_policies = ["admission", "edf_late_drop"] if args.quick else list(POLICIES)
    unknown = sorted(set(args.pair_policies) - set(POLICIES))
    if unknown:
        parser.error(f"--pair-policies: unknown {', '.join(unknown)}; the policies are {', '.join(POLICIES)}")
    pinning = None if args.no_pinning else Pinning.split()  # once: after pin_caller this process sees one CPU
    pair_pinning = None if args.no_pinning else pair_cpus()
    if pinning is not None:
        pinning.pin_caller()
    for workload in workloads(args):
        result = uvloop.run(run(workload, args, pinning, pair_pinning))  # the faster loop: the client lags less
        suffix = ("-shed-off" if args.shed_by_cost == "off" else "") + args.result_suffix + ("-quick" if args.quick else "")
        write_result(f"overload-{workload.name}{suffix}", result, quick=args.quick,
                     threads={"worker": load_config(CONFIG).worker.cpu_threads})


if __name__ == "__main__":
    main()
