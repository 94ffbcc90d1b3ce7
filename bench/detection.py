"""How long the gateway's pool takes to declare a worker lost: SIGKILL and SIGSTOP, ipc:// and tcp://.

A stand-in worker process (loadgen/standin_worker.py) serves a real WorkerPool (gateway/worker_pool.py)
in this process; per run, the time from the signal to the pool's link leaving `ready`. docs/operations.md's
bound: a dead, unreachable or frozen worker is lost within T = worker_timeout_ms (ZeroMQ's
heartbeats, gateway/liveness.py), plus the event loop's latency; `max_over_bound` is the slowest run's
time over T (at most 1 when the bound held). tests/chaos/test_chaos.py asserts the same bound, with
a margin, on the whole stack.

    .venv/bin/python bench/detection.py [--worker-timeout-ms 1000,500] [--runs 5] [--quick]

Prints one JSON object as its last line and writes it to bench/results/detection.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.harness.provenance import ROOT, timed_part, write_result
from gateway.worker_link import READY
from gateway.worker_pool import WorkerPool
from loadgen.processes import free_port, spawn

SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGSTOP": signal.SIGSTOP}
TRANSPORTS = ("ipc", "tcp")
STATE_TIMEOUT_S = 60.0


async def _until(pool: WorkerPool, ready: bool) -> None:
    changed = asyncio.Event()
    pool.on_change(changed.set)
    while (pool.links[0].state == READY) != ready:
        changed.clear()
        await asyncio.wait_for(changed.wait(), STATE_TIMEOUT_S)


async def detect_once(endpoint: str, signum: int, worker_timeout_ms: int, log: Path) -> float:
    """Milliseconds from `signum` sent to the worker to the pool declaring it lost (the stand-in's output in
    `log`)."""
    worker = spawn([sys.executable, "-m", "loadgen.standin_worker", "--endpoint", endpoint], log, cwd=ROOT)
    pool = WorkerPool((endpoint,), worker_timeout_ms, 2)
    await pool.start()
    try:
        await _until(pool, ready=True)
        sent = time.monotonic()
        os.kill(worker.pid, signum)
        await _until(pool, ready=False)
        return (time.monotonic() - sent) * 1000.0
    finally:
        await pool.stop()
        os.kill(worker.pid, signal.SIGCONT)
        worker.kill()
        worker.wait()


async def measure(timeouts_ms: list[int], runs: int, folder: str) -> dict:
    cases = {}
    for timeout_ms in timeouts_ms:
        for name, signum in SIGNALS.items():
            for transport in TRANSPORTS:
                ms = []
                for run in range(runs):
                    endpoint = (f"ipc://{folder}/w{timeout_ms}-{name}-{run}" if transport == "ipc"
                                else f"tcp://127.0.0.1:{free_port()}")
                    ms.append(round(await detect_once(endpoint, signum, timeout_ms,
                                                      Path(folder) / "standin.log"), 1))
                cases[f"{name} {transport} T={timeout_ms}"] = {
                    "signal": name, "transport": transport, "worker_timeout_ms": timeout_ms, "lost_after_ms": ms,
                    "min_ms": min(ms), "median_ms": statistics.median(ms), "max_ms": max(ms),
                    "max_over_bound": round(max(ms) / timeout_ms, 3)}
                print(f"{name} {transport} (T = {timeout_ms} ms): lost after {ms} ms", file=sys.stderr, flush=True)
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker-timeout-ms", default="1000,500", help="comma-separated values of T")
    parser.add_argument("--runs", type=int, help="runs per signal, transport and T (default 5, quick 2)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    timeouts = [int(t) for t in args.worker_timeout_ms.split(",")]
    runs = args.runs or (2 if args.quick else 5)
    with tempfile.TemporaryDirectory() as folder, timed_part():
        cases = asyncio.run(measure(timeouts, runs, folder))
    result = {"bench": "detection", "runs": runs, "worker_timeout_ms": timeouts, "cases": cases,
              "max_over_bound": max(c["max_over_bound"] for c in cases.values()),
              "bound": "lost within worker_timeout_ms (T), plus the event loop's latency",
              "setup": "a real WorkerPool in this process, a stand-in worker process (no compute), loopback"}
    # the stand-in computes nothing; the pool runs on this process's one event loop
    write_result("detection" + ("-quick" if args.quick else ""), result, quick=args.quick,
                 threads={"worker": None, "gateway_event_loop": 1})


if __name__ == "__main__":
    main()
