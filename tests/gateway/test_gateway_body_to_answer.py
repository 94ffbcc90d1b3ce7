"""/metrics' boundserve_body_to_answer_seconds: each work request whose body was read lands once, under
the outcome it was answered with (served, refused by admission, expired, rejected); one answered
before its body was read is not in it. Counts only: how long each took is the machine's business."""

from __future__ import annotations

import asyncio
import threading

from gateway.metrics import ANSWER_OUTCOMES, BODY_TO_ANSWER_BUCKETS_S
from shared.latency_model import LatencyModel
from tests.gateway.conftest import endpoint, start_stack
from tests.gateway.metrics_page import families, sample, scrape
from loadgen.standin_worker import StandInWorker
from tests.gateway.waiting import until

SCORE = "/v1/score"
METRIC = "boundserve_body_to_answer_seconds"


def counts(text: str) -> dict[str, float | None]:
    return {outcome: sample(text, f"{METRIC}_count", outcome=outcome) for outcome in ANSWER_OUTCOMES}


async def test_a_refusal_a_served_request_and_a_rejection_each_land_under_their_outcome(request_tokenizer):
    slow = LatencyModel(0.0, 0.0, 0.0, 50.0)  # every batch takes 50 ms, and its profile says so
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, latency=slow, delay_ms=50).start()
    stack = await start_stack(request_tokenizer, [worker], max_body_bytes=4096)
    try:
        text = await scrape(stack)
        assert counts(text) == dict.fromkeys(ANSWER_OUTCOMES, 0.0)  # every outcome shows from the start
        histogram = families(text)[METRIC]
        assert histogram.type == "histogram"
        bounds = [float(s.labels["le"]) for s in histogram.samples
                  if s.name.endswith("_bucket") and s.labels["outcome"] == "ok"]
        assert bounds == [*BODY_TO_ANSWER_BUCKETS_S, float("inf")] and 0.00025 in bounds and 0.002 in bounds
        for _ in range(3):  # measured batches confirm the profile
            assert (await stack.post(SCORE, {"samples": ["x"], "labels": ["yes"], "deadline_ms": 5000}))[0] == 200
        status, body, _ = await stack.post(SCORE, {"samples": ["x"], "labels": ["yes"], "deadline_ms": 10})
        assert (status, body["error"]["code"]) == (503, "deadline_unmeetable")
        assert (await stack.post(SCORE, {"samples": [""], "labels": ["yes"]}))[0] == 400
        status, _, _ = await stack.post(SCORE, {"samples": ["x" * 5000], "labels": ["yes"]})
        assert status == 413  # over max_body_bytes: answered before its body was read
        text = await scrape(stack)
        assert counts(text) == {**dict.fromkeys(ANSWER_OUTCOMES, 0.0), "ok": 3.0, "deadline_unmeetable": 1.0,
                                "rejected": 1.0}
        assert sample(text, f"{METRIC}_bucket", outcome="deadline_unmeetable", le="+Inf") == 1.0
        assert sample(text, f"{METRIC}_sum", outcome="deadline_unmeetable") > 0.0
    finally:
        await stack.client.close()
        worker.stop()


async def test_a_full_queue_and_an_expiry_land_under_theirs(request_tokenizer):
    gate = threading.Event()
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=gate).start()
    stack = await start_stack(request_tokenizer, [worker], max_queue_tokens=10, max_inflight_batches_per_worker=1,
                              max_batch_wait_ms=0.0)
    try:
        body = {"samples": [{"input_ids": [1] * 8}], "label_token_ids": [1], "deadline_ms": 10_000}
        held = asyncio.create_task(stack.post(SCORE, body))  # the worker holds it
        await until(lambda: worker.requests, what="the worker holding the first request")
        expiring = asyncio.create_task(stack.post(SCORE, {**body, "deadline_ms": 80}))  # 8 of 10 tokens queued
        await until(lambda: stack.gateway.batchers["score"].queued_jobs == 1, what="the second request queued")
        assert (await stack.post(SCORE, body))[0] == 429
        assert (await expiring)[0] == 504  # its deadline passes in the queue behind the held batch
        gate.set()
        assert (await held)[0] == 200
        text = await scrape(stack)
        assert counts(text) == {**dict.fromkeys(ANSWER_OUTCOMES, 0.0), "ok": 1.0, "queue_full": 1.0,
                                "deadline_exceeded": 1.0}
    finally:
        await stack.client.close()
        worker.stop()
