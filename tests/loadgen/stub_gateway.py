"""A stand-in gateway speaking the real HTTP contract, for loadgen tests (in-process or as a process).

It serves requests one at a time (a single worker), each taking `service_ms`, so requests that
arrive faster queue; it answers 504 deadline_exceeded when a request's time in the stub would pass
its deadline, 429 queue_full when more than `max_queue` requests wait, exposes stage histograms on
/metrics (milliseconds, like gateway/metrics.py) and sends a Server-Timing header.

As a process: `python stub_gateway.py --config gateway.toml` reads [gateway] port, max_batch_wait_ms
(added to every service time) and score_deadline_ms (the default deadline).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tomllib

from aiohttp import web

BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


class Stub:
    """State of the stub: a lock as its single worker, counters and stage histograms."""

    def __init__(self, service_ms: float, deadline_ms: float = 1e9, max_queue: int = 10**9) -> None:
        self.service_ms = service_ms
        self.deadline_ms = deadline_ms
        self.max_queue = max_queue
        self.lock = asyncio.Lock()
        self.waiting = 0
        self.received: list[dict] = []
        self.stages = {"queue": [], "worker": [], "total": []}

    async def handle(self, request: web.Request) -> web.Response:
        loop = asyncio.get_running_loop()
        start = loop.time()
        body = await request.json()
        self.received.append(body)
        deadline_ms = body.get("deadline_ms", self.deadline_ms)
        if self.waiting >= self.max_queue:
            return _error(429, "queue_full")
        self.waiting += 1
        try:
            async with self.lock:
                queued_ms = (loop.time() - start) * 1000.0
                if queued_ms + self.service_ms > deadline_ms:
                    return _error(504, "deadline_exceeded")
                await asyncio.sleep(self.service_ms / 1000.0)
        finally:
            self.waiting -= 1
        total_ms = (loop.time() - start) * 1000.0
        for stage, ms in (("queue", queued_ms), ("worker", self.service_ms), ("total", total_ms)):
            self.stages[stage].append(ms)
        timing = f"queue;dur={queued_ms:.3f}, worker;dur={self.service_ms:.3f}"
        return web.json_response({"results": []}, headers={"Server-Timing": timing})

    async def metrics(self, request: web.Request) -> web.Response:
        lines = ["# TYPE boundserve_stage_latency_ms histogram"]
        for stage, values in self.stages.items():
            for bound in BUCKETS_MS:
                lines.append(f'boundserve_stage_latency_ms_bucket{{stage="{stage}",le="{bound}"}} '
                             f"{sum(1 for v in values if v <= bound)}")
            lines.append(f'boundserve_stage_latency_ms_bucket{{stage="{stage}",le="+Inf"}} {len(values)}')
            lines.append(f'boundserve_stage_latency_ms_sum{{stage="{stage}"}} {sum(values)}')
            lines.append(f'boundserve_stage_latency_ms_count{{stage="{stage}"}} {len(values)}')
        return web.Response(text="\n".join(lines) + "\n")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/score", self.handle)
        app.router.add_post("/v1/generate", self.handle)
        app.router.add_get("/metrics", self.metrics)
        return app


def _error(status: int, code: str) -> web.Response:
    return web.Response(status=status, text=json.dumps({"error": {"code": code, "message": code}}),
                        content_type="application/json")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--service-ms", type=float, default=2.0)
    args = parser.parse_args()
    with open(args.config, "rb") as handle:
        gateway = tomllib.load(handle)["gateway"]
    stub = Stub(args.service_ms + float(gateway.get("max_batch_wait_ms", 0.0)),
                float(gateway.get("score_deadline_ms", 1e9)))
    web.run_app(stub.app(), host=gateway["host"], port=gateway["port"], print=None)


if __name__ == "__main__":
    main()
