"""POST /v1/score bodies, in boundserve's own shape or SGLang's, parsed into one ScoreSpec.

Ours:   {"samples": [str | {"text", "query"?} | {"input_ids"}], "labels" | "label_token_ids",
         "output": probs|logprobs|logits|topk|embedding, "top_k", "query", "deadline_ms"}
SGLang: {"query", "items", "label_token_ids", "apply_softmax", "item_first", "model"} (+ "deadline_ms"),
        answered in SGLang's shape: {"scores": [[...]], "model", "usage", "object": "scoring"}.
Both are declared in gateway/api/types.py, with their rules across fields, and decoded by msgspec
(gateway/api/decoding.py), which checks those rules; this module tells the two shapes apart and applies
the query and the prompt template.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.api.decoding import BodyDecoder
from gateway.errors import ApiError
from gateway.api.types import DEFAULT_OUTPUT, LABEL_OUTPUTS, ScoreRequest, SglangScoreRequest
from gateway.limits import Limits
from shared.prefix import template_fields


@dataclass(frozen=True)
class ScoreSpec:
    """A validated scoring request, before tokenization."""

    samples: list[str | list[int]]
    """Per sample: the text to tokenize (template applied) or the caller's token ids."""
    labels: list[str] | None
    """Label strings, each to map to exactly one token; None when ids were given."""
    label_token_ids: list[int]
    output: str
    """probs | logprobs | logits | topk | embedding | vocab_probs (SGLang without softmax)."""
    top_k: int
    deadline_ms: int | None
    dialect: str
    """boundserve | sglang: which response shape to answer with."""
    model: str | None = None
    prompt_logprobs: int | None = None
    """Per-token prompt log-probs with this many top tokens per position (None: not asked; /v1/completions)."""
    priority: int | None = None
    """The body's priority (None: not given)."""


class _Shape(msgspec.Struct):
    """Just enough of a body to tell the two shapes apart (other fields are skipped, not read)."""

    samples: msgspec.Raw = msgspec.Raw()
    items: msgspec.Raw = msgspec.Raw()


_SHAPE = msgspec.json.Decoder(_Shape)


def parse_score(raw: bytes, limits: Limits) -> ScoreSpec:
    """Decode a /v1/score body of either shape; raises ApiError (400/404/413) naming the field."""
    if not limits.score_enabled:
        raise ApiError("not_found", "this deployment serves no scoring (score.enabled is false in its config, "
                                    "or its artifacts hold no score node)")
    try:
        shape = _SHAPE.decode(raw)
    except (msgspec.DecodeError, RecursionError):  # not an object, not JSON, too deep: the decoder says which
        return OURS.decode(raw, limits)
    if shape.items and not shape.samples:
        return SGLANG.decode(raw, limits)
    if not shape.samples:
        raise invalid("missing required field $.samples (or $.items, for SGLang's /v1/score schema)")
    return OURS.decode(raw, limits)


def invalid(message: str) -> ApiError:
    return ApiError("invalid_request", message)


def _ours(body: Any, limits: Limits) -> ScoreSpec:
    if limits.prompt_template is not None and "query" not in template_fields(limits.prompt_template):
        sent = "$.query" if body.query is not None else next(
            (f"$.samples[{i}].query" for i, item in enumerate(body.samples)
             if not isinstance(item, str) and item.query is not None), None)
        if sent is not None:
            raise invalid(f"{sent}: this deployment's prompt template {limits.prompt_template!r} has no {{query}}, "
                          "so a query would be dropped; put it into the text instead")
    output = body.output or DEFAULT_OUTPUT
    query = body.query or ""
    samples = [_sample(item, query, limits) for item in body.samples]
    labels = body.labels if output in LABEL_OUTPUTS else None
    label_ids = body.label_token_ids if output in LABEL_OUTPUTS and body.label_token_ids is not None else []
    top_k = (body.top_k or min(5, limits.bounds.max_top_k)) if output == "topk" else 0
    return ScoreSpec(samples, labels, label_ids, output, top_k, body.deadline_ms, "boundserve", priority=body.priority)


def _sample(item: Any, query: str, limits: Limits) -> str | list[int]:
    if isinstance(item, str):
        return _apply_template(item, query, limits)
    if item.input_ids is not None:
        return item.input_ids
    return _apply_template(item.text, query if item.query is None else item.query, limits)


def _apply_template(text: str, query: str, limits: Limits) -> str:
    if limits.prompt_template is None:
        return query + text if query else text
    return limits.prompt_template.format_map({"text": text, "query": query})


def _sglang(body: Any, limits: Limits) -> ScoreSpec:
    items = [body.items] if isinstance(body.items, str) else body.items
    query = body.query
    if query is None:
        query = "" if isinstance(items[0], str) else []
    join = (lambda item: item + query) if body.item_first else (lambda item: query + item)
    output = "probs" if body.apply_softmax else "vocab_probs"
    model = "default" if body.model is None else body.model
    return ScoreSpec([join(item) for item in items], None, body.label_token_ids, output, 0, body.deadline_ms,
                     "sglang", model, priority=body.priority)


OURS = BodyDecoder(ScoreRequest, _ours)
SGLANG = BodyDecoder(SglangScoreRequest, _sglang)
