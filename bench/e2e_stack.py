"""End-to-end measurement for bench/gpu_suite.py: real `python -m worker` + `python -m gateway`, open-loop HTTP load.

The deployment config is written as TOML from a DeploymentConfig, the two processes are started
with the same commands docker-compose.yml uses, and requests arrive at a fixed Poisson rate whatever
the latency (open loop), so queueing shows in the figures. Latency is measured per request from its
scheduled arrival time to the last byte of the answer; goodput counts the answers within the SLO
per second of the offered window (so it can never exceed the offered rate), and the client's own
lag behind the schedule is reported, so a saturated client shows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent


def to_toml(config) -> str:
    """A DeploymentConfig as TOML text that shared.config.load_config reads back unchanged."""
    lines = [f"name = {json.dumps(config.name)}"]
    for section, values in dataclasses.asdict(config).items():
        if not isinstance(values, dict):
            continue
        lines.append(f"\n[{section}]")
        for key, value in values.items():
            if value is None or isinstance(value, dict):
                continue  # optional tables (mlp_head) are not used by the benchmark
            lines.append(f"{key} = {json.dumps(list(value) if isinstance(value, tuple) else value)}")
    return "\n".join(lines) + "\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """One worker and one gateway serving `artifacts` with `config` (context manager)."""

    def __init__(self, config, artifacts: Path, device: str, folder: Path):
        self.port = free_port()
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        worker = dataclasses.replace(config.worker, endpoints=(endpoint,), devices=(device if device == "cpu" else "cuda:0",))
        gateway = dataclasses.replace(config.gateway, access_log=False, port=self.port)
        if device == "cpu":  # seconds-long CPU batches: a longer profile, no heartbeat-timeout during a batch
            worker = dataclasses.replace(worker, profile_budget_s=60.0, profile_repeats=1, warmup_runs=1)
            gateway = dataclasses.replace(gateway, worker_timeout_ms=120_000, max_deadline_ms=300_000)
        folder.mkdir(parents=True, exist_ok=True)
        self.config_path = folder / "e2e.toml"
        self.config_path.write_text(to_toml(config.replace(worker=worker, gateway=gateway)))
        self.artifacts, self.folder = artifacts, folder
        self.url = f"http://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen] = []

    def __enter__(self) -> "Stack":
        common = ["--config", str(self.config_path), "--artifacts", str(self.artifacts)]
        for name, argv in (("worker", ["-m", "worker", *common]), ("gateway", ["-m", "gateway", *common])):
            with open(self.folder / f"{name}.log", "wb") as log:
                self.processes.append(subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=log, stderr=log))
        return self

    def wait_ready(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if any(p.poll() is not None for p in self.processes):
                break
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.25)
        logs = "\n".join((self.folder / f"{n}.log").read_text(errors="replace")[-2000:] for n in ("worker", "gateway"))
        raise RuntimeError(f"the end-to-end stack never became ready:\n{logs}")

    def __exit__(self, *exc) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def poisson_arrivals(count: int, rate_per_s: float, seed: int) -> tuple[list[float], float]:
    """`count` Poisson arrivals at `rate_per_s`, conditioned to fall in a window of count / rate
    seconds (uniform order statistics): (send times in s, the window in s). The offered rate is
    then exactly count / window, so goodput over the same window can never exceed it."""
    window_s = count / rate_per_s
    rng = random.Random(seed)
    return sorted(rng.uniform(0.0, window_s) for _ in range(count)), window_s


async def open_loop(url: str, route: str, bodies: list[dict], rate_per_s: float, seed: int, slo_ms: float) -> dict:
    """Send bodies at Poisson arrivals of `rate_per_s`; latency from scheduled arrival to answer."""
    arrivals, window_s = poisson_arrivals(len(bodies), rate_per_s, seed)
    outcomes: list[tuple[int, str, float, float]] = []  # status, code, latency s, send lag s
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()

        async def one(body: dict, at: float) -> None:
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            lag = time.perf_counter() - start - at
            try:
                async with session.post(url + route, json=body, timeout=aiohttp.ClientTimeout(total=60)) as r:
                    answer = await r.json()
                code = "ok" if r.status == 200 else answer.get("error", {}).get("code", "?")
                outcomes.append((r.status, code, time.perf_counter() - start - at, lag))
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                outcomes.append((0, type(exc).__name__, time.perf_counter() - start - at, lag))

        await asyncio.gather(*(one(b, at) for b, at in zip(bodies, arrivals)))
    return summarise(outcomes, window_s, slo_ms) | {"seed": seed}


def summarise(outcomes: list[tuple[int, str, float, float]], window_s: float, slo_ms: float) -> dict:
    """Goodput = answers (200) within the SLO per second of the offered window; latency of all 200s."""
    ok = sorted(seconds * 1e3 for status, _, seconds, _ in outcomes if status == 200)
    good = sum(1 for ms in ok if ms <= slo_ms)
    lags = sorted(lag * 1e3 for *_, lag in outcomes)
    codes: dict[str, int] = {}
    for _, code, _, _ in outcomes:
        codes[code] = codes.get(code, 0) + 1
    pick = lambda values, q: values[min(len(values) - 1, int(q * len(values)))] if values else None  # noqa: E731
    return {
        "requests": len(outcomes), "window_s": window_s, "offered_per_s": len(outcomes) / window_s,
        "slo_ms": slo_ms, "answers": codes, "ok_within_slo": good, "ok_late": len(ok) - good,
        "goodput_per_s": good / window_s, "mean_ms": statistics.fmean(ok) if ok else None,
        "p50_ms": pick(ok, 0.5), "p99_ms": pick(ok, 0.99), "max_ms": ok[-1] if ok else None,
        "client_send_lag_p99_ms": pick(lags, 0.99),
    }


def run_load(url: str, route: str, bodies: list[dict], rate_per_s: float, seed: int, slo_ms: float) -> dict:
    return asyncio.run(open_loop(url, route, bodies, rate_per_s, seed, slo_ms))
