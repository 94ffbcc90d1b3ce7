"""The request types are declared once; each deployment's limits are checked after decoding and filled
into /openapi.json (gateway/api/limit.py, limit_check.py). The same Struct and decoder serve two
deployments, each refusing by its own limits with the words and codes of the rest of the suite
(tests/gateway/test_gateway_schema.py proves the document and the decoder agree)."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated

import msgspec
import pytest

from gateway.api import types
from gateway.api.generate import parse_generate
from gateway.api.limit import Limit, limited
from gateway.api.limit_check import LimitCheck
from gateway.api.openapi import openapi_document
from gateway.api.score import parse_score
from gateway.errors import ApiError
from tests.gateway.test_gateway_schema import PLAIN

SMALL = dataclasses.replace(PLAIN, vocab_size=512, max_samples_per_request=8, max_deadline_ms=1000,
                            min_priority=-1, max_priority=2, constraints="market",
                            bounds=dataclasses.replace(PLAIN.bounds, max_beam_width=2, max_labels=3))


class Twice(msgspec.Struct):
    """A field whose limits are split over two Metas: refused when its check is made (at import)."""

    value: Annotated[Annotated[int, limited(Limit("vocab_size", "le"))], limited(Limit("max_top_k", "le"))]


def refusal(parse, body: dict, limits) -> ApiError:
    with pytest.raises(ApiError) as refused:
        parse(json.dumps(body).encode(), limits)
    return refused.value


def test_one_body_is_judged_by_each_deployment_s_own_limits():
    nine = {"samples": [f"s{k}" for k in range(9)], "labels": ["yes"]}
    assert len(parse_score(json.dumps(nine).encode(), PLAIN).samples) == 9
    error = refusal(parse_score, nine, SMALL)
    assert (error.status, error.message) == (413, "samples holds 9 samples; this deployment takes at most 8 per "
                                                  "request (at $.samples; nothing was truncated)")
    ids = {"samples": [{"input_ids": [1, 700]}], "label_token_ids": [1]}
    assert parse_score(json.dumps(ids).encode(), PLAIN).samples == [[1, 700]]
    error = refusal(parse_score, ids, SMALL)
    assert (error.status, error.message) == (400, "$.samples[0].input_ids[1] = 700 must be an integer token id "
                                                  "between 0 and 511")
    for field, value, words in (("deadline_ms", 1001, "$.deadline_ms = 1001 must be an integer between 1 and 1000"),
                                ("priority", 3, "$.priority = 3 must be an integer between -1 and 2")):
        error = refusal(parse_score, {"samples": ["x"], "labels": ["yes"], field: value}, SMALL)
        assert (error.status, error.message) == (400, words)


def test_a_malformed_field_is_described_with_the_deployment_s_limits():
    """msgspec refuses -4 on the static type (ge=0); the words still give this deployment's vocabulary."""
    error = refusal(parse_score, {"samples": [{"input_ids": [-4]}], "label_token_ids": [1]}, SMALL)
    assert (error.status, error.message) == (400, "$.samples[0].input_ids[0] = -4 must be an integer token id "
                                                  "between 0 and 511")


def test_a_validity_limit_is_answered_before_a_rule_and_a_rule_before_a_compiled_bound():
    over = {"samples": ["x"] * 9, "labels": ["yes", "yes"]}
    assert refusal(parse_score, over, SMALL).status == 400  # the rule (distinct labels) first
    assert refusal(parse_score, {**over, "labels": ["yes"], "deadline_ms": 5000}, SMALL).message.startswith(
        "$.deadline_ms = 5000")


def test_a_default_capped_by_a_compiled_bound_is_the_deployment_s():
    body = {"prompt": "x", "num_return_sequences": 3}
    assert parse_generate(json.dumps(body).encode(), PLAIN).num_return_sequences == 3
    error = refusal(parse_generate, body, SMALL)
    assert error.message == "$.num_return_sequences = 3 must not exceed $.beam_width = 2 (its default)"
    rule = next(r for r in openapi_document(SMALL)["components"]["schemas"]["GenerateRequest"]["x-rules"]
                if r["rule"].startswith("not_above"))
    assert rule["limit_default"] == 2


def test_a_field_only_some_deployments_take_is_refused_by_the_others_saying_why():
    assert parse_generate(b'{"prompt": "x", "constraints": "market", "catalog": "eu"}', SMALL).catalog == "eu"
    error = refusal(parse_generate, {"prompt": "x", "constraints": "catalog"}, SMALL)
    assert error.message == '$.constraints = "catalog" must be one of market'
    error = refusal(parse_generate, {"prompt": "x", "catalog": "eu"}, PLAIN)
    assert error.message == '$.catalog = "eu" must be null; this deployment decodes unconstrained; remove the field'


def test_the_document_shows_each_deployment_s_limits_and_no_marker():
    for limits in (PLAIN, SMALL):
        doc = openapi_document(limits)
        text = json.dumps(doc)
        assert "x-limits" not in text
        score = doc["components"]["schemas"]["ScoreRequest"]["properties"]
        assert score["samples"]["maxItems"] == limits.max_samples_per_request
        assert score["samples"]["x-compiled-bound"] == "max_samples_per_request"
        deadline = next(v for v in score["deadline_ms"]["anyOf"] if v.get("type") == "integer")
        assert (deadline["minimum"], deadline["maximum"]) == (1, limits.max_deadline_ms)
        token_id = doc["components"]["schemas"]["SampleObject"]["properties"]["input_ids"]["anyOf"][0]["items"]
        assert token_id["maximum"] == limits.vocab_size - 1


def test_the_request_types_are_declared_once():
    assert types.ScoreRequest is types.STRUCTS[1]
    assert parse_score(b'{"samples": ["x"], "labels": ["yes"]}', SMALL).samples == ["x"]  # no type made per deployment
    assert msgspec.json.Decoder(types.ScoreRequest).decode(b'{"samples": ["x"], "deadline_ms": 99999999}')


def test_a_limit_is_declared_with_a_known_keyword_in_one_meta():
    with pytest.raises(ValueError, match="keyword"):
        Limit("max_labels", "below")
    with pytest.raises(TypeError, match="one Meta"):
        LimitCheck(Twice)
