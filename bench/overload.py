"""Overload: goodput at 2x capacity with deadline-aware admission versus first-come-first-served.

With the tiny demo model compiled for this CPU (configs/test.toml bounds) behind the real gateway
and one real worker: (1) measure capacity (requests/s, closed loop, no deadlines); (2) offer
open-loop Poisson load at 2x that for `--seconds` with an SLO deadline (both on a fresh stack each,
capacity re-measured just before, as this machine's speed drifts), twice: admission on
(requests carry deadline_ms = SLO: refused early, dropped when late) and admission off (the same
stack, everything admitted, nothing dropped: FIFO, like SGLang and vLLM). Goodput = answers within
the SLO per second, measured by the client from each request's scheduled send time.

    python bench/overload.py [--quick] [--artifacts DIR] [--seconds 30] [--slo-ms MS]

Prints one JSON object as its last line and writes it to bench/results/overload.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gateway_overhead import Client, free_port, post, sequential, wait_ready  # noqa: E402
from provenance import write_result  # noqa: E402

WORDS = "red blue shoe phone case cheap premium coffee tea book laptop hotel city beach best top".split()
MAX_CONNECTIONS = 400


def artifacts_folder(given: str | None) -> Path:
    """The compiled demo model (built here once when missing; the build skips when up to date)."""
    if given:
        return Path(given)
    model, out = ROOT / "models" / "demo", ROOT / "artifacts" / "overload-test"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if not (model / "config.json").exists():
        subprocess.run([sys.executable, "-m", "compile.demo", "--out", str(model)], cwd=ROOT, env=env, check=True)
    subprocess.run([sys.executable, "-m", "compile", "--model", str(model), "--config", "configs/test.toml",
                    "--out", str(out)], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return out


SAMPLES_PER_REQUEST = 4  # ~20-30 tokens each: two requests fill one compiled batch (8 samples, 256 tokens)


def bodies(count: int = 64) -> list[dict]:
    rng = random.Random(0)
    return [{"samples": [" ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 25)))
                         for _ in range(SAMPLES_PER_REQUEST)], "labels": ["yes", "no"]} for _ in range(count)]


def start_gateway(folder: Path, artifacts: Path, port: int, admission: bool) -> subprocess.Popen:
    config = (ROOT / "configs/test.toml").read_text().replace(
        'endpoints = ["ipc:///tmp/boundserve-test-worker-0"]', f'endpoints = ["ipc://{folder}/w-{port}"]')
    config += (f"\n[gateway]\nport = {port}\naccess_log = false\nadmission = {str(admission).lower()}\n"
               "score_deadline_ms = 60000\nmax_queue_tokens = 100000000\n")
    path = folder / f"gateway-{port}.toml"
    path.write_text(config)
    return subprocess.Popen([sys.executable, "-m", "gateway", "--config", str(path), "--artifacts", str(artifacts),
                             "--spawn-workers"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL)


async def capacity(port: int, requests: list[bytes], seconds: float, concurrency: int = 64) -> float:
    end = time.perf_counter() + seconds
    done = 0

    async def loop(offset: int) -> None:
        nonlocal done
        client = await Client.connect(port)
        i = offset
        while time.perf_counter() < end:
            status, body = await client.call(requests[i % len(requests)])
            assert status == 200, body[:200]
            done, i = done + 1, i + 1
        client.writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(loop(k) for k in range(concurrency)))
    return done / (time.perf_counter() - start)


async def open_loop(port: int, requests: list[bytes], rate: float, seconds: float, slo_ms: float) -> dict:
    """Poisson arrivals at `rate`; latency counts from each request's scheduled time."""
    rng = random.Random(1)
    idle: list[Client] = []
    slots = asyncio.Semaphore(MAX_CONNECTIONS)
    outcomes: list[tuple[int, float]] = []

    async def one(request: bytes, scheduled: float) -> None:
        async with slots:
            client = idle.pop() if idle else await Client.connect(port)
            status, _ = await client.call(request)
            outcomes.append((status, (time.perf_counter() - scheduled) * 1000))
            idle.append(client)

    tasks, start = [], time.perf_counter()
    scheduled, i = start, 0
    while scheduled < start + seconds:
        scheduled += rng.expovariate(rate)
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(requests[i % len(requests)], scheduled)))
        i += 1
    await asyncio.gather(*tasks)
    for client in idle:
        client.writer.close()
    good = sum(1 for status, ms in outcomes if status == 200 and ms <= slo_ms)
    answered_ms = sorted(ms for status, ms in outcomes if status == 200) or [0.0]
    refused_ms = sorted(ms for status, ms in outcomes if status != 200) or [0.0]
    by_status: dict[str, int] = {}
    for status, _ in outcomes:
        by_status[str(status)] = by_status.get(str(status), 0) + 1
    return {"offered": len(outcomes), "good": good, "goodput_rps": round(good / seconds, 1), "statuses": by_status,
            "ok_p50_ms": round(answered_ms[len(answered_ms) // 2], 2),
            "ok_p99_ms": round(answered_ms[int(len(answered_ms) * 0.99)], 2),
            "refused_p50_ms": round(refused_ms[len(refused_ms) // 2], 2)}


async def run_phase(folder: Path, artifacts: Path, admission: bool, args) -> dict:
    """A fresh stack: warm up, measure capacity (closed loop), then 2x that, open loop, with the SLO."""
    port = free_port()
    gateway = start_gateway(folder, artifacts, port, admission)
    try:
        await wait_ready(port, timeout_s=180)
        relaxed = [post("/v1/score", {**b, "deadline_ms": 60000}) for b in bodies()]
        await sequential(port, relaxed[:50])  # warm-up
        unloaded = sorted(await sequential(port, relaxed * 2))
        cap = await capacity(port, relaxed, 3.0 if args.quick else 10.0)
        deadline = int(args.slo_ms) if admission else 60000  # FIFO: nothing refused, nothing dropped
        requests = [post("/v1/score", {**b, "deadline_ms": deadline}) for b in bodies()]
        result = await open_loop(port, requests, 2 * cap, args.seconds, args.slo_ms)
        return {"capacity_rps": round(cap, 1), "unloaded_p50_ms": round(unloaded[len(unloaded) // 2], 3), **result}
    finally:
        gateway.terminate()
        gateway.wait(timeout=60)


async def measure(args) -> dict:
    artifacts = artifacts_folder(args.artifacts)
    with tempfile.TemporaryDirectory(prefix="bench-overload-") as scratch:
        folder = Path(scratch)
        with_admission = await run_phase(folder, artifacts, True, args)
        fifo = await run_phase(folder, artifacts, False, args)
    cap = (with_admission["capacity_rps"] + fifo["capacity_rps"]) / 2
    return {
        "bench": "overload", "capacity_rps": round(cap, 1), "slo_ms": args.slo_ms, "seconds": args.seconds,
        "goodput_admission_rps": with_admission["goodput_rps"], "goodput_fifo_rps": fifo["goodput_rps"],
        "goodput_admission_over_capacity": round(with_admission["goodput_rps"] / with_admission["capacity_rps"], 3),
        "goodput_fifo_over_capacity": round(fifo["goodput_rps"] / fifo["capacity_rps"], 3),
        "admission": with_admission, "fifo": fifo, "samples_per_request": SAMPLES_PER_REQUEST,
        "model": "tiny demo (configs/test.toml), 1 CPU worker", "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0],
        "note": "each phase offers 2x the capacity measured just before it, on a fresh stack",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 s phases instead of 30 s")
    parser.add_argument("--artifacts", help="compiled artifacts (default: build the demo model with configs/test.toml)")
    parser.add_argument("--seconds", type=float, help="length of each overload phase (default 30, quick 8)")
    parser.add_argument("--slo-ms", type=float, default=100.0, help="the SLO deadline in ms (default 100)")
    args = parser.parse_args()
    args.seconds = args.seconds or (8.0 if args.quick else 30.0)
    result = asyncio.run(measure(args))
    write_result("overload" + ("-quick" if args.quick else ""), result, quick=args.quick)


if __name__ == "__main__":
    main()
