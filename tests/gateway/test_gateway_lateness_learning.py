"""Sent work that misses its deadline teaches the live gateway's learnt lateness.

A request the worker answers `expired` (its deadline passed before its batch started) or that the
worker does not answer within the grace after its deadline (worker_overdue) would have been answered
no earlier than its deadline: the batcher's lateness (the slack of its drops and of admission) counts
it as at least that late, as the simulator does. Real HTTP, real ZeroMQ, the stand-in worker."""

from __future__ import annotations

import threading

from loadgen.standin_worker import StandInWorker
from tests.gateway.conftest import endpoint, start_stack
from tests.gateway.metrics_page import sample, scrape

SCORE = "/v1/score"


def drops(text: str, reason: str) -> float | None:
    return sample(text, "boundserve_drops_total", reason=reason)


async def test_a_request_the_worker_answers_expired_teaches_lateness(request_tokenizer):
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, expire=True).start()
    stack = await start_stack(request_tokenizer, [worker])
    try:
        lateness = stack.gateway.batchers["score"].lateness
        assert lateness.value == 0.0
        status, body, _ = await stack.post(SCORE, {"samples": ["x"], "labels": ["yes"], "deadline_ms": 5_000})
        assert status == 504 and body["error"]["code"] == "deadline_exceeded", body
        assert lateness.value > 0.0, "the worker's expiry was not learnt as lateness"
        assert drops(await scrape(stack), "expired_in_worker") == 1.0
    finally:
        await stack.client.close()
        worker.stop()


async def test_a_request_given_up_as_overdue_teaches_lateness(request_tokenizer):
    held = threading.Event()  # never set: the worker holds every answer
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=held).start()
    stack = await start_stack(request_tokenizer, [worker], worker_timeout_ms=10)
    try:
        lateness = stack.gateway.batchers["score"].lateness
        # the lateness learnt is the deadline less the predicted finish less the loop's lag then: a deadline
        # far beyond any lag a loaded machine shows (a 200 ms one once failed in a loaded parallel run)
        status, body, _ = await stack.post(SCORE, {"samples": ["x"], "labels": ["yes"], "deadline_ms": 1_000})
        assert status == 504 and "did not answer" in body["error"]["message"], body
        assert lateness.value > 0.0, "the overdue answer was not learnt as lateness"
        assert drops(await scrape(stack), "worker_overdue") == 1.0
    finally:
        held.set()
        await stack.client.close()
        worker.stop()
