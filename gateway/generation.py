"""The /v1/generate pipeline: tokenize the prompt -> admit -> beam queue -> candidates with text."""

from __future__ import annotations

from gateway.admission import Admission
from gateway.batcher import Batcher
from gateway.errors import ApiError
from gateway.api.generate import GenerateSpec
from gateway.api.answers import Candidate, GenerateAnswer, GenerateUsage
from gateway.job import new_job
from gateway.request_path import RequestPath
from gateway.limits import Limits
from gateway.metrics import Metrics
from gateway.tokenizer import RequestTokenizer
from shared.bounds import BeamShape, beam_problem


class GenerateService:
    """Runs validated GenerateSpecs through tokenization, admission and the beam batcher."""

    def __init__(self, tokenizer: RequestTokenizer, limits: Limits, batcher: Batcher, admission: Admission,
                 metrics: Metrics) -> None:
        self._tokenizer = tokenizer
        self._limits = limits
        self._path = RequestPath(batcher, admission, metrics)

    async def generate(self, spec: GenerateSpec, request_id: str, deadline: float, priority: int = 0) -> GenerateAnswer:
        request = self._path.arrive(request_id, deadline, spec.beam_width, priority)
        started = self._path.now()
        prompt = self._tokenizer.encode([spec.prompt])[0]
        self._path.tokenized(request, started, tokens_per_item=len(prompt))
        problem = beam_problem(self._limits.bounds, BeamShape(1, len(prompt), spec.beam_width, spec.max_new_tokens))
        if problem:
            words = problem.message("the request", "the prompt", name_bound=False)
            raise ApiError("too_large", f"{words} (nothing was truncated)")
        if not prompt:
            raise ApiError("invalid_request", "the prompt tokenizes to no tokens")
        key = (spec.beam_width, spec.max_new_tokens, spec.num_return_sequences)
        job = new_job(request_id, "beam", deadline, [prompt], beam_key=key, priority=priority,
                      catalog=spec.catalog)
        (result,) = await self._path.run(request, [job])
        answer = self._answer(request_id, spec, len(prompt), result.arrays(spec.num_return_sequences))
        answer.catalog_version = result.catalog_version or None
        return answer

    def _answer(self, request_id: str, spec: GenerateSpec, prompt_tokens: int, arrays: dict) -> GenerateAnswer:
        sequences = [row[: int(n)].tolist() for row, n in zip(arrays["sequences"], arrays["lengths"])]
        texts = self._tokenizer.decode_batch(sequences)
        candidates = [Candidate(text, ids, float(score))
                      for text, ids, score in zip(texts, sequences, arrays["scores"])]
        return GenerateAnswer(id=request_id, candidates=candidates,
                              usage=GenerateUsage(prompt_tokens, sum(len(s) for s in sequences)))
