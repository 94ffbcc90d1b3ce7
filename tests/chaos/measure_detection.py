"""Measure how long the gateway's pool takes to declare a worker lost: SIGKILL and SIGSTOP, ipc and tcp.

`python -m tests.chaos.measure_detection [--worker-timeout-ms 1000] [--runs 5]`: a stand-in worker
process (loadgen/standin_worker.py) serves a real WorkerPool; the time from the signal to the
link leaving `ready` is printed per run. A measurement tool, not a test (timings are never asserted).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time

from gateway.worker_link import READY
from gateway.worker_pool import WorkerPool
from tests.deploy.stack import free_port


async def _until(pool: WorkerPool, ready: bool) -> None:
    changed = asyncio.Event()
    pool.on_change(changed.set)
    while (pool.links[0].state == READY) != ready:
        changed.clear()
        await asyncio.wait_for(changed.wait(), 30)


async def detect_once(endpoint: str, signum: int, worker_timeout_ms: int) -> float:
    """Seconds from `signum` sent to the worker to the pool declaring it lost."""
    worker = subprocess.Popen([sys.executable, "-m", "loadgen.standin_worker", "--endpoint", endpoint])
    pool = WorkerPool((endpoint,), worker_timeout_ms, 2)
    await pool.start()
    try:
        await _until(pool, ready=True)
        sent = time.monotonic()
        os.kill(worker.pid, signum)
        await _until(pool, ready=False)
        return time.monotonic() - sent
    finally:
        await pool.stop()
        os.kill(worker.pid, signal.SIGCONT)
        worker.kill()
        worker.wait()


async def measure(worker_timeout_ms: int, runs: int, folder: str) -> None:
    for name, signum in (("SIGKILL", signal.SIGKILL), ("SIGSTOP", signal.SIGSTOP)):
        for transport in ("ipc", "tcp"):
            seconds = []
            for run in range(runs):
                endpoint = f"ipc://{folder}/w{run}" if transport == "ipc" else f"tcp://127.0.0.1:{free_port()}"
                seconds.append(await detect_once(endpoint, signum, worker_timeout_ms))
            print(f"{name} {transport} (worker_timeout_ms {worker_timeout_ms}): lost after "
                  + ", ".join(f"{s * 1000:.0f}" for s in seconds) + " ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker-timeout-ms", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        asyncio.run(measure(args.worker_timeout_ms, args.runs, folder))


if __name__ == "__main__":
    main()
