"""The open-loop replayer: every request leaves at its scheduled time, answered or not.

Latency is measured from the *scheduled* send time, so a server that makes requests queue (or a
client that falls behind) cannot hide that time (no coordinated omission). How late the sender
itself was is recorded per request (`lag_ms`) and summarised, so a saturated client shows up as
client lag instead of being mistaken for server latency.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass

import aiohttp
import orjson

from loadgen.bodies import BodyFactory
from loadgen.http1 import Http1Pool
from loadgen.prometheus import fetch_metrics
from loadgen.result import ReplayRun, RequestResult
from loadgen.trace import PATHS, Trace

START_LEAD_S = 0.05
"""Head start between preparing the schedule and the first send, so t=0 is not already late."""


@dataclass(frozen=True)
class ReplayOptions:
    """How to replay: where, how fast, how long, and what to wait for."""

    url: str = "http://127.0.0.1:8000"
    speed: float = 1.0
    duration_s: float | None = None
    timeout_s: float = 30.0
    progress: bool = True
    scrape_metrics: bool = True
    headers: tuple[tuple[str, str], ...] = ()
    id_prefix: str | None = None
    """When set, request i carries `X-Request-Id: <id_prefix><i>` (the gateway logs it; its workers
    name it in their batch lines)."""


def run_replay(trace: Trace, bodies: BodyFactory, options: ReplayOptions) -> ReplayRun:
    """Blocking entry point: replay on uvloop when available (a faster client lags less)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(replay(trace, bodies, options))
    return uvloop.run(replay(trace, bodies, options))


def prepare(trace: Trace, options: ReplayOptions) -> Trace:
    """Apply speed and duration limit to a trace (send times from 0)."""
    scaled = trace.scaled(options.speed) if options.speed != 1.0 else trace
    if options.duration_s is not None:
        scaled = scaled.window(0.0, options.duration_s * 1000.0)
    return scaled


async def replay(trace: Trace, bodies: BodyFactory, options: ReplayOptions) -> ReplayRun:
    """Send every record of `trace` open-loop to `options.url`; return all results."""
    trace = prepare(trace, options)
    headers = {"Content-Type": "application/json", **dict(options.headers)}
    pool = Http1Pool(options.url.rstrip("/"), headers.items())
    prefix = options.id_prefix
    requests = [pool.post(PATHS[r.route], orjson.dumps(bodies.body(r, i)),
                          () if prefix is None else (("X-Request-Id", f"{prefix}{i}"),))
                for i, r in enumerate(trace.records)]
    results = [RequestResult(i, r.route, r.t_ms) for i, r in enumerate(trace.records)]
    timeout = aiohttp.ClientTimeout(total=options.timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:  # the /metrics scrapes
        before = await fetch_metrics(session, options.url) if options.scrape_metrics else None
        started_unix = time.time()
        sender = _Sender(pool, options, results, requests)
        try:
            await sender.run()
        finally:
            pool.close()
        after = await fetch_metrics(session, options.url) if options.scrape_metrics else None
    window_s = trace.duration_ms() / 1000.0 if trace.records else 0.0
    return ReplayRun(results, window_s, started_unix, before, after, sender.max_in_flight)


class _Sender:
    """The send loop and the per-request tasks it starts."""

    def __init__(self, pool: Http1Pool, options: ReplayOptions, results: list[RequestResult],
                 requests: list[bytes]) -> None:
        self.pool = pool
        self.options = options
        self.results = results
        self.requests = requests
        """Per result: its whole HTTP request, built before the run (loadgen/http1.py)."""
        self.in_flight = 0
        self.max_in_flight = 0
        self.counts: Counter[str] = Counter()
        self.bar = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.t0 = loop.time() + START_LEAD_S
        self.bar = _progress_bar(len(self.results)) if self.options.progress else None
        tasks = []
        try:
            for result in self.results:
                delay = self.t0 + result.scheduled_ms / 1000.0 - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(self._send(result)))
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            if self.bar is not None:
                self.bar.close()

    def _now_ms(self) -> float:
        return (asyncio.get_running_loop().time() - self.t0) * 1000.0

    async def _send(self, result: RequestResult) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        result.sent_ms = self._now_ms()
        try:
            async with asyncio.timeout(self.options.timeout_s):
                status, raw = await self.pool.exchange(self.requests[result.index])
            result.done_ms = self._now_ms()
            result.status = status
            result.outcome = outcome_of(status, raw)
        except asyncio.TimeoutError:
            result.done_ms, result.outcome = self._now_ms(), "client_timeout"
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            result.done_ms, result.outcome = self._now_ms(), f"connection_error:{type(exc).__name__}"
        finally:
            self.in_flight -= 1
            self._tick(result)

    def _tick(self, result: RequestResult) -> None:
        self.counts["ok" if result.outcome == "ok" else "rejected" if result.status else "error"] += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(dict(self.counts, in_flight=self.in_flight), refresh=False)


def outcome_of(status: int, raw: bytes) -> str:
    """"ok" for 2xx, else the gateway's error code, else http_<status>."""
    if 200 <= status < 300:
        return "ok"
    try:
        code = orjson.loads(raw)["error"]["code"]
        if isinstance(code, str) and code:
            return code
    except (orjson.JSONDecodeError, KeyError, TypeError):
        pass
    return f"http_{status}"



def _progress_bar(total: int):
    from tqdm import tqdm

    return tqdm(total=total, unit="req", desc="replay", mininterval=0.25, dynamic_ncols=True)
