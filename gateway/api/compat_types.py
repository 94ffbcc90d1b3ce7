"""The request bodies of the de-facto standard routes, declared once, at import, as msgspec Structs
beside gateway/api/types.py's own (the same field types, the same split of validity limits and
compiled bounds):
- Cohere's and Jina's rerank (POST /v1/rerank, Cohere's ClientV2 at /v2/rerank),
- text-embeddings-inference's rerank (POST /rerank),
- OpenAI's embeddings (POST /v1/embeddings).
Fields those APIs define that this gateway cannot honour are declared too, as null-only, so a body
that sends them is refused naming the field and why (never ignored without a word).
"""

from typing import Annotated, ClassVar, Literal

from msgspec import Meta, Struct

from gateway.api.compat_rules import InputsOfOneKind
from gateway.api.rules import Rule
from gateway.api.types import MAX_MODEL_CHARS, MAX_TEXT_CHARS, DeadlineMs, Priority, Text, TokenId, per_request

TRUNCATE_HELP = ("Documents whose prompt is over the compiled max_tokens_per_sample are refused (413) unless this "
                 "is true; then each is cut at a token boundary to fit, and the answer says which were cut.")
MODEL_HELP = "The served model's name (GET /v1/models); another name is refused (404)."


def _unsupported(why: str) -> object:
    """A field of the standard the gateway cannot honour: absent or null only, refused naming `why`."""
    return Annotated[None, Meta(extra={"hint": why})]


NO_RANK_FIELDS = _unsupported("documents are ranked on their text alone; remove rank_fields")
NO_CHUNKS = _unsupported("documents are not chunked: a document over the bound is refused, or cut with truncate or "
                         "max_tokens_per_doc; remove max_chunks_per_doc")
NO_SPANS = _unsupported("this reranker scores whole documents; remove relevant_spans")


def documents(field: str, item: object) -> object:
    return per_request(f"{field} holds {{count}} documents; this deployment takes at most {{bound}} per request", item)


Texts = documents("texts", Text)


class RerankDocument(Struct, forbid_unknown_fields=True):
    """A document as an object: its text (the only field ranked on)."""

    RULES: ClassVar[tuple[Rule, ...]] = ()
    text: Text


Documents = documents("documents", Text | RerankDocument)


class RerankRequest(Struct, forbid_unknown_fields=True):
    """Cohere's (v1 and v2) and Jina's rerank: the documents by relevance to the query, best first.
    Relevance is the probability of the deployment's "yes" label ([rerank] in its config)."""

    RULES: ClassVar[tuple[Rule, ...]] = ()
    query: Annotated[str, Meta(min_length=1, max_length=MAX_TEXT_CHARS)]
    documents: Documents
    model: Annotated[str, Meta(max_length=MAX_MODEL_CHARS, description=MODEL_HELP)] | None = None
    top_n: Annotated[int, Meta(ge=1, description="Results returned (default: every document; more than "
                                                 "the documents: every document).")] | None = None
    return_documents: Annotated[bool, Meta(description="Each result carries its document's text "
                                                       "(default false).")] | None = None
    max_tokens_per_doc: Annotated[int, Meta(ge=1, description=(
        "Cohere v2: cut each document to at most this many tokens (the answer's meta.warnings names those "
        "cut)."))] | None = None
    truncate: Annotated[bool, Meta(description=TRUNCATE_HELP)] | None = None
    rank_fields: NO_RANK_FIELDS = None
    max_chunks_per_doc: NO_CHUNKS = None
    relevant_spans: NO_SPANS = None
    deadline_ms: DeadlineMs | None = None
    priority: Priority | None = None


class TeiRerankRequest(Struct, forbid_unknown_fields=True):
    """text-embeddings-inference's /rerank: [{index, score, text?}] best first; score is the
    relevance probability, or with raw_scores its log-odds."""

    RULES: ClassVar[tuple[Rule, ...]] = ()
    query: Annotated[str, Meta(min_length=1, max_length=MAX_TEXT_CHARS)]
    texts: Texts
    raw_scores: Annotated[bool, Meta(description="The log-odds ln(p / (1 - p)) instead of the "
                                                 "probability p.")] | None = None
    return_text: bool | None = None
    truncate: Annotated[bool, Meta(description=TRUNCATE_HELP)] | None = None
    truncation_direction: Annotated[Literal["Right", "Left"], Meta(
        description="Right cuts a document's end, Left its start (with truncate).")] | None = None
    deadline_ms: DeadlineMs | None = None
    priority: Priority | None = None


# msgspec takes one list type per union: the four shapes of `input` are one list of items, whose
# kinds the rule InputsOfOneKind keeps apart; their counts are checked on parsing (gateway/api/embeddings.py)
InputItem = Text | TokenId | Annotated[list[TokenId], Meta(min_length=1)]


class EmbeddingsRequest(Struct, forbid_unknown_fields=True):
    """OpenAI's embeddings: per input, the final-norm hidden state at its last token. `input` is a
    text, a list of texts, a list of token ids (one input) or a list of token id lists."""

    RULES: ClassVar[tuple[Rule, ...]] = (InputsOfOneKind(),)
    input: Text | Annotated[list[InputItem], Meta(min_length=1)]
    model: Annotated[str, Meta(max_length=MAX_MODEL_CHARS, description=MODEL_HELP)] | None = None
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, Meta(ge=1, description="Only the model's hidden size is served; another is "
                                                      "refused.")] | None = None
    user: Annotated[str, Meta(max_length=MAX_MODEL_CHARS, description=(
        "Accepted for OpenAI compatibility and written to no log: this gateway has no per-user "
        "accounting."))] | None = None
    deadline_ms: DeadlineMs | None = None
    priority: Priority | None = None


STRUCTS: tuple[type[Struct], ...] = (RerankDocument, RerankRequest, TeiRerankRequest, EmbeddingsRequest)
"""Every request Struct of the standard routes (their `RULES` go into the schema)."""
