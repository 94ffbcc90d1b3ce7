"""The /v1/score pipeline: labels -> tokenize -> share a prefix -> split into batch-sized jobs -> admit
-> queue -> answer.

Samples that share a long enough token prefix are sent as that prefix plus suffixes
(gateway/sharing.py). A request with more samples or tokens than one compiled batch holds is split
into chunks that each fit (each carrying the shared prefix again); the answer joins them back in
order, so nothing the caller sent is dropped. `usage` reports the tokens submitted and, as
OpenAI's prompt_tokens_details.cached_tokens, those the workers reused instead of computing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any

import numpy as np

from gateway import sharing
from gateway.admission import Admission
from gateway.batcher import Batcher
from gateway.errors import ApiError
from gateway.api.answers import ScoreAnswer, ScoreUsage, SglangScoreAnswer, SglangUsage, TokenDetails, TopK
from gateway.job import Job, new_job
from gateway.request_path import RequestPath
from gateway.limits import Limits
from gateway.metrics import Metrics
from gateway.api.score import ScoreSpec
from gateway.tokenizer import RequestTokenizer
from shared.bounds import score_problem
from shared.request_ids import chunk_id
from shared.protocol import ScoreResult
from shared.work import NO_REUSE, Reuse, WorkSize


class ScoreService:
    """Runs validated ScoreSpecs through tokenization, admission and the score batcher."""

    def __init__(self, tokenizer: RequestTokenizer, limits: Limits, batcher: Batcher, admission: Admission,
                 metrics: Metrics, executor: Executor | None, offload_chars: int,
                 reuse_for: Callable[[int | None], Reuse] | None = None) -> None:
        self._tokenizer = tokenizer
        self._limits = limits
        self._metrics = metrics
        self._path = RequestPath(batcher, admission, metrics)
        self._executor = executor
        self._offload_chars = offload_chars
        self._reuse_for = reuse_for or (lambda key: limits.static_prefix)
        """What a job whose prefix has this key is expected to reuse where it will run (the pool's
        routing and its workers' held prefixes): admission and the queue count what is computed."""
        self._active = 0  # requests of this service in progress: more than one means the loop is busy

    async def score(self, spec: ScoreSpec, request_id: str, deadline: float,
                    answer: Callable[[list[list[int]], list[ScoreResult]], Any] | None = None,
                    priority: int = 0) -> ScoreAnswer | SglangScoreAnswer | Any:
        """The answer to `spec`; with `answer`, answer(token ids per sample, the jobs' results in order) in
        place of /v1/score's (another route's shape: gateway/completions.py)."""
        self._active += 1
        try:
            return await self._score(spec, request_id, deadline, answer, priority)
        finally:
            self._active -= 1

    async def _score(self, spec: ScoreSpec, request_id: str, deadline: float, answer=None, priority: int = 0):
        request = self._path.arrive(request_id, deadline, len(spec.samples), priority)
        label_ids = tuple(self._tokenizer.label_ids(spec.labels) if spec.labels else spec.label_token_ids)
        started = self._path.now()
        token_ids = await self._tokenizer.encode_async(spec.samples, self._executor, self._offload_chars,
                                                       busy=self._active > 1)
        self._path.tokenized(request, started)
        self._check_lengths(token_ids)
        jobs = self._jobs(request_id, token_ids, label_ids, spec, deadline, priority)
        tokens_per_item = sum(j.latency_tokens for j in jobs) / sum(j.batch_items for j in jobs)
        results = await self._path.run(request, jobs, tokens_per_item)
        prompt_tokens, cached_tokens = sum(j.work.prompt_tokens for j in jobs), sum(r.cached_tokens for r in results)
        self._metrics.count_score_tokens(prompt_tokens, cached_tokens, shared=jobs[0].prefix_len > 0)
        if answer is not None:
            return answer(token_ids, results)
        arrays = joined([r.arrays() for r in results])
        return _answer(spec, label_ids, arrays, (prompt_tokens, cached_tokens), request_id, self._tokenizer)

    def _check_lengths(self, token_ids: list[list[int]]) -> None:
        for i, ids in enumerate(token_ids):
            problem = score_problem(self._limits.bounds, WorkSize.of([ids]).shape())
            if problem:
                raise ApiError("too_large", f"{problem.message(part=f'sample {i}', name_bound=False)} "
                                            "(nothing was truncated)")
            if not ids:
                raise ApiError("invalid_request", f"sample {i} tokenizes to no tokens; every sample needs one")

    def _jobs(self, request_id: str, token_ids: list[list[int]], label_ids: tuple[int, ...], spec: ScoreSpec,
              deadline: float, priority: int) -> list[Job]:
        limits, bounds = self._limits, self._limits.bounds
        tokens_asked = spec.prompt_logprobs is not None  # per-token log-probs: every sample whole, nothing reused
        prefix_len = 0 if tokens_asked else sharing.shared_prefix_len(token_ids, limits.sharing)
        chunks = sharing.chunks(token_ids, prefix_len, bounds.max_samples_per_batch, bounds.max_tokens_per_batch)
        jobs = [
            new_job(request_id if len(chunks) == 1 else chunk_id(request_id, k), "score", deadline, chunk,
                label_ids=label_ids, top_k=spec.top_k, return_hidden=spec.output == "embedding",
                prefix_len=prefix_len, prompt_logprobs=spec.prompt_logprobs, reuse=limits.static_prefix,
                priority=priority)
            for k, chunk in enumerate(chunks)
        ]
        reuse = NO_REUSE if tokens_asked else self._reuse_for(jobs[0].prefix_key)  # every chunk: the same prefix
        for job in jobs:
            job.resize(reuse)
        return jobs


def joined(parts: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The arrays of a request's chunks' results, concatenated along their first axis (samples or
    positions); parts without arrays (a chunk that asked for none) are skipped."""
    parts = [part for part in parts if part]
    if len(parts) <= 1:
        return parts[0] if parts else {}
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def _answer(spec: ScoreSpec, label_ids: tuple[int, ...], arrays: dict[str, np.ndarray], tokens: tuple[int, int],
            request_id: str, tokenizer: RequestTokenizer) -> ScoreAnswer | SglangScoreAnswer:
    """The response body; `tokens` = (prompt tokens submitted, tokens the workers reused)."""
    prompt, cached = tokens
    details = TokenDetails(cached)
    if spec.dialect == "sglang":
        scores = arrays["label_probs"] if spec.output == "probs" else np.exp(arrays["label_logprobs"])
        return SglangScoreAnswer(scores=scores, model=spec.model, usage=SglangUsage(prompt, 0, prompt, details))
    answer = ScoreAnswer(id=request_id, output=spec.output, usage=ScoreUsage(len(spec.samples), prompt, details))
    if spec.output in ("probs", "logprobs", "logits"):
        answer.label_token_ids = list(label_ids)
        answer.scores = arrays[{"probs": "label_probs", "logprobs": "label_logprobs",
                                "logits": "label_logits"}[spec.output]]
    elif spec.output == "topk":
        ids = np.ascontiguousarray(arrays["topk_ids"][:, : spec.top_k])
        logprobs = np.ascontiguousarray(arrays["topk_logprobs"][:, : spec.top_k])
        answer.topk = TopK(ids, logprobs, [tokenizer.token_texts(row) for row in ids])
    else:
        answer.embeddings = arrays["hidden"]
        if "head" in arrays:
            answer.head = arrays["head"]
    return answer
