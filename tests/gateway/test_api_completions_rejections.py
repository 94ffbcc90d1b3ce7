"""/v1/completions through real HTTP and ZeroMQ to the stand-in worker: one test per rejection path
(status, code, a message naming the parameter), the beam path's mapping of n / best_of / max_tokens,
and the answers that need no compute. Prompt log-probs against the compiled model:
test_api_completions.py."""

from __future__ import annotations

import pytest

from loadgen.standin_worker import BOUNDS, expected_beam
from tests.gateway.test_gateway_rejections import assert_error

BASE = {"prompt": "red shoe"}  # model absent: the served one


@pytest.mark.parametrize("extra, words", [
    ({"stream": True}, ["$.stream = true", "not supported"]),
    ({"stream_options": {"include_usage": True}}, ["$.stream_options", "not streamed"]),
    ({"stop": ["\n"]}, ["$.stop", "stop sequences"]),
    ({"stop": "."}, ["$.stop", "stop sequences"]),
    ({"suffix": "end"}, ["$.suffix"]),
    ({"logit_bias": {"5": 1.0}}, ["$.logit_bias"]),
    ({"presence_penalty": 0.5}, ["$.presence_penalty", "penalties"]),
    ({"frequency_penalty": -1}, ["$.frequency_penalty", "penalties"]),
    ({"max_tokens": 1, "temperature": 0.7}, ["$.temperature = 0.7", "does not sample"]),
    ({"max_tokens": 1, "top_p": 0.9}, ["$.top_p = 0.9", "does not sample"]),
    ({"temperature": 0.5}, ["$.temperature"]),  # max_tokens absent: OpenAI's 16 are generated
    ({"max_tokens": 0, "n": 2}, ["$.n = 2", "max_tokens 0"]),
    ({"max_tokens": 2, "n": 3, "best_of": 2}, ["$.n = 3", "best_of = 2"]),
    ({"max_tokens": 2, "echo": True}, ["echo and logprobs with max_tokens > 1"]),
    ({"max_tokens": 2, "logprobs": 1}, ["echo and logprobs with max_tokens > 1"]),
    ({"max_tokens": -1}, ["$.max_tokens", "at least 0"]),
    ({"logprobs": -1}, ["$.logprobs"]),
    ({"top_k": 5}, ["top_k"]),  # a parameter of other servers, not of this schema: never ignored
    ({"prompt": []}, ["$.prompt"]),
    ({"prompt": ["a", [1, 2]]}, ["mixes strings"]),
    ({"prompt": [1, [2]]}, ["mixes strings"]),
    ({"prompt": [[1, -2]]}, ["$.prompt[0][1] = -2"]),
    ({"prompt": [10**9]}, ["$.prompt[0]", "token id"]),
    ({"deadline_ms": 0}, ["$.deadline_ms"]),
])
async def test_refused_parameters_get_400_naming_them(stack, extra, words):
    status, body, _ = await stack.post("/v1/completions", {**BASE, **extra})
    assert_error(status, body, 400, "invalid_request", *words)


@pytest.mark.parametrize("extra, words", [
    ({"logprobs": BOUNDS.max_top_k + 1}, [f"logprobs = {BOUNDS.max_top_k + 1}", "compiled bound"]),
    ({"max_tokens": 1, "best_of": BOUNDS.max_top_k + 1}, ["best_of", "bounds.max_top_k"]),
    ({"max_tokens": BOUNDS.max_new_tokens + 1}, ["max_tokens", "bounds.max_new_tokens"]),
    ({"max_tokens": 2, "best_of": BOUNDS.max_beam_width + 1}, ["best_of", "bounds.max_beam_width"]),
    ({"prompt": "word " * (BOUNDS.max_tokens_per_sample + 1), "max_tokens": 1}, ["sample 0", "nothing was truncated"]),
])
async def test_over_the_compiled_bounds_gets_413_naming_the_bound(stack, extra, words):
    status, body, _ = await stack.post("/v1/completions", {**BASE, **extra})
    assert_error(status, body, 413, "too_large", *words)


async def test_another_model_than_the_served_one_gets_404(stack):
    served = stack.gateway.settings.config.name
    status, body, _ = await stack.post("/v1/completions", {**BASE, "model": served + "-other", "max_tokens": 1})
    assert_error(status, body, 404, "not_found", f"{served}-other", "GET /v1/models")
    status, answer, _ = await stack.post("/v1/completions", {**BASE, "model": served, "max_tokens": 0})
    assert status == 200 and answer["model"] == served


async def test_too_many_prompts_get_413(stack):
    most = stack.gateway.limits.limit("max_samples_per_request")
    status, body, _ = await stack.post("/v1/completions", {**BASE, "prompt": ["x"] * (most + 1), "max_tokens": 1})
    assert_error(status, body, 413, "too_large", "prompt holds", str(most))


async def test_beam_path_returns_n_of_best_of_beams_per_prompt(stack, request_tokenizer):
    prompts = ["red shoe", "blue phone case"]
    status, answer, _ = await stack.post("/v1/completions", {**BASE, "prompt": prompts, "max_tokens": 3, "n": 2,
                                                             "best_of": 4, "temperature": 0})
    assert status == 200, answer
    ids = request_tokenizer.encode(prompts)
    expected = [text for prompt in ids
                for text in request_tokenizer.decode_batch(expected_beam(prompt, 2, 3, request_tokenizer.vocab_size))]
    assert [c["text"] for c in answer["choices"]] == expected
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2, 3]
    assert {c["finish_reason"] for c in answer["choices"]} == {"length"} and answer["choices"][0]["logprobs"] is None
    prompt_tokens = sum(len(p) for p in ids)
    assert answer["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 12,
                               "total_tokens": prompt_tokens + 12}
    assert answer["object"] == "text_completion" and answer["model"] == stack.gateway.settings.config.name


async def test_max_tokens_0_without_logprobs_is_answered_without_compute(stack, request_tokenizer):
    """Echo alone (or nothing) needs no model: the prompt comes back as sent, nothing is queued."""
    before = len(stack.workers[0].seen_request_ids)
    status, answer, _ = await stack.post("/v1/completions", {**BASE, "echo": True, "max_tokens": 0,
                                                             "temperature": 1.0})  # nothing generated to sample
    assert status == 200, answer
    assert answer["choices"] == [{"text": "red shoe", "index": 0, "logprobs": None, "finish_reason": "length"}]
    status, answer, _ = await stack.post("/v1/completions", {**BASE, "max_tokens": 0, "logprobs": 2})
    assert answer["choices"][0]["text"] == "" and answer["choices"][0]["logprobs"]["tokens"] == []
    assert answer["usage"]["prompt_tokens"] == len(request_tokenizer.encode(["red shoe"])[0])
    assert len(stack.workers[0].seen_request_ids) == before
