"""GET /openapi.json (OpenAPI 3.1), generated from the types the gateway decodes and answers with
(gateway/api/types.py, answers.py, errors.py), with this deployment's limits filled in from their
declarations (gateway/api/limit.py): precise enough to fuzz. Only the routes, headers and statuses
are written here; no body schema is."""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.api.limit import fill_schema
from gateway.api.rules import schema_of
from gateway.api.deadline import ENVOY_HEADER
from gateway.errors import ERRORS, SENT, ErrorAnswer
from gateway.api.answers import ANSWERS
from gateway.api.completions import CompletionAnswer, CompletionRequest
from gateway.api.priority import PRIORITY_HEADER
from gateway.api.types import PRIORITY_HELP, STRUCTS, GenerateRequest, ScoreRequest, SglangScoreRequest
from gateway.api.compat_openapi import compat_paths
from gateway.limits import Limits

REF = "#/components/schemas/{name}"
DEADLINE_HEADER_SAYS = ("Budget in ms from arrival (gateway/api/deadline.py); the smallest of this, the other header and "
                        "deadline_ms wins.")
SENT_ERRORS = {code: ERRORS[code] for code in SENT}
ERROR_STATUSES = tuple(sorted({status for status, _ in SENT_ERRORS.values()}))


def openapi_document(limits: Limits) -> dict[str, Any]:
    schemas, components = msgspec.json.schema_components(
        [ScoreRequest, SglangScoreRequest, GenerateRequest, ErrorAnswer, *ANSWERS, dict[str, Any], str,
         CompletionRequest, CompletionAnswer], ref_template=REF)
    for struct in (*STRUCTS, CompletionRequest):  # rules across fields, declared with the types (gateway/api/rules.py)
        components[struct.__name__].update(schema_of(struct.RULES, limits))
    components = fill_schema(components, limits)
    (score, sglang, generate, error, score_answer, sglang_answer, generate_answer, health, ready, document,
     text, completion_body, completion_answer) = schemas
    headers = [{"name": name, "in": "header", "required": False, "description": DEADLINE_HEADER_SAYS + extra,
                "schema": {"type": "integer", "minimum": least, "maximum": limits.max_deadline_ms}}
               for name, least, extra in (("X-Deadline-Ms", 1, ""),
                                          (ENVOY_HEADER, 0, " Envoy's 0 means no timeout: the others decide."))]
    headers.append({"name": PRIORITY_HEADER, "in": "header", "required": False,
                    "description": PRIORITY_HELP + " The body's priority field, if given, must be the same.",
                    "schema": {"type": "integer", "minimum": limits.min_priority, "maximum": limits.max_priority}})
    errors = _errors(error)
    paths = compat_paths(limits, components, headers, errors)
    return {
        "openapi": "3.1.0",
        "info": {"title": "boundserve gateway", "version": "1",
                 "description": "Deadline-aware scoring and bounded beam search. Errors: " +
                                "; ".join(f"{s} {c}: {m}" for c, (s, m) in SENT_ERRORS.items())},
        "paths": {
            "/v1/score": _post("Score samples (prefill only): label probabilities, top-k tokens or embeddings; "
                               "also accepts SGLang's /v1/score schema.", {"anyOf": [score, sglang]},
                               {"anyOf": [score_answer, sglang_answer]}, headers, errors),
            "/v1/generate": _post("Bounded beam search: the best continuations of a prompt.", generate,
                                  generate_answer, headers, errors),
            "/v1/completions": _post("OpenAI's legacy completions, never sampled: echo + logprobs + max_tokens 0 "
                                     "scores every prompt token; max_tokens 1 adds the greedy token; above, n of "
                                     "best_of beams.", completion_body, completion_answer, headers, errors),
            "/healthz": _get("The process is alive.", health, errors, []),
            "/readyz": _get("At least one worker is ready.", ready, errors, [503]),
            "/metrics": _get_text("Prometheus metrics.", text, errors),
            "/openapi.json": _get("This document.", document, errors, []),
            **paths,
        },
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def _errors(error: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per status, the error answer and the codes it carries."""
    return {str(s): {"description": ", ".join(c for c, (st, _) in SENT_ERRORS.items() if st == s),
                     "content": {"application/json": {"schema": error}}} for s in ERROR_STATUSES}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _post(summary: str, body: dict[str, Any], answer: dict[str, Any], headers: list[dict[str, Any]],
          errors: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"post": {
        "summary": summary, "security": [{}, {"bearer": []}], "parameters": headers,
        "requestBody": {"required": True, "content": _json(body)},
        "responses": {"200": {"description": "the answer", "content": _json(answer)}, **errors},
    }}


def _get(summary: str, answer: dict[str, Any], errors: dict[str, dict[str, Any]],
         statuses: list[int]) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": {
        "200": {"description": "ok", "content": _json(answer)}, **{str(s): errors[str(s)] for s in statuses}}}}


def _get_text(summary: str, text: dict[str, Any], errors: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"get": {"summary": summary, "security": [{}, {"bearer": []}], "responses": {
        "200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": text}}},
        "401": errors["401"]}}}
