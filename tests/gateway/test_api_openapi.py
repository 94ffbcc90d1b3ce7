"""/openapi.json documents the standard routes (rerank, embeddings, models) from their declared types:
every body the document allows is taken by the route's parser (413 only past a count the schema
cannot state for OpenAI's four-shaped `input`), and the answers a stack gives validate against it."""

from __future__ import annotations

import json

import pytest
import schemathesis
from hypothesis import given, settings
from jsonschema import Draft202012Validator

from gateway.api.compat_types import STRUCTS
from gateway.api.embeddings import parse_embeddings
from gateway.api.openapi import openapi_document
from gateway.api.rerank import parser
from gateway.errors import ApiError
from tests.gateway.test_gateway_schema import PLAIN, SETTINGS, integers_as_integers

DOC = openapi_document(PLAIN)
PARSERS = {"POST /v1/rerank": parser("cohere-v1"), "POST /v2/rerank": parser("cohere-v2"),
           "POST /rerank": parser("tei"), "POST /v1/embeddings": parse_embeddings}


def answer_validator(path: str, method: str = "post") -> Draft202012Validator:
    schema = DOC["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
    return Draft202012Validator({**schema, "components": DOC["components"]})


def over_an_unstated_count(body: dict) -> bool:
    """OpenAI's `input` list: its count bound depends on its items' kind, which the schema does not split."""
    given_input = body.get("input")
    if not isinstance(given_input, list):
        return False
    if given_input and isinstance(given_input[0], int):
        return len(given_input) > PLAIN.bounds.max_tokens_per_sample
    return len(given_input) > PLAIN.max_samples_per_request


@pytest.mark.parametrize("label", PARSERS)
def test_every_body_the_document_allows_is_parsed(label):
    operation = {op.label: op for op in (r.ok() for r in schemathesis.openapi.from_dict(DOC).get_all_operations())}[label]

    @given(case=operation.as_strategy())
    @settings(max_examples=60, **SETTINGS)
    def run(case):
        body = integers_as_integers(case.body)
        try:
            PARSERS[label](json.dumps(body).encode(), PLAIN)
        except ApiError as error:
            assert error.code == "too_large" and over_an_unstated_count(body), (body, error.message)
    run()


async def test_the_standard_routes_answers_validate_against_the_document(stack):
    for path, body in (("/v1/rerank", {"query": "red shoe", "documents": ["a", {"text": "b"}], "return_documents": True,
                                       "top_n": 1}),
                       ("/v2/rerank", {"query": "red shoe", "documents": ["a", "b"]}),
                       ("/rerank", {"query": "red shoe", "texts": ["a", "b"], "return_text": True}),
                       ("/v1/embeddings", {"input": ["a", "b"], "encoding_format": "base64"}),
                       ("/v1/embeddings", {"input": [[5, 6], [7]]})):
        status, answer, _ = await stack.post(path, body)
        assert status == 200, answer
        errors = [e.message for e in answer_validator(path).iter_errors(answer)]
        assert not errors, (path, errors)
    response = await stack.client.get("/v1/models")
    assert not list(answer_validator("/v1/models", "get").iter_errors(await response.json()))


async def test_the_document_states_each_standard_rule_and_a_body_breaking_it_gets_its_400(stack):
    schemas = (await (await stack.client.get("/openapi.json")).json())["components"]["schemas"]
    declared = {rule.name: struct for struct in STRUCTS for rule in struct.RULES}
    assert set(declared) == {"one_kind:input"}
    for name, struct in declared.items():
        rule = next(r for r in struct.RULES if r.name == name)
        assert [r["rule"] for r in schemas[struct.__name__]["x-rules"]] == [name]
        assert rule.schema() in schemas[struct.__name__]["allOf"]
    body = {"input": ["red shoe", [5, 6]]}
    status, answer, _ = await stack.post("/v1/embeddings", body)
    assert status == 400 and "$.input[1] is token ids but $.input[0] is text" in answer["error"]["message"]
    valid = Draft202012Validator({"$ref": "#/components/schemas/EmbeddingsRequest", "components": {"schemas": schemas}})
    assert not valid.is_valid(body)
