"""Time to refusal, in-process: one gateway, one event loop, a stand-in worker, refusals in a loop.

The gateway (gateway/app.py's app, on a real TCP port) and a keep-alive HTTP client share this process's
uvloop; the stand-in worker (loadgen/standin_worker.py, the real protocol, in a thread) reports a profile of
50 ms per batch and takes that long, so after three served requests that confirm it, a request with a
10 ms deadline is refused by admission (503 deadline_unmeetable) before any work. Each refusal is sent
after the previous answer came back, so the gateway serves one at a time and nothing else waits for the
loop. The figure is the gateway's own (issue 53's definition): the time from the body read to the answer
written, each refusal's exact time as the gateway hands it to `boundserve_body_to_answer_seconds`, and
that histogram's increase over the loop (p50 / p99 interpolated in its buckets, as histogram_quantile
does: what bench/overload.py reports). Beside it: the client's send to answer; the CPU time the loop's
thread spent per refusal (gateway and client together), which tells code from a wait for a CPU on a
busy machine; the garbage collector's pauses during the loop, by generation, and what one full
collection costs with the startup heap frozen (as gateway/__main__.py serves) and without. The
tokenizer is trained in a child process, so that, as in a gateway's own process, no torch objects are
in the heap.
With --profile, cProfile's cumulative shares of the refusal loop's time by function go beside it.

    python bench/refusal_time.py [--quick] [--requests 5000] [--profile]

Prints one JSON object as its last line and writes bench/results/refusal_time.json.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import gc
import io
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import uvloop
from aiohttp import web

from bench.gateway_overhead import Client, post
from bench.harness.provenance import ROOT, timed_part, write_result
from gateway.app import GATEWAY, make_app
from gateway.metrics import Metrics
from gateway.tokenizer import RequestTokenizer
from gateway.wiring import Settings
from loadgen.processes import free_port
from loadgen.prometheus import bucket_quantile, parse
from loadgen.standin_worker import StandInWorker, standin_manifest
from loadgen.stats import percentile
from shared.config import DeploymentConfig, GatewayConfig, WorkerConfig
from shared.latency_model import LatencyModel

METRIC = "boundserve_body_to_answer_seconds"
OUTCOME = "deadline_unmeetable"
SLOW = LatencyModel(0.0, 0.0, 0.0, 50.0)  # every batch 50 ms, and the profile says so
SERVED = {"samples": ["red running shoe"], "labels": ["yes"], "deadline_ms": 5000}
REFUSED = {"samples": ["red running shoe"], "labels": ["yes"], "deadline_ms": 10}
GET_METRICS = b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n"


def histogram(page: str) -> dict[str, float | dict[float, float]]:
    """The refusals' body-to-answer histogram of one /metrics page: cumulative buckets, sum and count."""
    out: dict = {"buckets": {}, "sum": 0.0, "count": 0.0}
    for name, labels, value in parse(page):
        if labels.get("outcome") != OUTCOME:
            continue
        if name == f"{METRIC}_bucket":
            out["buckets"][float(labels["le"])] = value
        elif name in (f"{METRIC}_sum", f"{METRIC}_count"):
            out[name.rsplit("_", 1)[1]] = value
    return out


def figures(before: dict, after: dict) -> dict[str, float | int | None]:
    """Count, mean, p50 and p99 (ms) of the refusals between two pages."""
    buckets = {b: n - before["buckets"].get(b, 0.0) for b, n in after["buckets"].items()}
    count = after["count"] - before["count"]
    ms = lambda s: None if s is None else round(1000.0 * s, 4)  # noqa: E731
    return {"count": int(count), "mean_ms": ms((after["sum"] - before["sum"]) / count) if count else None,
            "p50_ms": ms(bucket_quantile(0.50, buckets)), "p99_ms": ms(bucket_quantile(0.99, buckets)),
            "share_within_2ms": round(buckets.get(0.002, 0.0) / count, 4) if count else None}


def settings(folder: Path, worker: StandInWorker, port: int) -> Settings:
    config = DeploymentConfig(
        worker=WorkerConfig(endpoints=(worker.endpoint,), devices=("cpu",), heartbeat_interval_ms=50),
        gateway=dataclasses.replace(GatewayConfig(), port=port, access_log=False))
    tokenizer = RequestTokenizer.from_artifacts(folder)
    return Settings(config, standin_manifest(tokenizer.vocab_size), tokenizer, None)


async def measure(args: argparse.Namespace, folder: Path) -> dict:
    port = free_port()
    tokenizer_vocab = RequestTokenizer.from_artifacts(folder).vocab_size
    worker = StandInWorker(f"ipc://{folder}/worker", vocab_size=tokenizer_vocab, latency=SLOW, delay_ms=50).start()
    app = make_app(settings(folder, worker, port))
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)  # as gateway/__main__.py serves
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    gc.freeze()  # as gateway/__main__.py does once started
    try:
        return await refusals(args, port, _recorded(app[GATEWAY].metrics))
    finally:
        await runner.cleanup()
        worker.stop()


def _recorded(metrics: Metrics) -> list[float]:
    """Every body-to-answer time the gateway observes, in seconds, as it hands it to its histogram (the
    same values; exact, where the histogram's quantiles are interpolated in its buckets)."""
    seen: list[float] = []
    observe = metrics.observe_body_to_answer

    def record(code: str, status: int, seconds: float) -> None:
        seen.append(seconds)
        observe(code, status, seconds)

    metrics.observe_body_to_answer = record  # type: ignore[method-assign]
    return seen


def _gc_pauses() -> tuple[dict[int, list[float]], Callable[[str, dict], None]]:
    """({generation: the seconds of each of its collections}, the gc callback that times them)."""
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    started = [0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append(time.perf_counter() - started[0])
    return pauses, callback


async def refusals(args: argparse.Namespace, port: int, seen: list[float]) -> dict:
    """Three served requests (the profile confirmed), a warm-up, then the measured refusals."""
    client = await _ready_client(port)
    for _ in range(3):  # measured batches confirm the profile
        status, body = await client.call(post("/v1/score", SERVED))
        assert status == 200, body[:300]
    refused = post("/v1/score", REFUSED)
    for _ in range(200):  # warm-up
        await client.call(refused)
    measured = _Refusals()
    profiler = cProfile.Profile() if args.profile else None
    with timed_part():
        await measured.run(client, refused, args.requests, seen, profiler)
    client.writer.close()
    found = measured.figures()
    found["full_collection_ms"] = _full_collections()
    return {
        "bench": "refusal_time", "requests": args.requests,
        "time_to_refusal_ms_p99": found["time_to_refusal_ms"]["p99"],
        "time_to_refusal_ms_p50": found["time_to_refusal_ms"]["p50"],
        **found,
        "profile": _profile_lines(profiler) if profiler else None,
        "parity": [{"check": "every answer a 503 deadline_unmeetable", "ok": measured.statuses == {(503, True)}},
                   {"check": "the gateway's histogram counted every refusal",
                    "ok": found["from_metrics"]["count"] == found["time_to_refusal_ms"]["count"] == args.requests}],
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


class _Refusals:
    """The measured refusals: the gateway's times, the client's, the loop thread's CPU,
    the garbage collector's pauses, and the gateway's histogram's increase."""

    def __init__(self) -> None:
        self.gateway_ms: list[float] = []
        self.client_ms: list[float] = []
        self.cpu_ms: list[float] = []
        self.pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self.statuses: set[tuple[int, bool]] = set()
        self.histogram: dict | None = None

    async def run(self, client: Client, refused: bytes, count: int, seen: list[float],
                  profiler: cProfile.Profile | None) -> None:
        before = histogram((await client.call(GET_METRICS))[1].decode())
        seen.clear()
        pauses, callback = _gc_pauses()
        gc.callbacks.append(callback)
        if profiler:
            profiler.enable()
        for _ in range(count):
            start, cpu_start = time.perf_counter(), time.thread_time()
            status, body = await client.call(refused)
            self.client_ms.append(1000.0 * (time.perf_counter() - start))
            self.cpu_ms.append(1000.0 * (time.thread_time() - cpu_start))
            self.statuses.add((status, b'"deadline_unmeetable"' in body))
        if profiler:
            profiler.disable()
        gc.callbacks.remove(callback)
        self.gateway_ms += [1000.0 * s for s in seen]
        for generation, times in pauses.items():
            self.pauses[generation] += times
        after = histogram((await client.call(GET_METRICS))[1].decode())
        increase = {"buckets": {b: n - before["buckets"].get(b, 0.0) for b, n in after["buckets"].items()},
                    "sum": after["sum"] - before["sum"], "count": after["count"] - before["count"]}
        self.histogram = increase if self.histogram is None else {
            "buckets": {b: n + self.histogram["buckets"][b] for b, n in increase["buckets"].items()},
            "sum": increase["sum"] + self.histogram["sum"], "count": increase["count"] + self.histogram["count"]}

    def figures(self) -> dict:
        ms = self.gateway_ms
        return {
            "time_to_refusal_ms": {"p50": _r(percentile(ms, 50.0)), "p99": _r(percentile(ms, 99.0)),
                                   "p999": _r(percentile(ms, 99.9)), "max": _r(max(ms)),
                                   "mean": _r(sum(ms) / len(ms)), "count": len(ms),
                                   "what": "gateway side, body read to answer written, each refusal's exact time"},
            "from_metrics": figures({"buckets": {}, "sum": 0.0, "count": 0.0}, self.histogram),
            "client_send_to_answer_ms": {"p50": _r(percentile(self.client_ms, 50.0)),
                                         "p99": _r(percentile(self.client_ms, 99.0))},
            "loop_thread_cpu_ms": {"p50": _r(percentile(self.cpu_ms, 50.0)), "p99": _r(percentile(self.cpu_ms, 99.0))},
            "gc_pauses": {f"gen{g}": {"count": len(t), "total_ms": _r(1000.0 * sum(t)),
                                      "max_ms": _r(1000.0 * max(t, default=0.0))} for g, t in self.pauses.items()},
        }


def _full_collections(times: int = 3) -> dict[str, list[float]]:
    """Milliseconds a full collection (gc.collect()) stalls this process, the startup heap frozen out of
    the collector's view (as the gateway serves) and not, alternated; the freeze is left as it was."""
    out: dict[str, list[float]] = {"frozen": [], "unfrozen": []}
    for _ in range(times):
        for name in ("unfrozen", "frozen"):
            gc.freeze() if name == "frozen" else gc.unfreeze()
            start = time.perf_counter()
            gc.collect()
            out[name].append(round(1000.0 * (time.perf_counter() - start), 3))
    return out


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


async def _ready_client(port: int) -> Client:
    """A connected client once the stand-in worker is ready (the gateway's /readyz answers 200)."""
    for _ in range(500):
        client = await Client.connect(port)
        status, _ = await client.call(b"GET /readyz HTTP/1.1\r\nHost: bench\r\n\r\n")
        if status == 200:
            return client
        client.writer.close()
        await asyncio.sleep(0.01)
    raise RuntimeError("the stand-in worker never became ready")


def _profile_lines(profiler: cProfile.Profile, top: int = 40) -> list[str]:
    """cProfile's heaviest functions by cumulative time (profiling slows each call: shares, not times)."""
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(top)
    return [line for line in text.getvalue().splitlines() if line.strip()]


def _train_tokenizer(path: Path) -> None:
    """The demo model's tokenizer, trained in a child process: the build chain imports torch, whose objects
    would stay in this process's heap and lengthen every garbage collection far past a gateway's."""
    code = f"from compile.demo import train_tokenizer; train_tokenizer().save({str(path)!r})"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--quick", action="store_true", help="600 refusals")
    parser.add_argument("--profile", action="store_true", help="cProfile the refusal loop (printed, not written)")
    args = parser.parse_args()
    if args.quick:
        args.requests = 600
    with tempfile.TemporaryDirectory(prefix="bench-refusal-") as scratch:
        _train_tokenizer(Path(scratch) / "tokenizer.json")
        result = uvloop.run(measure(args, Path(scratch)))
    if args.profile:  # a profiled run is slower throughout: its times are not the figure
        print("\n".join(result.pop("profile")))
        return
    result.pop("profile")
    write_result("refusal_time" + ("-quick" if args.quick else ""), result, args.quick, None)


if __name__ == "__main__":
    main()
