"""A rerank request run through the scoring path: one prompt per document ([rerank] template with
the query and the document filled in), scored at its last token for the deployment's labels, ranked.

Every document's prompt starts with the same tokens (the template's head and the query), so the
scoring path sends and computes them once per batch: its shared prefix (gateway/sharing.py), which
the answer's usage reports as cached tokens. Deadlines, admission, bounds and splitting are the
scoring path's (gateway/scoring.py), unchanged.

Relevance (float64, from the node's float32 label log-probabilities lp): with labels (yes, no),
p = P(yes) / (P(yes) + P(no)) = sigmoid(lp_yes - lp_no); with one label, p = P(yes) = exp(lp_yes).
TEI's raw_scores answers the log-odds ln(p / (1 - p)) instead.

A document whose prompt is over the compiled max_tokens_per_sample is refused (413) unless the
request asks for truncation; then it is cut at a token boundary to fit, and the answer says which
documents were cut and from how many tokens (Cohere's meta.warnings; a header on every shape).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from msgspec import UNSET

from gateway.api.compat_answers import (ApiVersion, BilledUnits, RankedDocument, RerankAnswer, RerankMeta, RerankResult,
                                        RerankUsage, TeiRank)
from gateway.api.answers import TokenDetails
from gateway.api.rerank import RerankSpec
from gateway.api.score import ScoreSpec
from gateway.errors import ApiError
from gateway.tokenizer import RequestTokenizer

if TYPE_CHECKING:
    from gateway.wiring import Gateway

TRUNCATED_HEADER = "X-Truncated-Documents"
"""Response header on every rerank shape: the indices of the documents that were cut, comma-separated."""
CUT_TRIES = 4
"""Re-encodings allowed to fit one cut document (token merges across the document's edges may add one)."""


def served_model(gateway: Gateway, asked: str | None) -> str:
    """The configured model name; 404 when the request names another."""
    name = gateway.settings.config.name
    if asked is not None and asked != name:
        raise ApiError("not_found", f"model {asked!r} is not served here; this gateway serves {name!r} "
                                    "(GET /v1/models)")
    return name


async def rerank(gateway: Gateway, spec: RerankSpec, wire_id: str, deadline: float, truncated: list[int],
                 priority: int = 0) -> RerankAnswer | list[TeiRank]:
    """The answer to `spec` at `priority`; the indices of documents cut are appended to `truncated`."""
    model = served_model(gateway, spec.model)
    config, tokenizer = gateway.settings.config, gateway.settings.tokenizer
    label_ids = _label_ids(tokenizer, config.rerank.labels)
    prompts = Prompts(config.rerank.template, spec.query, tokenizer)
    documents, warnings = list(spec.documents), []
    if spec.max_tokens_per_doc is not None:
        for i, document in enumerate(documents):
            documents[i], count = tokenizer.cut(document, spec.max_tokens_per_doc, spec.keep_end)
            if count > spec.max_tokens_per_doc:
                truncated.append(i)
                warnings.append(f"documents[{i}] was cut from {count} to {spec.max_tokens_per_doc} tokens "
                                f"(max_tokens_per_doc)")
    ids = await tokenizer.encode_async([prompts.of(d) for d in documents], gateway.executor,
                                       config.gateway.tokenize_offload_chars)
    bound = gateway.limits.bounds.max_tokens_per_sample
    over = [i for i, sample in enumerate(ids) if len(sample) > bound]
    if over and not spec.truncate:
        raise ApiError("too_large", _over_message(spec, over, ids, bound))
    for i in over:
        documents[i], ids[i], before, after = prompts.fit(documents[i], len(ids[i]) - bound, bound, spec.keep_end, i)
        if i not in truncated:
            truncated.append(i)
        warnings.append(f"documents[{i}] was cut from {before} to {after} tokens to fit the compiled bound of {bound} "
                        "tokens per prompt (truncate)")
    score = ScoreSpec(ids, None, label_ids, "logprobs", 0, spec.deadline_ms, "boundserve")
    answer = await gateway.scoring.score(score, wire_id, deadline, priority=priority)
    probs, raw = relevance(np.asarray(answer.scores, dtype=np.float64))
    order = sorted(range(len(documents)), key=lambda i: (-probs[i], i))[: spec.top_n]
    usage = answer.usage
    if spec.shape == "tei":
        return [TeiRank(index=i, score=float(raw[i] if spec.raw_scores else probs[i]),
                        text=documents[i] if spec.return_documents else UNSET) for i in order]
    results = [RerankResult(index=i, relevance_score=float(probs[i]),
                            document=RankedDocument(documents[i]) if spec.return_documents else UNSET)
               for i in order]
    meta = RerankMeta(api_version=ApiVersion("2" if spec.shape == "cohere-v2" else "1"),
                      billed_units=BilledUnits(1, usage.prompt_tokens),
                      cached_tokens=usage.prompt_tokens_details.cached_tokens,
                      warnings=warnings if warnings else UNSET)
    return RerankAnswer(id=wire_id, model=model, results=results, meta=meta,
                        usage=RerankUsage(usage.prompt_tokens, usage.prompt_tokens,
                                          TokenDetails(usage.prompt_tokens_details.cached_tokens)))


def relevance(logprobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p, ln(p / (1 - p))) per document from its label log-probabilities [B, 1 or 2] (float64)."""
    if logprobs.shape[1] == 2:
        raw = logprobs[:, 0] - logprobs[:, 1]
        return 1.0 / (1.0 + np.exp(-raw)), raw
    probs = np.exp(logprobs[:, 0])
    with np.errstate(divide="ignore"):
        return probs, logprobs[:, 0] - np.log1p(-probs)


class Prompts:
    """One request's prompts: the template with its query, and a document cut to fit the bound."""

    def __init__(self, template: str, query: str, tokenizer: RequestTokenizer) -> None:
        self._template, self._query, self._tokenizer = template, query, tokenizer

    def of(self, document: str) -> str:
        return self._template.format_map({"query": self._query, "document": document})

    def fit(self, document: str, over: int, bound: int, keep_end: bool, index: int) -> tuple[str, list[int], int, int]:
        """`document` cut so its prompt is at most `bound` tokens (it is `over` tokens over): the cut
        text, its prompt's ids, and the document's tokens before and after."""
        _, before = self._tokenizer.cut(document, 0)
        keep = before - over
        for _ in range(CUT_TRIES):
            if keep <= 0:
                break
            cut, _ = self._tokenizer.cut(document, keep, keep_end)
            ids = self._tokenizer.encode([self.of(cut)])[0]
            if len(ids) <= bound:
                return cut, ids, before, keep
            keep -= len(ids) - bound
        alone = len(self._tokenizer.encode([self.of("")])[0])
        raise ApiError("too_large", f"documents[{index}] cannot be cut to fit: the template and the query alone take "
                                    f"{alone} tokens of the compiled bound of {bound} per prompt; shorten the query "
                                    "(nothing was computed)")


def _over_message(spec: RerankSpec, over: list[int], ids: list[list[int]], bound: int) -> str:
    field = "texts" if spec.shape == "tei" else "documents"
    shown = ", ".join(f"{field}[{i}] ({len(ids[i])} tokens)" for i in over[:5])
    more = f" and {len(over) - 5} more" if len(over) > 5 else ""
    return (f"the prompts of {shown}{more} (template, query and document) are over the compiled bound of {bound} "
            "tokens per prompt; send truncate: true to cut them to fit (nothing was truncated)")


def _label_ids(tokenizer: RequestTokenizer, labels: tuple[str, ...]) -> list[int]:
    try:
        return tokenizer.label_ids(labels)
    except ApiError as exc:
        raise ApiError("not_found", f"this deployment serves no rerank: its [rerank] labels {list(labels)} are not "
                                    f"single tokens of its tokenizer ({exc.message})") from None
