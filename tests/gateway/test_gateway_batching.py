"""Batching through the real stack: packed up to the compiled bounds, in deadline order."""

from __future__ import annotations

import asyncio

from tests.gateway.conftest import endpoint, start_stack
from tests.gateway.standin_worker import StandInWorker


async def test_queued_requests_are_packed_up_to_the_compiled_bound(request_tokenizer):
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, delay_ms=100).start()
    stack = await start_stack(request_tokenizer, [worker], max_inflight_batches_per_worker=1, max_batch_wait_ms=1.0)
    try:
        body = {"samples": [{"input_ids": [3, 4, 5]}] * 4, "label_token_ids": [1], "deadline_ms": 5000}
        answers = await asyncio.gather(*(stack.post("/v1/score", body) for _ in range(13)))
        assert all(status == 200 for status, _, _ in answers)
        assert sum(worker.batch_sizes) == 13 * 4
        assert max(worker.batch_sizes) == 16  # bound: 16 samples per batch, i.e. 4 requests of 4
    finally:
        await stack.client.close()
        worker.stop()


async def test_the_earliest_deadline_is_sent_first(request_tokenizer):
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, delay_ms=200).start()
    stack = await start_stack(request_tokenizer, [worker], max_inflight_batches_per_worker=1, max_batch_wait_ms=0.0)
    try:
        def body(deadline_ms):  # 16 samples: one request fills a batch
            return {"samples": [{"input_ids": [1, 2]}] * 16, "label_token_ids": [1], "deadline_ms": deadline_ms}

        blocker = asyncio.create_task(stack.post("/v1/score", body(5000), headers={"X-Request-Id": "blocker"}))
        await asyncio.sleep(0.05)
        relaxed = asyncio.create_task(stack.post("/v1/score", body(5000), headers={"X-Request-Id": "relaxed"}))
        await asyncio.sleep(0.02)
        urgent = asyncio.create_task(stack.post("/v1/score", body(1500), headers={"X-Request-Id": "urgent"}))
        assert all(r[0] == 200 for r in await asyncio.gather(blocker, relaxed, urgent))
        order = [rid.split("~")[0] for rid in worker.seen_request_ids]
        assert order == ["blocker", "urgent", "relaxed"]
    finally:
        await stack.client.close()
        worker.stop()
