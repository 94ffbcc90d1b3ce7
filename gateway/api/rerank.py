"""POST /v1/rerank, /v2/rerank (Cohere's and Jina's shape) and /rerank (text-embeddings-inference's)
bodies, parsed into one RerankSpec. The types and their limits are gateway/api/compat_types.py's;
gateway/api/reranking.py runs a spec through the scoring path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gateway.api.compat_types import RerankRequest, TeiRerankRequest
from gateway.api.decoding import BodyDecoder
from gateway.errors import ApiError
from gateway.limits import Limits

Shape = Literal["cohere-v1", "cohere-v2", "tei"]


@dataclass(frozen=True)
class RerankSpec:
    """A validated rerank request, before its prompts are made and tokenized."""

    shape: Shape
    """Which answer to write: Cohere's (v1 or v2: the api_version it names) or TEI's list."""
    query: str
    documents: list[str]
    top_n: int
    """Results answered: every document unless the request asked for fewer."""
    return_documents: bool
    truncate: bool
    """Cut a document whose prompt is over max_tokens_per_sample (else 413)."""
    keep_end: bool
    """Truncation keeps a document's end (TEI's truncation_direction "Left")."""
    max_tokens_per_doc: int | None
    """Cut every document to at most this many tokens first (Cohere v2's field)."""
    raw_scores: bool
    """TEI: the log-odds instead of the probability."""
    model: str | None
    deadline_ms: int | None
    priority: int | None = None
    """The body's priority (None: not given)."""


def _cohere(shape: Shape):
    def build(body: Any, limits: Limits) -> RerankSpec:
        documents = [d if isinstance(d, str) else d.text for d in body.documents]
        top_n = min(body.top_n or len(documents), len(documents))
        return RerankSpec(shape, body.query, documents, top_n, bool(body.return_documents), bool(body.truncate),
                          False, body.max_tokens_per_doc, False, body.model, body.deadline_ms, body.priority)
    return build


def _tei(body: Any, limits: Limits) -> RerankSpec:
    return RerankSpec("tei", body.query, list(body.texts), len(body.texts), bool(body.return_text),
                      bool(body.truncate), body.truncation_direction == "Left", None, bool(body.raw_scores), None,
                      body.deadline_ms, body.priority)


DECODERS: dict[Shape, BodyDecoder[RerankSpec]] = {
    "cohere-v1": BodyDecoder(RerankRequest, _cohere("cohere-v1")),
    "cohere-v2": BodyDecoder(RerankRequest, _cohere("cohere-v2")),
    "tei": BodyDecoder(TeiRerankRequest, _tei)}


def parser(shape: Shape):
    """The WorkRoute parse of one rerank route: body -> RerankSpec, or ApiError (400/404/413)."""
    def parse(raw: bytes, limits: Limits) -> RerankSpec:
        if not limits.score_enabled:
            raise ApiError("not_found", "this deployment serves no scoring (score.enabled is false in its config, or "
                                        "its artifacts hold no score node), so no rerank")
        return DECODERS[shape].decode(raw, limits)
    return parse
