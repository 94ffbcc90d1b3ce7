"""Shared-prefix scoring through the real HTTP stack and a stand-in worker that answers from whole samples.

The gateway finds the longest common token prefix of a request's samples and sends it once
(ScoreRequest.prefix_len) when it is long enough and within its bound; the stand-in rebuilds every
sample as prefix + suffix before answering, so a wrong split changes the answers. Usage and
/metrics report the tokens submitted and those reused; budgets and batch packing count a shared
prefix once, latency predictions also leave out the static prefix the node reuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading

import msgspec

import numpy as np
import pytest

from gateway.job import new_job, wire_ids
from shared import protocol
from shared.config import ScoreConfig
from shared.work import StaticPrefix
from shared.prefix import longest_common_prefix
from tests.gateway.conftest import endpoint, start_stack
from tests.gateway.metrics_page import sample
from loadgen.standin_worker import (BOUNDS, StandInWorker, expected_label_logits, expected_logprobs,
                                   standin_manifest)
from shared.manifest import BeamNodeFacts, ScoreNodeFacts

PREFIX = list(range(10, 30))  # 20 tokens
STATIC = (7, 8, 9)


@contextlib.asynccontextmanager
async def serving(request_tokenizer, bounds=None, static=(), gate=None, **stack_options):
    """A gateway and one stand-in worker; `bounds` replace some of BOUNDS, `static` is the static prefix."""
    bounds = dataclasses.replace(BOUNDS, **(bounds or {}))  # one build: the worker's bounds are the gateway's
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, static_prefix_ids=static,
                           gate=gate, bounds=bounds).start()
    manifest = msgspec.structs.replace(standin_manifest(request_tokenizer.vocab_size, score=ScoreNodeFacts(
        static_prefix_ids=tuple(static)), beam=BeamNodeFacts()), bounds=bounds)
    stack = await start_stack(request_tokenizer, [worker], manifest=manifest, **stack_options)
    try:
        yield stack, worker
    finally:
        await stack.client.close()
        worker.stop()


def ids_body(samples, labels=(1, 2), **extra):
    return {"samples": [{"input_ids": s} for s in samples], "label_token_ids": list(labels), "output": "logits",
            **extra}


def want_logits(samples, labels=(1, 2)):
    return np.stack([expected_label_logits(s, list(labels)) for s in samples])


def wire_samples(request: protocol.ScoreRequest) -> list[list[int]]:
    """The whole samples a ScoreRequest carries (prefix + each suffix)."""
    flat = protocol.unpack_ids(request.input_ids, "int32").tolist()
    ends = np.cumsum([request.prefix_len, *request.sample_lens]).tolist()
    return [flat[: request.prefix_len] + flat[a:b] for a, b in zip(ends[:-1], ends[1:])]


async def until(condition, timeout_s: float = 5.0) -> None:
    """Wait for a state change in the stack (polled; nothing is ordered by sleeping)."""
    end = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < end, "the condition never held"
        await asyncio.sleep(0.005)


async def test_a_shared_prefix_goes_once_and_answers_equal_the_whole_samples(request_tokenizer):
    suffixes = [[1, 2, 3], [4], [], [5, 6, 7, 8, 9]]  # the third sample is the prefix itself
    samples = [PREFIX + s for s in suffixes]
    async with serving(request_tokenizer) as (stack, worker):
        status, answer, _ = await stack.post("/v1/score", ids_body(samples))
        assert status == 200, answer
        (sent,) = worker.requests
        assert sent.prefix_len == 20 and sent.sample_lens == (3, 1, 0, 5)
        assert protocol.unpack_ids(sent.input_ids, "int32").tolist() == PREFIX + [t for s in suffixes for t in s]
        np.testing.assert_allclose(answer["scores"], want_logits(samples), rtol=1e-6)
        assert answer["usage"] == {"samples": 4, "prompt_tokens": 89, "prompt_tokens_details": {"cached_tokens": 60}}
        metrics = await (await stack.client.get("/metrics")).text()
    assert sample(metrics, "boundserve_score_prompt_tokens_total") == 89
    assert sample(metrics, "boundserve_score_cached_tokens_total") == 60
    assert sample(metrics, "boundserve_score_shared_requests_total", shared="true") == 1


@pytest.mark.parametrize("samples, bounds", [
    ([[1, 2, 3, 4, 5], [1, 2, 3, 9]], None),  # 3 common tokens: under min_shared_prefix_tokens (4)
    ([PREFIX], None),  # one sample: nothing to share with
    ([[1, 2], [3, 4], [3, 4, 5]], None),  # nothing common to all samples
    ([PREFIX + [1], PREFIX + [2]], {"max_prefix_tokens": 8}),  # 20 common tokens, over the bound: never cut
], ids=["under-threshold", "one-sample", "nothing-shared", "over-the-bound"])
async def test_requests_that_should_not_share_go_whole(request_tokenizer, samples, bounds):
    async with serving(request_tokenizer, bounds) as (stack, worker):
        status, answer, _ = await stack.post("/v1/score", ids_body(samples))
        assert status == 200, answer
        (sent,) = worker.requests
        assert sent.prefix_len == 0 and wire_samples(sent) == samples
        np.testing.assert_allclose(answer["scores"], want_logits(samples), rtol=1e-6)
        assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        metrics = await (await stack.client.get("/metrics")).text()
    assert sample(metrics, "boundserve_score_shared_requests_total", shared="false") == 1


async def test_the_threshold_is_configurable(request_tokenizer):
    samples = [[1, 2, 3, 4, 5], [1, 2, 3, 9]]
    async with serving(request_tokenizer, score=ScoreConfig(min_shared_prefix_tokens=2)) as (stack, worker):
        status, answer, _ = await stack.post("/v1/score", ids_body(samples))
        assert status == 200, answer
        assert worker.requests[0].prefix_len == 3 and answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 3
        np.testing.assert_allclose(answer["scores"], want_logits(samples), rtol=1e-6)


@pytest.mark.parametrize("count, bounds, chunk_sizes", [
    (8, {"max_tokens_per_batch": 64, "max_tokens_per_sample": 64}, [4, 4]),  # 20 + 4 x 10 computed tokens fit
    (40, None, [16, 16, 8]),  # 16 samples per compiled batch
], ids=["by-tokens", "by-samples"])
async def test_a_request_over_one_batch_is_chunked_and_every_chunk_carries_the_prefix(request_tokenizer, count,
                                                                                       bounds, chunk_sizes):
    samples = [PREFIX + [100 + i] * 10 for i in range(count)]
    async with serving(request_tokenizer, bounds) as (stack, worker):
        status, answer, _ = await stack.post("/v1/score", ids_body(samples))
        assert status == 200, answer
        chunks = sorted(worker.requests, key=lambda r: int(r.request_id.rsplit("#", 1)[1]))
        assert [len(r.sample_lens) for r in chunks] == chunk_sizes
        assert all(r.prefix_len == 20 for r in chunks)
        assert [s for r in chunks for s in wire_samples(r)] == samples
        np.testing.assert_allclose(answer["scores"], want_logits(samples), rtol=1e-6)
        cached = sum(20 * (n - 1) for n in chunk_sizes)  # each chunk computes the prefix once
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == cached


async def test_the_static_prefix_is_reused_where_samples_start_with_it(request_tokenizer):
    unshared = [[7, 8, 9, 1, 2], [7, 8, 9, 4], [1, 7, 8, 9], [7, 8, 9]]  # the first two start with it, and go on
    shared = [[7, 8, 9, 5, 5, 5, 1], [7, 8, 9, 5, 5, 5, 2, 3], [7, 8, 9, 5, 5, 5]]
    packed = [[7, 8, 9, i, i, i, i, i, i, i, i] for i in range(20, 24)]  # 11 tokens each, 8 computed
    async with serving(request_tokenizer, {"max_tokens_per_batch": 32, "max_tokens_per_sample": 32},
                       STATIC) as (stack, worker):
        # the batch bound counts tokens sent, static ones too (as the node does): `packed` needs two chunks
        for samples, prefix_lens, cached in ((unshared, [0], 6), (shared, [6], 2 * 6 + 3), (packed, [0, 0], 12)):
            worker.requests.clear()
            status, answer, _ = await stack.post("/v1/score", ids_body(samples))
            assert status == 200, answer
            assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == cached
            np.testing.assert_allclose(answer["scores"], want_logits(samples), rtol=1e-6)
            assert [r.prefix_len for r in worker.requests] == prefix_lens


async def test_budgets_and_batches_count_a_shared_prefix_once(request_tokenizer):
    gate = threading.Event()
    async with serving(request_tokenizer, gate=gate, max_queue_tokens=50, max_inflight_batches_per_worker=1,
                       max_batch_wait_ms=0.0) as (stack, worker):
        batcher = stack.gateway.batchers["score"]
        blocker = asyncio.create_task(stack.post("/v1/score", ids_body([[1, 2]])))
        await until(lambda: len(worker.requests) == 1)  # held by the worker: the next requests queue
        shared = [PREFIX + [i, i] for i in range(4)]  # 88 tokens submitted, 28 sent
        first = asyncio.create_task(stack.post("/v1/score", ids_body(shared)))
        await until(lambda: batcher.queued_jobs == 1)
        assert batcher.queued_tokens == 28
        status, answer, _ = await stack.post("/v1/score", ids_body(shared))  # 28 + 28 > 50
        assert status == 429 and answer["error"]["code"] == "queue_full", answer
        unshared = [[40 + i, 1, 2] for i in range(6)]  # 18 tokens: 28 + 18 fit the budget
        second = asyncio.create_task(stack.post("/v1/score", ids_body(unshared)))
        await until(lambda: batcher.queued_jobs == 2)
        gate.set()
        answers = await asyncio.gather(blocker, first, second)
        assert [a[0] for a in answers] == [200, 200, 200], answers
        assert worker.batch_sizes[-1] == 10  # the shared and the unshared request went as one batch
        for samples, (_, body, _) in zip((shared, unshared), answers[1:]):
            np.testing.assert_allclose(body["scores"], want_logits(samples), rtol=1e-6)
        assert [r.prefix_len for r in worker.requests[1:]] == [20, 0]


async def test_sglang_query_and_items_share_the_query(request_tokenizer):
    query = "the user likes red running shoes and strong coffee; is this relevant: "
    items = ["blue phone case", "cheap coffee", "red shoe"]
    encoded = request_tokenizer.encode([query + item for item in items])
    common = longest_common_prefix(encoded)
    assert common >= 4  # the query's tokens, maybe less its last (a merge with the item)
    async with serving(request_tokenizer) as (stack, worker):
        body = {"query": query, "items": items, "label_token_ids": [1, 2], "apply_softmax": False}
        status, answer, _ = await stack.post("/v1/score", body)
        assert status == 200, answer
        assert worker.requests[0].prefix_len == common and wire_samples(worker.requests[0]) == encoded
        np.testing.assert_allclose(answer["scores"], np.exp(expected_logprobs(want_logits(encoded))), rtol=1e-5)
        prompt = sum(map(len, encoded))
        assert answer["usage"] == {"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": prompt,
                                   "prompt_tokens_details": {"cached_tokens": 2 * common}}
        body = {"query": [5] * 10, "items": [[1, 2], [3], [4, 4, 4]], "label_token_ids": [1], "apply_softmax": True}
        status, answer, _ = await stack.post("/v1/score", body)
        assert status == 200, answer
        assert worker.requests[1].prefix_len == 10 and answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 20
        assert np.allclose(answer["scores"], 1.0)  # one label: softmax over it


async def test_a_template_and_query_are_shared(request_tokenizer):
    template = "Judge whether the document answers the query.\nQuery: {query}\nDocument: {text}"
    texts = ["red running shoe", "blue phone case for summer", "cheap coffee"]
    encoded = request_tokenizer.encode([template.format(query="best shoes", text=t) for t in texts])
    async with serving(request_tokenizer, score=ScoreConfig(prompt_template=template)) as (stack, worker):
        body = {"samples": texts, "query": "best shoes", "label_token_ids": [1, 2], "output": "logits"}
        status, answer, _ = await stack.post("/v1/score", body)
        assert status == 200, answer
        assert worker.requests[0].prefix_len == longest_common_prefix(encoded) > 10
        assert wire_samples(worker.requests[0]) == encoded
        np.testing.assert_allclose(answer["scores"], want_logits(encoded), rtol=1e-6)


async def test_a_query_that_a_template_without_query_would_drop_is_refused(request_tokenizer):
    template = "Is this document relevant?\nDocument: {text}"
    async with serving(request_tokenizer, score=ScoreConfig(prompt_template=template)) as (stack, worker):
        own_query = {"samples": ["a", {"text": "b", "query": "shoes"}], "labels": ["yes"]}
        for body, where in (({"samples": ["a"], "query": "shoes", "labels": ["yes"]}, "$.query"),
                            (own_query, "$.samples[1].query")):
            status, answer, _ = await stack.post("/v1/score", body)
            assert status == 400, answer
            assert answer["error"]["message"].startswith(f"{where}: this deployment's prompt template"), answer
            assert "has no {query}, so a query would be dropped" in answer["error"]["message"]
        status, answer, _ = await stack.post("/v1/score", {"samples": ["a"], "labels": ["yes"]})
        assert status == 200, answer
        assert worker.requests and len(worker.requests) == 1


async def test_bad_input_is_still_refused_clearly(request_tokenizer):
    async with serving(request_tokenizer, {"max_tokens_per_sample": 32, "max_tokens_per_batch": 64}) as (stack, worker):
        status, answer, _ = await stack.post("/v1/score", ids_body([PREFIX + [1], PREFIX + [2] * 13]))
        assert status == 413 and answer["error"]["code"] == "too_large", answer
        message = answer["error"]["message"]
        assert "sample 1 is 33 tokens" in message and "nothing was truncated" in message
        status, answer, _ = await stack.post("/v1/score", ids_body([PREFIX, [1, -1]]))
        assert status == 400 and "samples[1].input_ids[1]" in answer["error"]["message"], answer
        assert worker.requests == []


async def test_job_tokens_and_wire_layout_agree_with_the_workers_count():
    rng = np.random.default_rng(0)
    for _ in range(200):
        common = rng.integers(0, 6, size=int(rng.integers(0, 8))).tolist()
        tails = [rng.integers(0, 6, size=int(rng.integers(0, 5))).tolist() for _ in range(rng.integers(1, 5))]
        samples = [common + tail for tail in tails]
        samples = [s or [1] for s in samples]
        prefix_len = int(rng.integers(0, longest_common_prefix(samples) + 1))
        static = tuple(rng.integers(0, 6, size=int(rng.integers(0, 3))).tolist())
        if rng.random() < 0.5:  # often the samples' own first tokens: the prefix may start with, or be, it
            static = tuple(samples[0][: int(rng.integers(1, 4))])
        job = new_job("r", "score", 0.0, samples, prefix_len=prefix_len, reuse=StaticPrefix(static))
        flat, suffix_lens = wire_ids(job)
        request = protocol.ScoreRequest("r", 1.0, flat.tobytes(), suffix_lens, (), 0, False, prefix_len)
        assert wire_samples(protocol.decode(protocol.encode(protocol.ScoreBatch(1, "int32", (request,)))).requests[0]) == samples
        suffixes = [s[prefix_len:] for s in samples]
        assert job.tokens == len(flat) == prefix_len + sum(map(len, suffixes))
        assert job.latency_tokens == job.work.computed_tokens
        assert job.work.prompt_tokens == sum(map(len, samples))
