"""The /v1/completions pipeline (gateway/api/completions.py says what it serves): max_tokens 0 and 1
run on the scoring path (gateway/scoring.py: per-token prompt log-probs, the last token's top-k),
max_tokens > 1 on the beam path (gateway/generation.py), one beam request per prompt.

Each answer is OpenAI's legacy shape: per choice its text (the prompt first when echoed), and with
`logprobs` the tokens as decoded one by one, their log-probs (null for a prompt's first token), the
most likely tokens at each position with the chosen one added, and character offsets from the start
of the prompt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time

import numpy as np

from gateway.api.completions import (CompletionAnswer, CompletionChoice, CompletionSpec, CompletionUsage,
                                     Logprobs)
from gateway.api.generate import GenerateSpec
from gateway.api.score import ScoreSpec
from gateway.generation import GenerateService
from gateway.scoring import ScoreService, joined
from gateway.tokenizer import RequestTokenizer
from shared.protocol import ScoreResult
from shared.request_ids import chunk_id


class CompletionService:
    """Answers CompletionSpecs with the scoring and beam services."""

    def __init__(self, scoring: ScoreService, generation: GenerateService, tokenizer: RequestTokenizer) -> None:
        self._scoring = scoring
        self._generation = generation
        self._tokenizer = tokenizer

    async def complete(self, spec: CompletionSpec, model: str, request_id: str, deadline: float,
                       priority: int = 0) -> CompletionAnswer:
        """model: the served model's name, which the answer carries (gateway/api/reranking.served_model)."""
        spec = dataclasses.replace(spec, model=model)
        if spec.max_tokens > 1:
            return await self._beams(spec, request_id, deadline, priority)
        if spec.max_tokens == 0 and not (spec.echo and spec.logprobs is not None):
            return self._echoed(spec, request_id, self._tokenizer.encode(spec.prompts))  # nothing to compute
        prompt_logprobs = spec.logprobs if spec.echo and spec.logprobs is not None else None
        top_k = max(spec.best_of, spec.logprobs or 0) if spec.max_tokens else 0
        score = ScoreSpec(spec.prompts, None, [], "topk", top_k, spec.deadline_ms, "openai",
                          prompt_logprobs=prompt_logprobs)
        return await self._scoring.score(score, request_id, deadline,
                                         answer=functools.partial(self._scored, spec, request_id), priority=priority)

    def _echoed(self, spec: CompletionSpec, request_id: str, token_ids: list[list[int]]) -> CompletionAnswer:
        """max_tokens 0 without prompt log-probs: the prompt itself (echo) or nothing, computed nowhere."""
        choices = []
        for index, ids in enumerate(token_ids):
            text = self._prompt_text(spec.prompts[index], ids) if spec.echo else ""
            logprobs = None
            if spec.logprobs is not None:  # echo false: no tokens to describe
                logprobs = Logprobs([], [], [], [])
            choices.append(CompletionChoice(text, index, logprobs, "length"))
        return _answer(spec, request_id, choices, token_ids)

    def _scored(self, spec: CompletionSpec, request_id: str, token_ids: list[list[int]],
                results: list[ScoreResult]) -> CompletionAnswer:
        """The answer from the scoring jobs' results (in sample order across chunks)."""
        rows = joined([r.arrays() for r in results])  # last position: topk_ids, topk_logprobs [S, k]
        positions = joined([r.token_arrays() for r in results])  # token_logprobs [P], token_topk_* [P, n]
        choices, start = [], 0
        for index, ids in enumerate(token_ids):
            prompt_text = self._prompt_text(spec.prompts[index], ids)
            prompt = _Tokens(prompt_text if spec.echo else "", [], [], [])
            if spec.echo:
                count = len(ids) - 1
                part = {name: array[start: start + count] for name, array in positions.items()}
                start += count
                prompt = self._prompt_tokens(prompt.text, ids, part, spec.logprobs)
            for j in range(spec.n if spec.max_tokens else 1):
                tokens = prompt
                if spec.max_tokens:  # the j-th most likely next token
                    tokens = prompt.then(self._pick(rows["topk_ids"][index], rows["topk_logprobs"][index], j,
                                                    spec.logprobs))
                logprobs = None if spec.logprobs is None else tokens.logprobs(0 if spec.echo else len(prompt_text))
                choices.append(CompletionChoice(tokens.text, len(choices), logprobs, "length"))
        return _answer(spec, request_id, choices, token_ids)

    def _prompt_tokens(self, text: str, ids: list[int], part: dict[str, np.ndarray], top_n: int | None) -> _Tokens:
        strings = self._tokenizer.token_strings(ids)
        if top_n is None:
            return _Tokens(text, strings, [None] * len(ids), [None] * len(ids))
        chosen = [float(v) for v in part.get("token_logprobs", ())]  # [L - 1]; none for a one-token prompt
        tops = [self._top(row_ids[:top_n], row_values[:top_n], strings[i + 1], chosen[i])
                for i, (row_ids, row_values) in enumerate(zip(part.get("token_topk_ids", ()),
                                                              part.get("token_topk_logprobs", ())))]
        return _Tokens(text, strings, [None, *chosen], [None, *tops])

    def _pick(self, ids: np.ndarray, values: np.ndarray, j: int, top_n: int | None) -> tuple[str, float, dict | None]:
        """The j-th most likely next token: its text, its log-prob, the top_n there (with it)."""
        (text,) = self._tokenizer.token_strings([int(ids[j])])
        top = None if top_n is None else self._top(ids[:top_n], values[:top_n], text, float(values[j]))
        return text, float(values[j]), top

    def _top(self, ids: np.ndarray, values: np.ndarray, chosen: str, chosen_logprob: float) -> dict[str, float]:
        """{token text: log-prob} of the most likely tokens, and the chosen one (OpenAI: up to N + 1)."""
        top = dict(zip(self._tokenizer.token_strings(ids), (float(v) for v in values)))
        top.setdefault(chosen, chosen_logprob)
        return top

    def _prompt_text(self, prompt: str | list[int], ids: list[int]) -> str:
        return prompt if isinstance(prompt, str) else self._tokenizer.decode_batch([ids])[0]

    async def _beams(self, spec: CompletionSpec, request_id: str, deadline: float, priority: int) -> CompletionAnswer:
        """n of best_of beams per prompt, one beam request each (their wire ids those of chunks)."""
        answers = await asyncio.gather(*(
            self._generation.generate(GenerateSpec(prompt, spec.best_of, spec.max_tokens, spec.n, spec.deadline_ms),
                                      chunk_id(request_id, index), deadline, priority)
            for index, prompt in enumerate(spec.prompts)))
        candidates = [candidate for answer in answers for candidate in answer.candidates]  # prompt by prompt
        choices = [CompletionChoice(c.text, index, None, "length" if len(c.token_ids) >= spec.max_tokens else "stop")
                   for index, c in enumerate(candidates)]
        prompt_tokens = sum(a.usage.prompt_tokens for a in answers)
        completion_tokens = sum(a.usage.completion_tokens for a in answers)
        return CompletionAnswer(id=request_id, created=int(time.time()), model=spec.model, choices=choices,
                                usage=CompletionUsage(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens))


class _Tokens:
    """A choice's text and its tokens so far: their strings, log-probs and top tokens."""

    def __init__(self, text: str, strings: list[str], logprobs: list[float | None], tops: list[dict | None]) -> None:
        self.text, self.strings, self.values, self.tops = text, strings, logprobs, tops

    def then(self, token: tuple[str, float, dict | None]) -> _Tokens:
        text, value, top = token
        return _Tokens(self.text + text, [*self.strings, text], [*self.values, value], [*self.tops, top])

    def logprobs(self, first_offset: int) -> Logprobs:
        """first_offset: the character offset of the first token (the prompt's length when not echoed)."""
        offsets = np.cumsum([first_offset, *(len(s) for s in self.strings[:-1])]).tolist() if self.strings else []
        return Logprobs(self.strings, self.values, self.tops, offsets)


def _answer(spec: CompletionSpec, request_id: str, choices: list[CompletionChoice],
            token_ids: list[list[int]]) -> CompletionAnswer:
    prompt_tokens = sum(len(ids) for ids in token_ids)
    completion_tokens = len(token_ids) * spec.n * spec.max_tokens  # max_tokens 0 or 1 here: always reached
    return CompletionAnswer(id=request_id, created=int(time.time()), model=spec.model, choices=choices,
                            usage=CompletionUsage(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens))
