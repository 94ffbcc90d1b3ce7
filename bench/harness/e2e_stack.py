"""End-to-end measurement for bench/gpu_suite.py on loadgen's own parts: a local stack
(loadgen/stack.py: `python -m gateway --spawn-workers` on the deployment's config), open-loop
Poisson load (loadgen/replayer.py) and the same summary loadgen reports (loadgen/stats.py).

Requests arrive at a fixed Poisson rate whatever the latency (open loop), so queueing shows in the
figures. Latency is measured per request from its scheduled arrival time to the last byte of the
answer; goodput counts the answers within the SLO per second of the offered window (so it can never
exceed the offered rate), and the client's own lag behind the schedule is reported, so a saturated
client shows.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from bench.harness.common import node_device
from loadgen.bodies import BodyFactory
from loadgen.replayer import ReplayOptions, run_replay
from loadgen.stack import LocalStack, deployment_toml
from loadgen.stats import summarize
from loadgen.trace import TraceRecord, make_trace

ROUTES = {"/v1/score": "score", "/v1/generate": "generate"}


class Stack(LocalStack):
    """loadgen's local stack for `config` on `device` (context manager): ready, its profile settled,
    once entered (loadgen/stack.py)."""

    def __init__(self, config, artifacts: Path, device: str, folder: Path):
        worker = dataclasses.replace(config.worker, devices=(node_device(device),))
        gateway = dataclasses.replace(config.gateway, access_log=False)
        if device == "cpu":  # seconds-long CPU batches: a longer profile, no heartbeat-timeout during a batch
            worker = dataclasses.replace(worker, profile_budget_s=60.0, profile_repeats=1, warmup_runs=1)
            gateway = dataclasses.replace(gateway, worker_timeout_ms=120_000, max_deadline_ms=300_000)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "e2e.toml"
        path.write_text(deployment_toml(config.replace(worker=worker, gateway=gateway)))
        super().__init__(path, artifacts, folder, startup_timeout_s=900.0)


def poisson_trace(route: str, bodies: list[dict], rate_per_s: float, seed: int):
    """The bodies at Poisson arrivals of `rate_per_s`, conditioned to fall in a window of
    count / rate seconds (uniform order statistics): the offered rate is then exactly count / window,
    so goodput over the same window can never exceed it. Returns (trace, window in s)."""
    window_s = len(bodies) / rate_per_s
    rng = random.Random(seed)
    times = sorted(rng.uniform(0.0, window_s) for _ in bodies)
    records = [TraceRecord(t_ms=t * 1000.0, route=ROUTES[route], body=body) for t, body in zip(times, bodies)]
    return make_trace(records), window_s


def run_load(url: str, route: str, bodies: list[dict], rate_per_s: float, seed: int, slo_ms: float) -> dict:
    """Send the bodies open loop (loadgen's replayer) and summarise them as loadgen does."""
    trace, window_s = poisson_trace(route, bodies, rate_per_s, seed)
    run = run_replay(trace, BodyFactory(), ReplayOptions(url=url, timeout_s=60.0, progress=False,
                                                         scrape_metrics=False))
    summary = summarize(run.results, slo_ms, window_s)
    every, latency = summary["routes"]["all"], summary["routes"]["all"]["latency_ms"]
    return {
        "requests": every["sent"], "window_s": window_s, "offered_per_s": every["offered_rps"], "slo_ms": slo_ms,
        "answers": every["outcomes"], "ok_within_slo": every["within_slo"], "ok_late": every["ok"] - every["within_slo"],
        "goodput_per_s": every["goodput_rps"], "mean_ms": latency["mean"], "p50_ms": latency["p50"],
        "p99_ms": latency["p99"], "max_ms": latency["max"], "client_send_lag_p99_ms": summary["sender"]["lag_ms"]["p99"],
        "seed": seed,
    }
