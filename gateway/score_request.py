"""POST /v1/score bodies, in boundserve's own shape or SGLang's, parsed into one ScoreSpec.

Ours:   {"samples": [str | {"text", "query"?} | {"input_ids"}], "labels" | "label_token_ids",
         "output": probs|logprobs|logits|topk|embedding, "top_k", "query", "deadline_ms"}
SGLang: {"query", "items", "label_token_ids", "apply_softmax", "item_first", "model"} (+ "deadline_ms"),
        answered in SGLang's shape: {"scores": [[...]], "model", "usage", "object": "scoring"}.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway import fields as f
from gateway.limits import Limits

OUTPUTS = ("probs", "logprobs", "logits", "topk", "embedding")
LABEL_OUTPUTS = ("probs", "logprobs", "logits")
OURS_FIELDS = ("samples", "labels", "label_token_ids", "output", "top_k", "query", "deadline_ms")
SGLANG_FIELDS = ("query", "items", "label_token_ids", "apply_softmax", "item_first", "model", "deadline_ms")
MAX_TEXT_CHARS = 1 << 20


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


def parse_score(body: Any, limits: Limits) -> ScoreSpec:
    """Validate a /v1/score body of either shape; raises ApiError(invalid_request) naming the field."""
    body = f.require_object(body, "the request body")
    if "items" in body and "samples" not in body:
        return _parse_sglang(body, limits)
    if "samples" not in body:
        raise f.invalid("missing required field samples (or items, for SGLang's /v1/score schema)")
    return _parse_ours(body, limits)


def _parse_ours(body: dict[str, Any], limits: Limits) -> ScoreSpec:
    f.reject_unknown(body, OURS_FIELDS, "the request body")
    output = f.get_choice(body, "output", OUTPUTS, "probs")
    query = f.get_str(body, "query", "", MAX_TEXT_CHARS)
    samples = _samples(body.get("samples"), query, limits)
    labels, label_ids = _labels(body, output, limits)
    top_k = f.get_bounded(body, "top_k", limits.max_top_k, min(5, limits.max_top_k), "tokens")
    if body.get("top_k") is not None and output != "topk":
        raise f.invalid(f"top_k is only used with output 'topk', not {output!r}")
    deadline_ms = f.get_int(body, "deadline_ms", 1, limits.max_deadline_ms, None)
    top_k = top_k if output == "topk" else 0
    return ScoreSpec(samples, labels, label_ids, output, top_k, deadline_ms, "boundserve")


def _samples(raw: Any, query: str, limits: Limits) -> list[str | list[int]]:
    if not isinstance(raw, list) or not raw:
        raise f.invalid(f"samples must be a non-empty list, got {f.short(raw)}")
    if len(raw) > limits.max_samples_per_request:
        raise f.ApiError(
            "too_large",
            f"samples holds {len(raw)} samples; this deployment takes at most "
            f"{limits.max_samples_per_request} per request",
        )
    return [_sample(item, f"samples[{i}]", query, limits) for i, item in enumerate(raw)]


def _sample(item: Any, where: str, query: str, limits: Limits) -> str | list[int]:
    if isinstance(item, str):
        return _apply_template(item, query, limits)
    item = f.require_object(item, f"{where} (a string, {{\"text\": ...}} or {{\"input_ids\": [...]}})")
    if "input_ids" in item:
        f.reject_unknown(item, ("input_ids",), where)
        return f.token_ids(item["input_ids"], f"{where}.input_ids", limits.vocab_size)
    if "text" not in item:
        raise f.invalid(f"{where} must have a text or an input_ids field")
    f.reject_unknown(item, ("text", "query"), where)
    text = f.get_str(item, "text", max_len=MAX_TEXT_CHARS)
    return _apply_template(text, f.get_str(item, "query", query, MAX_TEXT_CHARS), limits)


def _apply_template(text: str, query: str, limits: Limits) -> str:
    if not text and not query:
        raise f.invalid("a sample's text is empty; every sample needs at least one token")
    if limits.prompt_template is None:
        return query + text if query else text
    return limits.prompt_template.format_map({"text": text, "query": query})


def _labels(body: dict[str, Any], output: str, limits: Limits) -> tuple[list[str] | None, list[int]]:
    has_labels = body.get("labels") is not None
    has_ids = body.get("label_token_ids") is not None
    if output not in LABEL_OUTPUTS:
        if has_labels or has_ids:
            raise f.invalid(f"labels and label_token_ids are not used with output {output!r}; remove them")
        return None, []
    if has_labels == has_ids:
        raise f.invalid(f"output {output!r} needs exactly one of labels (strings) or label_token_ids")
    if has_labels:
        labels = f.string_list(body["labels"], "labels", limits.max_labels)
        return labels, []
    return None, _label_ids(body["label_token_ids"], limits)


def _label_ids(raw: Any, limits: Limits) -> list[int]:
    ids = f.token_ids(raw, "label_token_ids", limits.vocab_size)
    if len(ids) > limits.max_labels:
        raise f.ApiError("too_large", f"label_token_ids holds {len(ids)} ids; at most {limits.max_labels} are compiled")
    return ids


def _parse_sglang(body: dict[str, Any], limits: Limits) -> ScoreSpec:
    f.reject_unknown(body, SGLANG_FIELDS, "the request body (SGLang /v1/score schema)")
    items = body.get("items")
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, list) or not items:
        raise f.invalid(f"items must be a string or a non-empty list, got {f.short(items)}")
    if len(items) > limits.max_samples_per_request:
        raise f.ApiError("too_large", f"items holds {len(items)} items; at most {limits.max_samples_per_request} per request")
    query = body.get("query")
    query = "" if query is None and isinstance(items[0], str) else query
    query = [] if query is None else query
    item_first = f.get_bool(body, "item_first", False)
    samples = _sglang_samples(query, items, item_first, limits)
    if body.get("label_token_ids") is None:
        raise f.invalid("missing required field label_token_ids (a non-empty list of token ids)")
    label_ids = _label_ids(body["label_token_ids"], limits)
    output = "probs" if f.get_bool(body, "apply_softmax", False) else "vocab_probs"
    model = f.get_str(body, "model", "default", 256)
    deadline_ms = f.get_int(body, "deadline_ms", 1, limits.max_deadline_ms, None)
    return ScoreSpec(samples, None, label_ids, output, 0, deadline_ms, "sglang", model)


def _sglang_samples(query: Any, items: list[Any], item_first: bool, limits: Limits) -> list[str | list[int]]:
    if isinstance(query, str):
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise f.invalid(f"items[{i}] must be a string because query is text, got {f.json_type(item)}")
        if len(query) > MAX_TEXT_CHARS or any(len(item) > MAX_TEXT_CHARS for item in items):
            raise f.invalid(f"query and each item must be at most {MAX_TEXT_CHARS} characters")
        samples = [item + query if item_first else query + item for item in items]
        for i, text in enumerate(samples):
            if not text:
                raise f.invalid(f"items[{i}] and query are both empty; every item needs at least one token")
        return samples
    query_ids = f.token_ids(query, "query", limits.vocab_size, allow_empty=True)
    samples = []
    for i, item in enumerate(items):
        ids = f.token_ids(item, f"items[{i}]", limits.vocab_size, allow_empty=bool(query_ids))
        samples.append(ids + query_ids if item_first else query_ids + ids)
    return samples
