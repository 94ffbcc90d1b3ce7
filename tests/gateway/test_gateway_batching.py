"""Batching through the real stack: packed up to the compiled bounds, in deadline order.

The stand-in worker holds its first batch until the test releases it, so what queues behind it is
known exactly before any batching decision is made.
"""

from __future__ import annotations

import asyncio
import threading

from tests.gateway.conftest import endpoint, start_stack
from loadgen.standin_worker import StandInWorker
from shared.latency_model import LatencyModel
from tests.gateway.waiting import until


async def test_queued_requests_are_packed_up_to_the_compiled_bound(request_tokenizer):
    gate = threading.Event()
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=gate).start()
    stack = await start_stack(request_tokenizer, [worker], max_inflight_batches_per_worker=1, max_batch_wait_ms=1.0)
    try:
        body = {"samples": [{"input_ids": [3, 4, 5]}] * 4, "label_token_ids": [1], "deadline_ms": 10_000}
        first = asyncio.create_task(stack.post("/v1/score", body))
        await until(lambda: worker.requests, what="the worker holding the first batch")
        rest = [asyncio.create_task(stack.post("/v1/score", body)) for _ in range(12)]
        await until(lambda: stack.gateway.batchers["score"].queued_jobs == 12, what="12 requests queued")
        gate.set()
        answers = await asyncio.gather(first, *rest)
        assert all(status == 200 for status, _, _ in answers)
        assert worker.batch_sizes == [4, 16, 16, 16]  # bound: 16 samples per batch, i.e. 4 requests of 4
    finally:
        await stack.client.close()
        worker.stop()


async def test_the_earliest_deadline_is_sent_first(request_tokenizer):
    gate = threading.Event()
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=gate).start()
    stack = await start_stack(request_tokenizer, [worker], max_inflight_batches_per_worker=1, max_batch_wait_ms=0.0)
    queued = stack.gateway.batchers["score"]
    try:
        def body(deadline_ms):  # 16 samples: one request fills a batch
            return {"samples": [{"input_ids": [1, 2]}] * 16, "label_token_ids": [1], "deadline_ms": deadline_ms}

        blocker = asyncio.create_task(stack.post("/v1/score", body(10_000), headers={"X-Request-Id": "blocker"}))
        await until(lambda: worker.requests, what="the worker holding the blocker")
        relaxed = asyncio.create_task(stack.post("/v1/score", body(10_000), headers={"X-Request-Id": "relaxed"}))
        await until(lambda: queued.queued_jobs == 1, what="the relaxed request queued")
        urgent = asyncio.create_task(stack.post("/v1/score", body(5_000), headers={"X-Request-Id": "urgent"}))
        await until(lambda: queued.queued_jobs == 2, what="the urgent request queued")
        gate.set()
        assert all(r[0] == 200 for r in await asyncio.gather(blocker, relaxed, urgent))
        order = [rid.split("~")[0] for rid in worker.seen_request_ids]
        assert order == ["blocker", "urgent", "relaxed"]
    finally:
        await stack.client.close()
        worker.stop()


async def test_a_loop_running_late_sends_the_next_batch_earlier_by_its_lag(request_tokenizer):
    """The timer that sends a held batch fires late by the event loop's lag, so the lead grows by the
    lag (Lateness.lead_ms): with the loop two minutes late, a worker predicted busy for one minute
    gets the next batch at once instead of being left to go idle."""
    gate = threading.Event()
    minute = LatencyModel(0.0, 0.0, 0.0, 60_000.0)  # every batch predicted to take a minute
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=gate, latency=minute).start()
    stack = await start_stack(request_tokenizer, [worker], max_inflight_batches_per_worker=2, max_batch_wait_ms=1.0,
                              admission=False)
    batcher = stack.gateway.batchers["score"]
    try:
        body = {"samples": [{"input_ids": [3, 4, 5]}] * 16, "label_token_ids": [1], "deadline_ms": 50_000}
        first = asyncio.create_task(stack.post("/v1/score", body))
        await until(lambda: worker.requests, what="the worker holding the first batch")
        second = asyncio.create_task(stack.post("/v1/score", body))
        await until(lambda: batcher.queued_jobs == 1, what="the second request queued behind a minute's work")
        batcher.lateness.lag.sample(asyncio.get_running_loop().time(), 120_000.0)
        batcher.wake()
        await until(lambda: len(worker.requests) == 2, what="the second batch sent while the first is held")
        assert batcher.queued_jobs == 0
        gate.set()
        assert [status for status, _, _ in await asyncio.gather(first, second)] == [200, 200]
    finally:
        await stack.client.close()
        worker.stop()
