"""The de-facto standard routes' part of /openapi.json (gateway/api/openapi.py adds it): their
request Structs (gateway/api/compat_types.py, with their rules) and answers (compat_answers.py) as
components, and their paths."""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.api.compat_answers import EmbeddingsAnswer, ModelList, RerankAnswer, TeiRank
from gateway.api.compat_types import STRUCTS, EmbeddingsRequest, RerankRequest, TeiRerankRequest
from gateway.api.limit import fill_schema
from gateway.api.reranking import TRUNCATED_HEADER
from gateway.api.rules import schema_of
from gateway.limits import Limits

REF = "#/components/schemas/{name}"
RERANK_SAYS = ("Rank documents by relevance to a query (a generative reranker: the probability of the "
               "deployment's [rerank] label after its prompt template), best first. ")
TRUNCATED_SAYS = {TRUNCATED_HEADER: {"description": "Indices of the documents cut to fit (truncate or "
                                                    "max_tokens_per_doc), comma-separated; absent when none was cut.",
                                     "schema": {"type": "string"}}}


def compat_paths(limits: Limits, components: dict[str, Any], headers: list[dict[str, Any]],
                 errors: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The standard routes' paths; their schemas are added to `components` (the document's)."""
    schemas, more = msgspec.json.schema_components(
        [RerankRequest, TeiRerankRequest, EmbeddingsRequest, RerankAnswer, list[TeiRank], EmbeddingsAnswer, ModelList],
        ref_template=REF)
    for struct in STRUCTS:
        more[struct.__name__].update(schema_of(struct.RULES, limits))
    components.update(fill_schema(more, limits))
    rerank, tei, embeddings, rerank_answer, tei_answer, embeddings_answer, model_list = schemas
    post = _poster(headers, errors)
    return {
        "/v1/rerank": post(RERANK_SAYS + "Cohere's v1 and Jina's shape.", rerank, rerank_answer, TRUNCATED_SAYS),
        "/v2/rerank": post(RERANK_SAYS + "Cohere's v2 shape (ClientV2).", rerank, rerank_answer, TRUNCATED_SAYS),
        "/rerank": post(RERANK_SAYS + "text-embeddings-inference's shape.", tei, tei_answer, TRUNCATED_SAYS),
        "/v1/embeddings": post("OpenAI's embeddings: per input, the final-norm hidden state at its last token.",
                               embeddings, embeddings_answer, {}),
        "/v1/models": {"get": {"summary": "OpenAI's model list: the served model, under its configured name.",
                               "security": [{}, {"bearer": []}], "responses": {
                                   "200": {"description": "ok", "content": _json(model_list)},
                                   "401": errors["401"]}}},
    }


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _poster(headers: list[dict[str, Any]], errors: dict[str, dict[str, Any]]):
    def post(summary: str, body: dict[str, Any], answer: dict[str, Any],
             answer_headers: dict[str, Any]) -> dict[str, Any]:
        ok = {"description": "the answer", "content": _json(answer),
              **({"headers": answer_headers} if answer_headers else {})}
        return {"post": {"summary": summary, "security": [{}, {"bearer": []}], "parameters": headers,
                         "requestBody": {"required": True, "content": _json(body)},
                         "responses": {"200": ok, **errors}}}
    return post
