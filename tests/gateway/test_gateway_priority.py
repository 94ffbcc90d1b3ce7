"""Priorities on the live gateway: the body's `priority` or X-Priority (larger is more important,
default 0), bounded by [gateway] min_priority / max_priority; under contention the higher priority
is served first; goodput is counted per priority and deadline class; OpenAPI documents it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gateway.api.openapi import openapi_document
from loadgen.standin_worker import StandInWorker
from shared.request_ids import client_id
from tests.gateway.conftest import endpoint, start_stack
from tests.gateway.metrics_page import sample, scrape
from tests.gateway.test_gateway_rejections import assert_error
from tests.gateway.waiting import until

SCORE = "/v1/score"
BODY = {"samples": ["x"], "labels": ["yes"]}


@pytest.mark.parametrize("extra, headers, words", [
    ({"priority": 11}, {}, ["priority", "11"]),
    ({"priority": -11}, {}, ["priority", "-11"]),
    ({"priority": "high"}, {}, ["priority"]),
    ({}, {"X-Priority": "11"}, ["X-Priority", "between -10 and 10"]),
    ({}, {"X-Priority": "urgent"}, ["X-Priority", "integer"]),
    ({"priority": 2}, {"X-Priority": "3"}, ["priority is 2 in the body and 3 in X-Priority"]),
])
async def test_a_priority_outside_the_bounds_or_given_twice_differently_gets_400(stack, extra, headers, words):
    status, body, _ = await stack.post(SCORE, {**BODY, **extra}, headers=headers)
    assert_error(status, body, 400, "invalid_request", *words)


async def test_a_priority_within_the_bounds_is_served_and_counted_by_priority_and_deadline_class(stack):
    for extra, headers in (({"priority": 3}, {}), ({}, {"X-Priority": "3"}), ({"priority": 3}, {"X-Priority": "3"}),
                           ({"deadline_ms": 5000}, {})):
        status, body, _ = await stack.post(SCORE, {**BODY, **extra}, headers=headers)
        assert status == 200, body
    text = await scrape(stack)
    name = "boundserve_answered_by_class_total"
    assert sample(text, name, workload="score", priority="3", deadline_class="30000", timing="in_time") == 3.0
    assert sample(text, name, workload="score", priority="0", deadline_class="5000", timing="in_time") == 1.0


async def test_under_contention_the_higher_priority_is_served_first(request_tokenizer):
    held = threading.Event()  # the worker holds its answers until set: the queue builds up behind a blocker
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=held).start()
    stack = await start_stack(request_tokenizer, [worker], max_inflight_batches_per_worker=1)
    full = {"samples": [f"s{k}" for k in range(16)], "labels": ["yes"], "deadline_ms": 20_000}  # a batch each
    try:
        blocker = asyncio.create_task(stack.post(SCORE, full, headers={"X-Request-Id": "blocker"}))
        await until(lambda: worker.batch_sizes, what="the blocker reaching the worker")
        low = asyncio.create_task(stack.post(SCORE, {**full, "deadline_ms": 10_000}, headers={"X-Request-Id": "low"}))
        await until(lambda: stack.gateway.batchers["score"].queued_jobs == 1, what="the low one queued")
        high = asyncio.create_task(stack.post(SCORE, {**full, "priority": 5}, headers={"X-Request-Id": "high"}))
        await until(lambda: stack.gateway.batchers["score"].queued_jobs == 2, what="the high one queued")
        held.set()
        assert [(await task)[0] for task in (blocker, low, high)] == [200, 200, 200]
        order = list(dict.fromkeys(client_id(r.request_id) for r in worker.requests))
        assert order == ["blocker", "high", "low"]  # the high one's deadline is later, its priority larger
    finally:
        held.set()
        await stack.client.close()
        worker.stop()


async def test_openapi_documents_the_priority_field_and_header(stack):
    doc = openapi_document(stack.gateway.limits)
    schemas = doc["components"]["schemas"]
    for name in ("ScoreRequest", "SglangScoreRequest", "GenerateRequest"):
        field = schemas[name]["properties"]["priority"]
        variants = field.get("anyOf", [field])
        bounded = next(v for v in variants if v.get("type") == "integer")
        assert (bounded["minimum"], bounded["maximum"]) == (-10, 10), field
    parameters = doc["paths"]["/v1/score"]["post"]["parameters"]
    header = next(p for p in parameters if p["name"] == "X-Priority")
    assert header["schema"] == {"type": "integer", "minimum": -10, "maximum": 10}

