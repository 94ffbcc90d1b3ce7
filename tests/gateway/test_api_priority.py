"""Priorities on every work route (/v1/score, /v1/generate, rerank, embeddings, completions), taken
alike: the body's `priority` or X-Priority (larger is more important, default 0), bounded by [gateway]
min_priority / max_priority, refused when out of bounds or given twice differently; through real HTTP
to the stand-in worker, the priority reaches the request's jobs: a higher one queued later is sent to
the worker first, and the answer is counted under its priority and deadline class (goodput);
/openapi.json documents the field and the header."""

from __future__ import annotations

import asyncio
import threading

import pytest

from gateway.api.openapi import openapi_document
from loadgen.standin_worker import StandInWorker
from shared.request_ids import client_id
from tests.gateway.conftest import endpoint, start_stack
from tests.gateway.metrics_page import sample, scrape
from tests.gateway.test_gateway_schema import PLAIN
from tests.gateway.test_gateway_rejections import assert_error
from tests.gateway.waiting import until

FULL = 16  # the stand-in's max_samples_per_batch: a request of 16 items is a batch of its own
SCORE_FULL = {"samples": [f"s{k}" for k in range(FULL)], "labels": ["yes"]}
ROUTES = {
    "/v1/score": SCORE_FULL,
    "/v1/rerank": {"query": "red shoe", "documents": [f"shoe {k}" for k in range(FULL)]},
    "/v2/rerank": {"query": "red shoe", "documents": [f"shoe {k}" for k in range(FULL)]},
    "/rerank": {"query": "red shoe", "texts": [f"shoe {k}" for k in range(FULL)]},
    "/v1/embeddings": {"input": [f"shoe {k}" for k in range(FULL)]},
    "/v1/completions": {"prompt": [f"shoe {k}" for k in range(FULL)], "max_tokens": 1},
}


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("extra, headers, words", [
    ({"priority": 11}, {}, ["$.priority = 11", "between -10 and 10"]),
    ({"priority": -11}, {}, ["$.priority = -11", "between -10 and 10"]),
    ({"priority": "high"}, {}, ["$.priority", "integer"]),
    ({}, {"X-Priority": "11"}, ["X-Priority", "between -10 and 10"]),
    ({}, {"X-Priority": "urgent"}, ["X-Priority", "integer"]),
    ({"priority": 2}, {"X-Priority": "3"}, ["priority is 2 in the body and 3 in X-Priority"]),
], ids=["over", "under", "not-a-number", "header-over", "header-not-a-number", "disagree"])
async def test_a_priority_outside_the_bounds_or_given_twice_differently_gets_400(stack, path, extra, headers, words):
    status, body, _ = await stack.post(path, {**ROUTES[path], **extra}, headers=headers)
    assert_error(status, body, 400, "invalid_request", *words)


@pytest.mark.parametrize("path", ROUTES)
async def test_a_priority_from_the_body_or_the_header_is_the_answer_s_priority(stack, path):
    for extra, headers in (({"priority": 3}, {}), ({}, {"X-Priority": "3"}), ({"priority": 3}, {"X-Priority": "3"}),
                           ({}, {}), ({"deadline_ms": 5000}, {})):
        status, body, _ = await stack.post(path, {**ROUTES[path], **extra}, headers=headers)
        assert status == 200, body
    text = await scrape(stack)
    name = "boundserve_answered_by_class_total"
    assert sample(text, name, workload="score", priority="3", deadline_class="30000", timing="in_time") == 3.0
    assert sample(text, name, workload="score", priority="0", deadline_class="30000", timing="in_time") == 1.0
    assert sample(text, name, workload="score", priority="0", deadline_class="5000", timing="in_time") == 1.0


@pytest.mark.parametrize("path, body, beam_requests", [
    ("/v1/generate", {"prompt": "red", "beam_width": 2, "max_new_tokens": 2}, 1),
    ("/v1/completions", {"prompt": ["red", "blue"], "max_tokens": 2, "n": 1, "best_of": 2}, 2),  # one per prompt
])
async def test_beam_search_runs_at_the_request_s_priority(stack, path, body, beam_requests):
    for extra, headers in (({"priority": -4}, {}), ({}, {"X-Priority": "-4"})):
        status, answer, _ = await stack.post(path, {**body, **extra}, headers=headers)
        assert status == 200, answer
    text = await scrape(stack)
    assert sample(text, "boundserve_answered_by_class_total", workload="beam", priority="-4", deadline_class="30000",
                  timing="in_time") == 2.0 * beam_requests


@pytest.mark.parametrize("via", ["body", "header"])
@pytest.mark.parametrize("path", ROUTES)
async def test_under_contention_the_route_s_higher_priority_is_sent_first(request_tokenizer, path, via):
    held = threading.Event()  # the worker holds its answers until set: the queue builds up behind a blocker
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=held).start()
    stack = await start_stack(request_tokenizer, [worker], max_inflight_batches_per_worker=1)
    try:
        blocker = asyncio.create_task(stack.post("/v1/score", {**SCORE_FULL, "deadline_ms": 20_000},
                                                 headers={"X-Request-Id": "blocker"}))
        await until(lambda: worker.batch_sizes, what="the blocker reaching the worker")
        low = asyncio.create_task(stack.post("/v1/score", {**SCORE_FULL, "deadline_ms": 10_000},
                                             headers={"X-Request-Id": "low"}))
        await until(lambda: stack.gateway.batchers["score"].queued_jobs == 1, what="the low one queued")
        body = {**ROUTES[path], "deadline_ms": 20_000, **({"priority": 5} if via == "body" else {})}
        headers = {"X-Request-Id": "high", **({"X-Priority": "5"} if via == "header" else {})}
        high = asyncio.create_task(stack.post(path, body, headers=headers))
        await until(lambda: stack.gateway.batchers["score"].queued_jobs == 2, what="the high one queued")
        held.set()
        assert [(await task)[0] for task in (blocker, low, high)] == [200, 200, 200]
        order = list(dict.fromkeys(client_id(r.request_id) for r in worker.requests))
        assert order == ["blocker", "high", "low"]  # the high one's deadline is later, its priority larger
    finally:
        held.set()
        await stack.client.close()
        worker.stop()


def test_openapi_documents_the_priority_field_and_header_on_every_work_route():
    doc = openapi_document(PLAIN)
    schemas = doc["components"]["schemas"]
    for name in ("ScoreRequest", "SglangScoreRequest", "GenerateRequest", "RerankRequest", "TeiRerankRequest",
                 "EmbeddingsRequest", "CompletionRequest"):
        field = schemas[name]["properties"]["priority"]
        bounded = next(v for v in field.get("anyOf", [field]) if v.get("type") == "integer")
        assert (bounded["minimum"], bounded["maximum"]) == (PLAIN.min_priority, PLAIN.max_priority), (name, field)
    for path in (*ROUTES, "/v1/generate"):
        header = next(p for p in doc["paths"][path]["post"]["parameters"] if p["name"] == "X-Priority")
        assert header["schema"] == {"type": "integer", "minimum": PLAIN.min_priority, "maximum": PLAIN.max_priority}
