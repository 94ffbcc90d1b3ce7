"""A batcher's loop never ends silently: whatever ends it, its queued requests and later ones get 503.

The stand-in worker holds the first batch, so a second request is known to be queued in the batcher
when its loop is ended.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from tests.gateway.conftest import endpoint, start_stack
from loadgen.standin_worker import StandInWorker
from tests.gateway.waiting import until

BODY = {"samples": [{"input_ids": [3, 4, 5]}] * 2, "label_token_ids": [1], "deadline_ms": 30_000}


async def _held_and_queued(stack, worker):
    first = asyncio.create_task(stack.post("/v1/score", BODY))
    await until(lambda: worker.requests, what="the worker holding the first batch")
    queued = asyncio.create_task(stack.post("/v1/score", BODY))
    await until(lambda: stack.gateway.batchers["score"].queued_jobs == 1, what="a request queued")
    return first, queued


async def test_a_cancelled_batcher_answers_its_queue_and_later_requests_503(request_tokenizer, caplog):
    gate = threading.Event()
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=gate).start()
    stack = await start_stack(request_tokenizer, [worker], max_inflight_batches_per_worker=1)
    try:
        first, queued = await _held_and_queued(stack, worker)
        task = next(t for t in stack.gateway.tasks if t.get_name() == "batcher score")
        with caplog.at_level(logging.INFO, logger="gateway.batcher"):
            task.cancel()
            status, answer, _ = await queued
        assert status == 503 and answer["error"]["code"] == "batcher_stopped"
        assert "cancelled" in answer["error"]["message"]
        assert any("score batcher stopped" in r.getMessage() for r in caplog.records)
        status, answer, _ = await stack.post("/v1/score", BODY)
        assert status == 503 and answer["error"]["code"] == "batcher_stopped"
        gate.set()
        assert (await first)[0] == 200  # what was already at the worker is still answered
    finally:
        gate.set()
        await stack.client.close()
        worker.stop()


async def test_a_batcher_failing_step_after_step_gives_up_and_says_why(request_tokenizer, caplog):
    gate = threading.Event()
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=gate).start()
    stack = await start_stack(request_tokenizer, [worker], max_inflight_batches_per_worker=1)
    batcher = stack.gateway.batchers["score"]
    try:
        def broken():
            raise ValueError("a bug in forming batches")

        first, queued = await _held_and_queued(stack, worker)
        batcher._step = broken
        with caplog.at_level(logging.ERROR, logger="gateway.batcher"):
            batcher.wake()
            status, answer, _ = await queued
        assert status == 503 and answer["error"]["code"] == "batcher_stopped"
        assert "steps in a row failed" in answer["error"]["message"]
        assert any("ValueError: a bug in forming batches" in (r.exc_text or "") for r in caplog.records)
        gate.set()
        await first
    finally:
        gate.set()
        await stack.client.close()
        worker.stop()
