"""Wasted compute on /metrics: worker time spent on answers that were not delivered in time.

The stand-in worker reports `delay_ms` as each batch's compute; a request answered after its
deadline wastes its share (`late`), one whose answer comes after the gateway gave up on it wastes
it too (`dropped`), and one answered in time or dropped before compute wastes nothing.
"""

from __future__ import annotations

import asyncio

import pytest

from loadgen.standin_worker import StandInWorker
from tests.gateway.conftest import endpoint, start_stack
from tests.gateway.metrics_page import sample, scrape
from tests.gateway.waiting import until

SCORE = "/v1/score"
NO_PREDICTIONS = dict(admission=False, drop_predicted_late=False)  # a late request is still sent


def wasted(text: str, reason: str) -> float | None:
    return sample(text, "boundserve_wasted_compute_seconds_total", workload="score", reason=reason)


async def test_an_answer_after_its_deadline_wastes_its_compute_and_one_in_time_none(request_tokenizer):
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, delay_ms=100).start()
    stack = await start_stack(request_tokenizer, [worker], **NO_PREDICTIONS)
    try:
        assert (await stack.post(SCORE, {"samples": ["x"], "labels": ["yes"], "deadline_ms": 10_000}))[0] == 200
        text = await scrape(stack)
        assert sample(text, "boundserve_worker_compute_seconds_total", workload="score") == pytest.approx(0.1)
        assert wasted(text, "late") == 0.0 and wasted(text, "dropped") == 0.0
        # computed for 100 ms, due in 50 ms (answers are still taken until 1 s past it): 200, late
        assert (await stack.post(SCORE, {"samples": ["y"], "labels": ["yes"], "deadline_ms": 50}))[0] == 200
        text = await scrape(stack)
        assert sample(text, "boundserve_worker_compute_seconds_total", workload="score") == pytest.approx(0.2)
        assert wasted(text, "late") == pytest.approx(0.1) and wasted(text, "dropped") == 0.0
        predicted = sample(text, "boundserve_batch_predicted_seconds_total", workload="score")
        served = sample(text, "boundserve_batch_service_seconds_total", workload="score")
        assert predicted > 0 and served >= 0.2  # both batches: the service includes the 100 ms each
    finally:
        await stack.client.close()
        worker.stop()


async def test_compute_answered_after_the_gateway_gave_up_is_wasted_as_dropped(request_tokenizer):
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, delay_ms=300).start()
    stack = await start_stack(request_tokenizer, [worker], worker_timeout_ms=10, **NO_PREDICTIONS)
    try:
        # due in 50 ms, given up 10 ms later (504 worker_overdue); the worker answers at 300 ms
        status, body, _ = await stack.post(SCORE, {"samples": ["x", "y"], "labels": ["yes"], "deadline_ms": 50})
        assert status == 504 and "did not answer" in body["error"]["message"], body
        metrics = stack.gateway.metrics
        await until(lambda: metrics.value("boundserve_worker_compute_seconds_total", workload="score") > 0,
                    what="the late answer arriving")
        text = await scrape(stack)
        assert wasted(text, "dropped") == pytest.approx(0.3) and wasted(text, "late") == 0.0
    finally:
        await stack.client.close()
        worker.stop()


async def test_a_request_dropped_before_compute_wastes_nothing(request_tokenizer):
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, delay_ms=100).start()
    stack = await start_stack(request_tokenizer, [worker], max_inflight_batches_per_worker=1, **NO_PREDICTIONS)
    try:
        blocker = asyncio.create_task(stack.post(SCORE, {"samples": ["b"], "labels": ["yes"], "deadline_ms": 10_000}))
        await until(lambda: worker.requests, what="the worker computing the blocker")
        # queued behind the 100 ms batch with a 20 ms deadline: expires in the queue, never sent
        status, _, _ = await stack.post(SCORE, {"samples": ["t"], "labels": ["yes"], "deadline_ms": 20})
        assert status == 504 and (await blocker)[0] == 200
        text = await scrape(stack)
        assert sample(text, "boundserve_worker_compute_seconds_total", workload="score") == pytest.approx(0.1)
        assert wasted(text, "late") == 0.0 and wasted(text, "dropped") == 0.0
    finally:
        await stack.client.close()
        worker.stop()
