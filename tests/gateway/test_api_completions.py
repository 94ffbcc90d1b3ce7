"""POST /v1/completions called by the real `openai` SDK against a live gateway and a real worker
serving the compiled demo model: prompt log-probs equal transformers' log_softmax on the same
checkpoint within 1e-4 (float32), in the legacy shape lm-evaluation-harness's local-completions reads."""

from __future__ import annotations

import math

import openai
import pytest
import torch

from gateway.tokenizer import RequestTokenizer
from tests.compile.reference import load_hf
from tests.gateway.test_gateway_real_worker import real_gateway

pytestmark = pytest.mark.slow  # needs the compiled demo artifacts (built once per machine, cached)
PROMPTS = ["red running shoe for the summer", "is this relevant: blue phone case"]


def sdk(client) -> openai.AsyncOpenAI:
    """The OpenAI SDK pointed at the test server's /v1, without retries (a refusal is the answer)."""
    return openai.AsyncOpenAI(api_key="unused", base_url=str(client.make_url("/v1")), max_retries=0)


def hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    """log_softmax [L, V] at every position of one prompt, by transformers (float32)."""
    with torch.inference_mode():
        return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)


def assert_prompt_logprobs(choice, ids: list[int], expected: torch.Tensor, tokenizer: RequestTokenizer, top_n: int):
    """The choice's logprobs describe the prompt `ids` as transformers scores it (`expected` [L, V])."""
    lp = choice.logprobs
    strings = tokenizer.token_strings(ids)
    assert lp.tokens[: len(ids)] == strings
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    for position in range(1, len(ids)):
        row = expected[position - 1]
        assert math.isclose(lp.token_logprobs[position], float(row[ids[position]]), abs_tol=1e-4)
        top = torch.topk(row, top_n)
        wanted = dict(zip(tokenizer.token_strings(top.indices.tolist()), top.values.tolist()))
        wanted.setdefault(strings[position], float(row[ids[position]]))
        got = lp.top_logprobs[position]
        assert got.keys() == wanted.keys()
        assert all(math.isclose(got[k], wanted[k], abs_tol=1e-4) for k in wanted)
    offsets = [0]
    for text in strings[:-1]:
        offsets.append(offsets[-1] + len(text))
    assert lp.text_offset[: len(ids)] == offsets


async def test_echoed_prompt_logprobs_match_transformers(demo_artifacts, demo_checkpoint, tmp_path):
    tokenizer = RequestTokenizer.from_artifacts(demo_artifacts)
    hf = load_hf(demo_checkpoint)
    async with real_gateway(demo_artifacts, tmp_path) as client:
        answer = await sdk(client).completions.create(model="test", prompt=PROMPTS, echo=True, logprobs=5,
                                                      max_tokens=0)
    assert answer.object == "text_completion" and answer.model == "test"  # configs/test.toml
    assert [c.index for c in answer.choices] == [0, 1]
    token_ids = tokenizer.encode(PROMPTS)
    for choice, text, ids in zip(answer.choices, PROMPTS, token_ids):
        assert choice.text == text and choice.finish_reason == "length"
        assert len(choice.logprobs.tokens) == len(ids)
        assert_prompt_logprobs(choice, ids, hf_logprobs(hf, ids), tokenizer, 5)
    total = sum(len(ids) for ids in token_ids)
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (total, 0, total)


async def test_lm_eval_loglikelihood_request_of_token_ids(demo_artifacts, demo_checkpoint, tmp_path):
    """lm-evaluation-harness's local-completions loglikelihood body: token-id prompts, echo, logprobs 1,
    max_tokens 1, temperature 0, a seed; it sums token_logprobs[ctxlen:-1] and checks greediness
    against top_logprobs. The extra token is the greedy next one, with its own log-prob."""
    tokenizer = RequestTokenizer.from_artifacts(demo_artifacts)
    hf = load_hf(demo_checkpoint)
    prompts = [ids[:9] for ids in tokenizer.encode(PROMPTS)] + [[7]]  # a one-token prompt too
    async with real_gateway(demo_artifacts, tmp_path) as client:
        answer = await sdk(client).completions.create(model="test", prompt=prompts, echo=True, logprobs=1,
                                                      max_tokens=1, temperature=0, seed=1234)
    for choice, ids in zip(answer.choices, prompts):
        expected = hf_logprobs(hf, ids)  # [L, V]
        assert_prompt_logprobs(choice, ids, expected, tokenizer, 1)
        greedy = int(expected[-1].argmax())
        (greedy_text,) = tokenizer.token_strings([greedy])
        assert len(choice.logprobs.tokens) == len(ids) + 1
        assert choice.logprobs.tokens[-1] == greedy_text
        assert math.isclose(choice.logprobs.token_logprobs[-1], float(expected[-1, greedy]), abs_tol=1e-4)
        assert choice.logprobs.top_logprobs[-1].keys() == {greedy_text}
        assert choice.text == tokenizer.decode_batch([ids])[0] + greedy_text
    assert answer.usage.completion_tokens == len(prompts)


async def test_greedy_tokens_without_echo_are_the_n_most_likely(demo_artifacts, demo_checkpoint, tmp_path):
    tokenizer = RequestTokenizer.from_artifacts(demo_artifacts)
    hf = load_hf(demo_checkpoint)
    async with real_gateway(demo_artifacts, tmp_path) as client:
        answer = await sdk(client).completions.create(model="test", prompt=PROMPTS[0], max_tokens=1, n=3,
                                                      logprobs=2)
    ids = tokenizer.encode(PROMPTS[:1])[0]
    top = torch.topk(hf_logprobs(hf, ids)[-1], 3)
    assert [c.logprobs.tokens for c in answer.choices] == [[t] for t in tokenizer.token_strings(top.indices.tolist())]
    assert [c.text for c in answer.choices] == tokenizer.token_strings(top.indices.tolist())
    for choice, value in zip(answer.choices, top.values.tolist()):
        assert math.isclose(choice.logprobs.token_logprobs[0], value, abs_tol=1e-4)
        assert choice.logprobs.text_offset == [len(PROMPTS[0])]
    assert answer.usage.completion_tokens == 3


async def test_refusals_reach_the_sdk_as_its_errors(demo_artifacts, tmp_path):
    """A refusal is the SDK's own exception with the gateway's message (one real-stack check; every
    rejection path is tested on its own in test_api_completions_rejections.py)."""
    async with real_gateway(demo_artifacts, tmp_path) as client:
        with pytest.raises(openai.BadRequestError, match="temperature"):
            await sdk(client).completions.create(model="test", prompt="x", max_tokens=1, temperature=0.8)
        with pytest.raises(openai.NotFoundError, match="beam search"):
            await sdk(client).completions.create(model="test", prompt="x", max_tokens=5)
