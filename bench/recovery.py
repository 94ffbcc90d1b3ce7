"""How fast a killed worker is replaced: SIGKILL -> first answer after it, under open-loop load.

`python -m gateway --spawn-workers` (loadgen/stack.py, with a spare process waiting) serves the
compiled demo model while loadgen's open-loop replayer sends scoring requests at a fixed rate; every
`settle` seconds the first ready worker is killed with SIGKILL. Per kill: when the gateway had a
ready replacement again (GET /readyz), when the first request sent after the kill was answered 200,
and what the requests sent in between got. With one worker (configs/demo.toml) the first answer
after the kill is the replacement's.

    .venv/bin/python bench/recovery.py [--config configs/demo.toml] [--artifacts artifacts/demo]
                                       [--rate 50] [--kills 7] [--settle 10] [--quick]

Prints one JSON object as its last line and writes it to bench/results/recovery.json.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.harness.provenance import ROOT, timed_part, write_result
from loadgen.replayer import START_LEAD_S, ReplayOptions, replay
from loadgen.stack import LocalStack
from loadgen.synth import SynthSpec, synthesize
from loadgen.validate import stack_bodies
from shared.config import load_config

STEP_TIMEOUT_S = 120.0
RECOVERY_ALLOWANCE_S = 10.0
"""Load the trace carries per kill beyond `settle`, so it still runs after the last replacement."""


async def ready_pids(session: aiohttp.ClientSession, url: str) -> list[int]:
    try:
        async with session.get(url + "/readyz") as response:
            body = await response.json(content_type=None)
    except aiohttp.ClientError:
        return []
    return [w["pid"] for w in body.get("workers", []) if w["state"] == "ready"]


async def kill_once(session: aiohttp.ClientSession, url: str) -> dict:
    """SIGKILL to the first ready worker; (unix time of the kill, seconds until a replacement was ready)."""
    pids = sorted(await ready_pids(session, url))
    victim = pids[0]
    killed_unix, killed = time.time(), time.monotonic()
    os.kill(victim, signal.SIGKILL)
    while True:
        now = await ready_pids(session, url)
        if len(now) == len(pids) and victim not in now:
            return {"pid": victim, "killed_unix": killed_unix, "replacement_ready_s": time.monotonic() - killed}
        if time.monotonic() - killed > STEP_TIMEOUT_S:
            raise SystemExit(f"no replacement for worker {victim} within {STEP_TIMEOUT_S} s")
        await asyncio.sleep(0.02)


async def run(stack: LocalStack, artifacts: Path, args) -> tuple[list[dict], object]:
    """Open-loop load for the whole run, a kill every `settle` seconds; the kills and the replay."""
    seconds = args.settle * (args.kills + 1) + RECOVERY_ALLOWANCE_S * args.kills
    trace = synthesize(SynthSpec(arrivals="poisson", rate_rps=args.rate, duration_s=seconds, samples=2,
                                 tokens_per_sample=16, deadline_ms=args.deadline_ms, seed=1))
    options = ReplayOptions(url=stack.url, progress=False, timeout_s=args.deadline_ms / 1000 + 10)
    load = asyncio.create_task(replay(trace, stack_bodies(artifacts), options))
    kills = []
    async with aiohttp.ClientSession() as session:
        for _ in range(args.kills):
            await asyncio.sleep(args.settle)  # a worker that dies once in a while, not in a loop
            kills.append(await kill_once(session, stack.url))
            print(f"kill {len(kills)}: replacement ready after {kills[-1]['replacement_ready_s']:.2f} s",
                  file=sys.stderr, flush=True)
    return kills, await load


def per_kill(kill: dict, replay_run) -> dict:
    """The replay's view of one kill (its times are ms from the replay's t=0)."""
    t0_unix = replay_run.started_unix + START_LEAD_S
    at_ms = (kill["killed_unix"] - t0_unix) * 1000.0
    ready_ms = at_ms + kill["replacement_ready_s"] * 1000.0
    after = [r for r in replay_run.results if r.sent_ms > at_ms]
    first_ok = min((r.done_ms for r in after if r.outcome == "ok"), default=None)
    between = collections.Counter(r.outcome for r in after if r.sent_ms <= ready_ms)
    return {"replacement_ready_s": round(kill["replacement_ready_s"], 3),
            "first_200_after_kill_s": None if first_ok is None else round((first_ok - at_ms) / 1000.0, 3),
            "sent_until_replacement_ready": dict(between)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.toml")
    parser.add_argument("--artifacts", default="artifacts/demo", help="compiled for --config (make compile)")
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second, open loop")
    parser.add_argument("--deadline-ms", type=int, default=1000)
    parser.add_argument("--kills", type=int, help="SIGKILLs, one every --settle seconds (default 7, quick 2)")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds of service before each kill")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    args.kills = args.kills or (2 if args.quick else 7)
    artifacts = ROOT / args.artifacts
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as scratch:
        with LocalStack(ROOT / args.config, artifacts, scratch) as stack, timed_part():
            kills, replay_run = asyncio.run(run(stack, artifacts, args))
    rows = [per_kill(k, replay_run) for k in kills]
    firsts = [r["first_200_after_kill_s"] for r in rows if r["first_200_after_kill_s"] is not None]
    config = load_config(ROOT / args.config)
    result = {
        "bench": "recovery", "config": args.config, "rate_rps": args.rate, "deadline_ms": args.deadline_ms,
        "kills": rows, "settle_s": args.settle, "workers": len(config.worker.endpoints),
        "first_200_after_kill_s": {"min": min(firsts), "median": statistics.median(firsts), "max": max(firsts)}
        if firsts else None,
        "replacement_ready_s": {"min": min(r["replacement_ready_s"] for r in rows),
                                "max": max(r["replacement_ready_s"] for r in rows)},
        "outcomes": dict(collections.Counter(r.outcome for r in replay_run.results)),
        "setup": "python -m gateway --spawn-workers (a spare process waiting), loadgen's open-loop replayer, "
                 "one machine",
    }
    write_result("recovery" + ("-quick" if args.quick else ""), result, quick=args.quick,
                 threads={"worker": config.worker.cpu_threads, "gateway_event_loop": 1})


if __name__ == "__main__":
    main()
