"""One test per rejection reason: status, error code, a message that says what to fix, and the id."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from shared.latency_model import LatencyModel
from tests.gateway.conftest import endpoint, start_stack
from loadgen.standin_worker import StandInWorker
from tests.gateway.waiting import until


def assert_error(status, body, want_status, want_code, *words):
    assert status == want_status, body
    assert body["error"]["code"] == want_code, body
    for word in words:
        assert word in body["error"]["message"], body
    assert body["error"]["request_id"]


@pytest.mark.parametrize("body, words", [
    ({"samples": "red shoe"}, ["samples", "non-empty list"]),
    ({"samples": ["x"], "labels": ["yes"], "top_k": 3}, ["top_k", "topk"]),
    ({"samples": ["x"], "labels": ["yes"], "colour": 1}, ["colour", "known fields"]),
    ({"samples": [{"input_ids": [1, -4]}], "label_token_ids": [1]}, ["samples[0].input_ids[1]", "-4"]),
    ({"samples": ["x"], "labels": ["yes"], "label_token_ids": [1]}, ["exactly one of"]),
    ({"samples": ["x"], "labels": ["yes"], "deadline_ms": 0}, ["deadline_ms", "between 1"]),
    ({"samples": ["x"], "labels": ["yes"], "output": "vibes"}, ["output", "probs"]),
    ({"items": ["a"], "query": [1], "label_token_ids": [1]}, ["items[0]", "token ids"]),
])
async def test_invalid_fields_get_400_naming_the_field(stack, body, words):
    assert_error(*(await stack.post("/v1/score", body))[:2], 400, "invalid_request", *words)


async def test_a_label_of_several_tokens_gets_400_saying_which(stack):
    status, body, _ = await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes", "premium shipping review"]})
    assert_error(status, body, 400, "invalid_request", "labels[1]", "premium shipping review", "exactly one token")


async def test_bad_json_and_bad_deadline_header_get_400(stack):
    response = await stack.client.post("/v1/score", data=b"{not json")
    assert_error(response.status, await response.json(), 400, "invalid_request", "not valid JSON")
    status, body, _ = await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"]},
                                       headers={"X-Deadline-Ms": "soon"})
    assert_error(status, body, 400, "invalid_request", "X-Deadline-Ms")


async def test_unknown_route_and_method(stack):
    response = await stack.client.get("/v1/nothing")
    assert_error(response.status, await response.json(), 404, "not_found", "openapi")
    response = await stack.client.get("/v1/score")
    assert_error(response.status, await response.json(), 405, "method_not_allowed")


async def test_missing_or_wrong_bearer_token_gets_401(request_tokenizer):
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size).start()
    stack = await start_stack(request_tokenizer, [worker], auth_token="s3cret")
    try:
        status, body, _ = await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"]})
        assert_error(status, body, 401, "unauthorized", "Authorization: Bearer")
        status, body, _ = await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"]},
                                           headers={"Authorization": "Bearer nope"})
        assert_error(status, body, 401, "unauthorized", "not valid")
        status, body, _ = await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"]},
                                           headers={"Authorization": "Bearer s3cret"})
        assert status == 200, body
        assert (await stack.client.get("/healthz")).status == 200
    finally:
        await stack.client.close()
        worker.stop()


@pytest.mark.parametrize("path, body, words", [
    ("/v1/score", {"samples": ["x"] * 65, "labels": ["yes"]}, ["65 samples", "64"]),
    ("/v1/score", {"samples": [{"input_ids": [1] * 513}], "label_token_ids": [1]}, ["513 tokens", "512"]),
    ("/v1/score", {"samples": ["x"], "output": "topk", "top_k": 21}, ["top_k = 21", "20"]),
    ("/v1/generate", {"prompt": "x", "beam_width": 129}, ["beam_width = 129", "128"]),
    ("/v1/generate", {"prompt": "x", "max_new_tokens": 5}, ["max_new_tokens = 5", "4"]),
])
async def test_over_the_compiled_bounds_gets_413(stack, path, body, words):
    assert_error(*(await stack.post(path, body))[:2], 413, "too_large", *words)


async def test_over_the_body_size_limit_gets_413(stack):
    blob = "x" * (5 << 20)
    status, body, _ = await stack.post("/v1/score", {"samples": [blob]})
    assert_error(status, body, 413, "too_large", "bytes")


async def test_full_queue_gets_429_with_retry_after(request_tokenizer):
    gate = threading.Event()
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=gate).start()
    stack = await start_stack(request_tokenizer, [worker], max_queue_tokens=10, max_inflight_batches_per_worker=1,
                              max_batch_wait_ms=0.0)
    try:
        body = {"samples": [{"input_ids": [1] * 8}], "label_token_ids": [1], "deadline_ms": 10_000}
        first = asyncio.create_task(stack.post("/v1/score", body))  # the worker holds it
        await until(lambda: worker.requests, what="the worker holding the first request")
        second = asyncio.create_task(stack.post("/v1/score", body))  # waits in the queue: 8 of 10 tokens
        await until(lambda: stack.gateway.batchers["score"].queued_jobs == 1, what="the second request queued")
        status, answer, headers = await stack.post("/v1/score", body)
        assert_error(status, answer, 429, "queue_full", "budget of 10")
        assert int(headers["Retry-After"]) >= 1
        gate.set()
        assert (await first)[0] == 200 and (await second)[0] == 200
    finally:
        await stack.client.close()
        worker.stop()


async def test_an_unmeetable_deadline_gets_503_before_any_work(request_tokenizer):
    slow = LatencyModel(0.0, 0.0, 0.0, 50.0)  # every batch takes 50 ms, and its profile says so
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, latency=slow, delay_ms=50).start()
    stack = await start_stack(request_tokenizer, [worker])
    try:
        for _ in range(3):  # measured batches confirm the profile
            assert (await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"], "deadline_ms": 5000}))[0] == 200
        status, body, _ = await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"], "deadline_ms": 10},
                                           headers={"X-Request-Id": "hopeless-1"})
        assert_error(status, body, 503, "deadline_unmeetable", "predicted", "past the deadline")
        status, body, _ = await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"]},
                                           headers={"x-envoy-expected-rq-timeout-ms": "20", "X-Request-Id": "hopeless-2"})
        assert_error(status, body, 503, "deadline_unmeetable")
        assert not any(rid.startswith("hopeless") for rid in worker.seen_request_ids)
    finally:
        await stack.client.close()
        worker.stop()


async def test_an_unconfirmed_profile_cannot_lock_the_gateway_out(request_tokenizer):
    wrong = LatencyModel(0.0, 0.0, 0.0, 5000.0)  # a profile taken on a busy machine: 5 s per batch
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, latency=wrong).start()
    stack = await start_stack(request_tokenizer, [worker])
    try:
        statuses = [(await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"], "deadline_ms": 100}))[0]
                    for _ in range(20)]
        assert statuses[-5:] == [200] * 5, statuses  # probes measured the worker; the model was refitted
    finally:
        await stack.client.close()
        worker.stop()


async def test_no_ready_worker_gets_503(request_tokenizer):
    absent = StandInWorker(endpoint())  # configured, never started
    stack = await start_stack(request_tokenizer, [absent], wait=False)
    try:
        status, body, _ = await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"]})
        assert_error(status, body, 503, "no_workers", "ready")
        response = await stack.client.get("/readyz")
        assert_error(response.status, await response.json(), 503, "no_workers")
    finally:
        await stack.client.close()


async def test_a_worker_that_stops_answering_fails_its_requests_with_503_worker_lost(request_tokenizer):
    """Hung inside a call (its transport still answers): the compute watchdog declares it stalled.
    tests/gateway/test_gateway_liveness.py covers the other ways a worker goes."""
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size).start()
    stack = await start_stack(request_tokenizer, [worker])
    try:
        pool = stack.gateway.pool
        pool.liveness = dataclasses.replace(pool.liveness, stall_floor_s=0.3)  # not the 10 s default
        worker.silent = True
        status, body, _ = await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"], "deadline_ms": 5000})
        assert_error(status, body, 503, "worker_lost", "stopped answering")
    finally:
        await stack.client.close()
        worker.stop()


async def test_a_draining_gateway_refuses_new_work_with_503(stack):
    stack.gateway.draining = True
    status, body, _ = await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"]})
    assert_error(status, body, 503, "draining", "shutting down")


async def test_a_request_expiring_in_the_queue_gets_504_and_never_reaches_a_worker(request_tokenizer):
    gate = threading.Event()
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=gate).start()
    stack = await start_stack(request_tokenizer, [worker], max_inflight_batches_per_worker=1, max_batch_wait_ms=0.0)
    try:
        blocker = asyncio.create_task(stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"],
                                                               "deadline_ms": 10_000}))
        await until(lambda: worker.requests, what="the worker holding the blocker")
        status, body, headers = await stack.post("/v1/score", {"samples": ["y"], "labels": ["yes"], "deadline_ms": 80},
                                                 headers={"X-Request-Id": "late-one"})
        assert_error(status, body, 504, "deadline_exceeded", "queue", "never sent")
        assert not blocker.done()  # answered at its deadline, not when the worker frees up
        gate.set()
        assert (await blocker)[0] == 200
        assert not any(rid.startswith("late-one") for rid in worker.seen_request_ids)
    finally:
        await stack.client.close()
        worker.stop()


async def test_a_batch_the_worker_refuses_gets_503_worker_error(request_tokenizer):
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, refuse="internal").start()
    stack = await start_stack(request_tokenizer, [worker])
    try:
        status, body, _ = await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"]})
        assert_error(status, body, 503, "worker_error", "internal", "told to refuse")
    finally:
        await stack.client.close()
        worker.stop()


async def test_a_deployment_without_scoring_answers_404_not_retry(request_tokenizer):
    """Artifacts that hold no score node: /v1/score is not a route this deployment serves (404, at
    once), not a "503 retry shortly"."""
    from loadgen.standin_worker import standin_manifest
    from shared.manifest import BeamNodeFacts

    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size).start()
    manifest = standin_manifest(request_tokenizer.vocab_size, beam=BeamNodeFacts())
    stack = await start_stack(request_tokenizer, [worker], manifest=manifest, wait=False)
    try:
        status, body, _ = await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"]})
        assert_error(status, body, 404, "not_found", "serves no scoring")
    finally:
        await stack.client.close()
        worker.stop()
