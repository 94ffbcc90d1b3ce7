"""Measure SIGKILL -> first answer after it, on `python -m gateway --spawn-workers` under open-loop load.

`python -m tests.chaos.measure_recovery [--config configs/demo.toml --artifacts artifacts/demo]
[--rate 50] [--kills 3] [--settle 10]`: after `settle` seconds of service, the first ready worker is
killed with SIGKILL, `kills` times; each line says when the gateway had a ready replacement again
(GET /readyz), when the first request sent after the kill was answered 200, and what the requests
sent in between got. A measurement tool, not a test (timings are never asserted).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import subprocess
import sys
import time

import aiohttp

from tests.chaos.openloop import OpenLoop
from tests.deploy.stack import free_port


async def ready_pids(session: aiohttp.ClientSession, url: str) -> list[int]:
    try:
        async with session.get(url + "/readyz") as response:
            body = await response.json(content_type=None)
    except aiohttp.ClientError:
        return []
    return [w["pid"] for w in body.get("workers", []) if w["state"] == "ready"]


async def until(condition, timeout_s: float, what: str) -> float:
    end = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > end:
            raise SystemExit(f"{what} did not happen within {timeout_s} s")
        await asyncio.sleep(0.02)
    return time.monotonic()


async def kill_once(session, url: str, load: OpenLoop) -> str:
    pids = sorted(await ready_pids(session, url))
    victim = pids[0]
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    back = await until(lambda: _replaced(session, url, victim, len(pids)), 120, "a replacement")
    await until(lambda: _answered_since(load, killed), 60, "an answer after the kill")
    first_ok = min(o.answered for o in load.outcomes if o.sent > killed and o.status == 200)
    between = collections.Counter(o.code or o.failure or "in flight" for o in load.outcomes if killed < o.sent <= back)
    return (f"SIGKILL pid {victim}: replacement ready after {back - killed:.2f} s, first 200 after "
            f"{first_ok - killed:.2f} s; requests sent meanwhile: {dict(between)}")


async def _replaced(session, url: str, victim: int, count: int) -> bool:
    pids = await ready_pids(session, url)
    return len(pids) == count and victim not in pids


async def _any_ready(session, url: str) -> bool:
    return bool(await ready_pids(session, url))


async def _answered_since(load: OpenLoop, t: float) -> bool:
    return load.answered_since(t) > 0


async def measure(args, url: str) -> None:
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        await until(lambda: _any_ready(session, url), 300, "a ready worker")
        print(f"first worker ready after {time.monotonic() - started:.1f} s", flush=True)
        load = OpenLoop(session, url, args.rate, args.deadline_ms)
        loader = asyncio.create_task(load.run())
        for _ in range(args.kills):
            await asyncio.sleep(args.settle)  # a worker that dies once in a while, not in a loop
            print(await kill_once(session, url, load), flush=True)
        load.sending = False
        await loader
        print("all outcomes:", dict(collections.Counter(o.code or o.failure for o in load.outcomes)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.toml")
    parser.add_argument("--artifacts", default="artifacts/demo")
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second, open loop")
    parser.add_argument("--deadline-ms", type=int, default=1000)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--settle", type=float, default=10.0, help="seconds of service before each kill")
    parser.add_argument("--log", default="measure_recovery.log", help="the gateway's and workers' log")
    args = parser.parse_args()
    port = free_port()
    with open(args.log, "w") as log:
        gateway = subprocess.Popen([sys.executable, "-m", "gateway", "--config", args.config, "--artifacts",
                                    args.artifacts, "--spawn-workers", "--port", str(port)], stdout=log, stderr=log)
    try:
        asyncio.run(measure(args, f"http://127.0.0.1:{port}"))
    finally:
        gateway.send_signal(signal.SIGTERM)
        print("gateway exit code", gateway.wait(60))


if __name__ == "__main__":
    main()
