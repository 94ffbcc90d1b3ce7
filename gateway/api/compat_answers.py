"""The answers of the de-facto standard routes, declared once as msgspec Structs (written by
gateway/api/answers.py's `encode_json`, described by /openapi.json): Cohere's and Jina's rerank,
text-embeddings-inference's rerank, OpenAI's embeddings and model list."""

from __future__ import annotations

from typing import Literal

from msgspec import UNSET, Struct, UnsetType

from gateway.api.answers import TokenDetails


class RankedDocument(Struct):
    """The document a result ranks (with return_documents)."""

    text: str


class RerankResult(Struct, kw_only=True):
    """One document: its index in the request, its relevance probability in [0, 1]."""

    index: int
    relevance_score: float
    document: RankedDocument | UnsetType = UNSET


class ApiVersion(Struct):
    version: str


class BilledUnits(Struct):
    """Cohere's billing counts: one search unit per request, the prompt tokens submitted."""

    search_units: int
    input_tokens: int


class RerankMeta(Struct, kw_only=True):
    """Cohere's `meta`: the API version answered, the counts, the prompt tokens the workers reused
    instead of computing (`cached_tokens`), and what was done to the input (documents cut)."""

    api_version: ApiVersion
    billed_units: BilledUnits
    cached_tokens: int
    warnings: list[str] | UnsetType = UNSET


class RerankUsage(Struct):
    """Jina's and vLLM's usage, with OpenAI's prompt_tokens_details: every document's prompt whole
    (prompt_tokens = total_tokens) and the shared query prefix's repeats, reused (cached_tokens)."""

    prompt_tokens: int
    total_tokens: int
    prompt_tokens_details: TokenDetails


class RerankAnswer(Struct, kw_only=True):
    """The answer to /v1/rerank and /v2/rerank: results by relevance, best first (top_n of them)."""

    id: str
    model: str
    results: list[RerankResult]
    meta: RerankMeta
    usage: RerankUsage


class TeiRank(Struct, kw_only=True):
    """text-embeddings-inference's rank: index, score (probability, or log-odds with raw_scores), text."""

    index: int
    score: float
    text: str | UnsetType = UNSET


class Embedding(Struct, kw_only=True):
    """One input's vector: float32 values, or their little-endian bytes in base64."""

    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingsUsage(Struct):
    """As OpenAI counts it: the inputs' tokens (an embedding completes none)."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingsAnswer(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage


class ModelCard(Struct, kw_only=True):
    """The served model, under its configured name (the config's `name`)."""

    id: str
    object: Literal["model"] = "model"
    created: int
    """When the artifacts were built (Unix seconds); 0 when the manifest does not say."""
    owned_by: str = "boundserve"


class ModelList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard]


COMPAT_ANSWERS = (RerankAnswer, TeiRank, EmbeddingsAnswer, ModelList)
