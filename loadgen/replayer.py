"""The open-loop replayer: every request leaves at its scheduled time, answered or not.

Latency is measured from the *scheduled* send time, so a server that makes requests queue (or a
client that falls behind) cannot hide that time (no coordinated omission). How late the sender
itself was is recorded per request (`lag_ms`) and summarised, so a saturated client shows up as
client lag instead of being mistaken for server latency.

With `replicas`, requests are spread round-robin over the URL and those; with `retry`, a refused or
timed-out try is sent once more to the next replica within what is left of its deadline
(loadgen/retry.py), and its latency still counts from its first scheduled send.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass

import aiohttp
import orjson

from loadgen.bodies import BodyFactory
from loadgen.http1 import Answer, Http1Pool
from loadgen.prometheus import fetch_metrics
from loadgen.result import ReplayRun, RequestResult
from loadgen.retry import TIMED_OUT, RetryOptions, is_retried, retry_after_s, retry_budget_ms
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
    replicas: tuple[str, ...] = ()
    """Further gateways of the same deployment: request i goes to (url, *replicas)[i % their count]."""
    retry: RetryOptions | None = None
    """Retry a refused or timed-out try once on the next replica (needs a replica and every request's
    deadline)."""


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


@dataclass(frozen=True)
class _Request:
    """One record's request, built before the run: its body, and the whole first try's bytes."""

    path: str
    body: bytes
    deadline_ms: float | None
    id_headers: tuple[tuple[str, str], ...]
    first_try: bytes


async def replay(trace: Trace, bodies: BodyFactory, options: ReplayOptions) -> ReplayRun:
    """Send every record of `trace` open-loop to `options.url` (and its replicas); return all results."""
    trace = prepare(trace, options)
    headers = {"Content-Type": "application/json", **dict(options.headers)}
    pools = [Http1Pool(url.rstrip("/"), headers.items()) for url in (options.url, *options.replicas)]
    requests = _requests(trace, bodies, options, pools)
    results = [RequestResult(i, r.route, r.t_ms, replica=i % len(pools)) for i, r in enumerate(trace.records)]
    timeout = aiohttp.ClientTimeout(total=options.timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:  # the /metrics scrapes
        before = await fetch_metrics(session, options.url) if options.scrape_metrics else None
        started_unix = time.time()
        sender = _Sender(pools, options, results, requests)
        try:
            await sender.run()
        finally:
            for pool in pools:
                pool.close()
        after = await fetch_metrics(session, options.url) if options.scrape_metrics else None
    window_s = trace.duration_ms() / 1000.0 if trace.records else 0.0
    return ReplayRun(results, window_s, started_unix, before, after, sender.max_in_flight)


def _requests(trace: Trace, bodies: BodyFactory, options: ReplayOptions, pools: list[Http1Pool]) -> list[_Request]:
    """Every record's request, its first try on replica i % len(pools); refuses retries that could
    not keep to a deadline (no second replica, or a request without one)."""
    prefix = options.id_prefix
    out = []
    for i, record in enumerate(trace.records):
        body = bodies.body(record, i)
        ids = () if prefix is None else (("X-Request-Id", f"{prefix}{i}"),)
        raw = orjson.dumps(body)
        out.append(_Request(PATHS[record.route], raw, body.get("deadline_ms"), ids,
                            pools[i % len(pools)].post(PATHS[record.route], raw, ids)))
    if options.retry is not None:
        if len(pools) < 2:
            raise ValueError("retries go to another replica: give ReplayOptions.replicas at least one more URL")
        missing = sum(r.deadline_ms is None for r in out)
        if missing:
            raise ValueError(f"retries keep to each request's deadline, and {missing} request(s) have none: give "
                             "the trace's records a deadline_ms or the body factory a default deadline")
    return out


class _Sender:
    """The send loop and the per-request tasks it starts."""

    def __init__(self, pools: list[Http1Pool], options: ReplayOptions, results: list[RequestResult],
                 requests: list[_Request]) -> None:
        self.pools = pools
        self.options = options
        self.results = results
        self.requests = requests
        """Per result: its body and its first try's whole HTTP request, built before the run (loadgen/http1.py)."""
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
        request = self.requests[result.index]
        try:
            answer = await self._try(result, request.first_try, self._first_try_timeout_s(result, request))
            if self.options.retry is not None and is_retried(result.status, result.outcome):
                await self._retry(result, request, answer)
        finally:
            self.in_flight -= 1
            self._tick(result)

    def _first_try_timeout_s(self, result: RequestResult, request: _Request) -> float:
        share = self.options.retry and self.options.retry.first_try_timeout_share
        if not share or request.deadline_ms is None:
            return self.options.timeout_s
        left_s = (result.scheduled_ms + share * request.deadline_ms - self._now_ms()) / 1000.0
        return max(0.0, min(self.options.timeout_s, left_s))

    async def _try(self, result: RequestResult, raw: bytes, timeout_s: float) -> Answer | None:
        """One try on result.replica: sets the result's status, outcome and done_ms; its Answer, or
        None when it timed out or the connection failed."""
        started = time.perf_counter()
        try:
            async with asyncio.timeout(timeout_s):
                answer = await self.pools[result.replica].exchange(raw)
        except asyncio.TimeoutError:
            result.done_ms, result.status, result.outcome = self._now_ms(), 0, TIMED_OUT
            return None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            result.done_ms, result.status = self._now_ms(), 0
            result.outcome = f"connection_error:{type(exc).__name__}"
            return None
        finally:
            result.try_ms = (time.perf_counter() - started) * 1000.0
        result.done_ms, result.status, result.outcome = self._now_ms(), answer.status, outcome_of(*answer[:2])
        return answer

    async def _retry(self, result: RequestResult, request: _Request, answer: Answer | None) -> None:
        """The second try on the next replica, after Retry-After, with what is left of the deadline;
        or why not (`not_retried`), the first answer standing."""
        assert self.options.retry is not None and request.deadline_ms is not None
        wait_s = retry_after_s(answer.headers) if answer is not None else 0.0
        left_ms = retry_budget_ms(request.deadline_ms, result.scheduled_ms, result.done_ms + 1000.0 * wait_s)
        if left_ms < self.options.retry.min_left_ms:
            result.not_retried = "retry_after_past_deadline" if wait_s > 0 else "no_time_left"
            return
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        left_ms = retry_budget_ms(request.deadline_ms, result.scheduled_ms, self._now_ms())
        if left_ms < self.options.retry.min_left_ms:  # the sleep (or the loop) overran what was left
            result.not_retried = "no_time_left"
            return
        result.first_outcome, result.first_done_ms = result.outcome, result.done_ms
        result.replica = (result.replica + 1) % len(self.pools)
        result.tries = 2
        budget = (("X-Deadline-Ms", str(left_ms)),)
        raw = self.pools[result.replica].post(request.path, request.body, request.id_headers + budget)
        await self._try(result, raw, self.options.timeout_s)

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
