"""GET /openapi.json: the API, with this deployment's bounds, precise enough to fuzz (schemathesis)."""

from __future__ import annotations

from typing import Any

from gateway.errors import ERRORS
from gateway.limits import Limits
from gateway.score_request import OUTPUTS


def openapi_document(limits: Limits) -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {"title": "boundserve gateway", "version": "1",
                 "description": "Deadline-aware scoring and bounded beam search. Errors: " +
                                "; ".join(f"{s} {c}: {m}" for c, (s, m) in ERRORS.items())},
        "paths": {
            "/v1/score": _post("Score samples (prefill only): label probabilities, top-k tokens or embeddings; "
                               "also accepts SGLang's /v1/score schema.",
                               {"anyOf": [_score_ours(limits), _score_sglang(limits)]},
                               {"anyOf": [_score_answer(), _sglang_answer()]}),
            "/v1/generate": _post("Bounded beam search: the best continuations of a prompt.",
                                  _generate(limits), _generate_answer()),
            "/healthz": _get("The process is alive.", {"type": "object"}, []),
            "/readyz": _get("At least one worker is ready.", {"type": "object"}, [503]),
            "/metrics": _get_text("Prometheus metrics."),
            "/openapi.json": _get("This document.", {"type": "object"}, []),
        },
        "components": {"schemas": {"Error": _error_schema()},
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def _ids(vocab: int, max_items: int, min_items: int = 1) -> dict[str, Any]:
    return {"type": "array", "minItems": min_items, "maxItems": max_items,
            "items": {"type": "integer", "minimum": 0, "maximum": vocab - 1}}


def _deadline(limits: Limits) -> dict[str, Any]:
    return {"type": "integer", "minimum": 1, "maximum": limits.max_deadline_ms,
            "description": "Budget in ms from arrival; X-Deadline-Ms and x-envoy-expected-rq-timeout-ms also "
                           "count (the smallest wins), else the route default."}


def _score_ours(limits: Limits) -> dict[str, Any]:
    text = {"type": "string", "minLength": 1, "maxLength": 4096}
    sample = {"anyOf": [
        text,
        {"type": "object", "additionalProperties": False, "required": ["text"],
         "properties": {"text": text, "query": {"type": "string", "maxLength": 4096}}},
        {"type": "object", "additionalProperties": False, "required": ["input_ids"],
         "properties": {"input_ids": _ids(limits.vocab_size, limits.max_tokens_per_sample)}},
    ]}
    return {
        "type": "object", "additionalProperties": False, "required": ["samples"],
        "properties": {
            "samples": {"type": "array", "minItems": 1, "maxItems": limits.max_samples_per_request, "items": sample},
            "labels": {"type": "array", "minItems": 1, "maxItems": limits.max_labels,
                       "items": {"type": "string"}, "description": "Each must be exactly one token."},
            "label_token_ids": _ids(limits.vocab_size, limits.max_labels),
            "output": {"type": "string", "enum": list(OUTPUTS), "default": "probs"},
            "top_k": {"type": "integer", "minimum": 1, "maximum": limits.max_top_k},
            "query": {"type": "string", "maxLength": 4096},
            "deadline_ms": _deadline(limits),
        },
    }


def _score_sglang(limits: Limits) -> dict[str, Any]:
    texts = {"type": "array", "minItems": 1, "maxItems": limits.max_samples_per_request,
             "items": {"type": "string", "minLength": 1, "maxLength": 4096}}
    id_lists = {"type": "array", "minItems": 1, "maxItems": limits.max_samples_per_request,
                "items": _ids(limits.vocab_size, limits.max_tokens_per_sample)}
    return {
        "type": "object", "additionalProperties": False, "required": ["items", "label_token_ids"],
        "properties": {
            "query": {"anyOf": [{"type": "string", "maxLength": 4096}, _ids(limits.vocab_size, 64, 0)]},
            "items": {"anyOf": [{"type": "string", "minLength": 1, "maxLength": 4096}, texts, id_lists]},
            "label_token_ids": _ids(limits.vocab_size, limits.max_labels),
            "apply_softmax": {"type": "boolean", "default": False},
            "item_first": {"type": "boolean", "default": False},
            "model": {"type": "string", "maxLength": 256},
            "deadline_ms": _deadline(limits),
        },
    }


def _generate(limits: Limits) -> dict[str, Any]:
    return {
        "type": "object", "additionalProperties": False,
        "properties": {
            "prompt": {"type": "string", "minLength": 1, "maxLength": 4096},
            "input_ids": _ids(limits.vocab_size, limits.max_prompt_tokens),
            "beam_width": {"type": "integer", "minimum": 1, "maximum": limits.max_beam_width},
            "max_new_tokens": {"type": "integer", "minimum": 1, "maximum": limits.max_new_tokens},
            "num_return_sequences": {"type": "integer", "minimum": 1, "maximum": limits.max_beam_width},
            "constraints": {"type": "string"},
            "deadline_ms": _deadline(limits),
        },
        "oneOf": [{"required": ["prompt"], "not": {"required": ["input_ids"]}},
                  {"required": ["input_ids"], "not": {"required": ["prompt"]}}],
        "description": "Give exactly one of prompt or input_ids; num_return_sequences <= beam_width.",
    }


def _score_answer() -> dict[str, Any]:
    matrix = {"type": "array", "items": {"type": "array", "items": {"type": "number", "nullable": True}}}
    return {"type": "object", "required": ["id", "object", "output"],
            "properties": {"id": {"type": "string"}, "object": {"type": "string"}, "output": {"type": "string"},
                           "scores": matrix, "label_token_ids": {"type": "array", "items": {"type": "integer"}},
                           "topk": {"type": "object"}, "embeddings": matrix, "head": matrix,
                           "usage": {"type": "object"}}}


def _sglang_answer() -> dict[str, Any]:
    return {"type": "object", "required": ["scores", "model", "object"],
            "properties": {"scores": {"type": "array"}, "model": {"type": "string"},
                           "usage": {"type": "object"}, "object": {"type": "string"}}}


def _generate_answer() -> dict[str, Any]:
    candidate = {"type": "object", "required": ["text", "token_ids", "score"],
                 "properties": {"text": {"type": "string"}, "token_ids": {"type": "array", "items": {"type": "integer"}},
                                "score": {"type": "number"}}}
    return {"type": "object", "required": ["id", "candidates"],
            "properties": {"id": {"type": "string"}, "object": {"type": "string"},
                           "candidates": {"type": "array", "items": candidate}, "usage": {"type": "object"}}}


def _error_schema() -> dict[str, Any]:
    return {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["code", "message"],
        "properties": {"code": {"type": "string", "enum": list(ERRORS)}, "message": {"type": "string"},
                       "request_id": {"type": "string"}}}}}


def _errors(statuses: list[int]) -> dict[str, Any]:
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    return {str(s): {"description": ", ".join(c for c, (st, _) in ERRORS.items() if st == s), "content": ref}
            for s in statuses}


def _post(summary: str, body: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    headers = [{"name": name, "in": "header", "required": False,
                "schema": {"type": "string", "pattern": "^[0-9]{1,7}$"}}
               for name in ("X-Deadline-Ms", "x-envoy-expected-rq-timeout-ms")]
    return {"post": {
        "summary": summary, "security": [{}, {"bearer": []}], "parameters": headers,
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {"200": {"description": "the answer", "content": {"application/json": {"schema": answer}}},
                      **_errors([400, 401, 404, 413, 429, 500, 503, 504])},
    }}


def _get(summary: str, answer: dict[str, Any], statuses: list[int]) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": {
        "200": {"description": "ok", "content": {"application/json": {"schema": answer}}}, **_errors(statuses)}}}


def _get_text(summary: str) -> dict[str, Any]:
    return {"get": {"summary": summary, "security": [{}, {"bearer": []}], "responses": {
        "200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}},
        **_errors([401])}}}
