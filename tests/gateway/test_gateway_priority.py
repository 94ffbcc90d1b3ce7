"""Priorities on the live gateway: the body's `priority` or X-Priority (larger is more important,
default 0), bounded by [gateway] min_priority / max_priority; under contention the higher priority
is served first (tests/gateway/test_api_priority.py, for every work route); goodput is counted per
priority and deadline class; OpenAPI documents it."""

from __future__ import annotations


import pytest

from gateway.api.openapi import openapi_document
from tests.gateway.metrics_page import sample, scrape
from tests.gateway.test_gateway_rejections import assert_error

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

