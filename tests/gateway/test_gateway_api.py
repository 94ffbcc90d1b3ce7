"""Answers through real HTTP and ZeroMQ: every output kind, both /v1/score shapes, /v1/generate, probes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.gateway.metrics_page import sample, scrape
from loadgen.standin_worker import expected_beam, expected_label_logits, expected_logprobs, expected_topk

SAMPLES = ["good shoe", "bad phone case for the summer", "cheap red coffee"]


def encode(stack, texts):
    return [e.ids for e in stack.gateway.settings.tokenizer._tokenizer.encode_batch(texts)]


def label_id(stack, label):
    return stack.gateway.settings.tokenizer.label_ids([label])[0]


@pytest.mark.parametrize("output", ["probs", "logprobs", "logits"])
async def test_label_outputs_match_the_worker_for_every_sample(stack, output):
    labels = [" yes", " no"]
    status, body, headers = await stack.post("/v1/score", {"samples": SAMPLES, "labels": labels, "output": output})
    assert status == 200, body
    ids = [label_id(stack, lab) for lab in labels]
    assert body["label_token_ids"] == ids
    for sample_ids, row in zip(encode(stack, SAMPLES), body["scores"]):
        logits = expected_label_logits(sample_ids, ids)
        want = {"logits": logits, "logprobs": expected_logprobs(logits),
                "probs": np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()}[output]
        np.testing.assert_allclose(row, want, rtol=1e-6)
    assert headers["X-Request-Id"] == body["id"]


async def test_topk_and_embedding(stack):
    status, body, _ = await stack.post("/v1/score", {"samples": SAMPLES, "output": "topk", "top_k": 3})
    assert status == 200, body
    vocab = stack.gateway.limits.vocab_size
    assert body["topk"]["token_ids"] == [expected_topk(ids, 3, vocab) for ids in encode(stack, SAMPLES)]
    assert len(body["topk"]["tokens"][0]) == 3
    status, body, _ = await stack.post("/v1/score", {"samples": SAMPLES, "output": "embedding"})
    assert status == 200, body
    assert [row[0] for row in body["embeddings"]] == [len(ids) for ids in encode(stack, SAMPLES)]


async def test_token_id_samples_and_label_token_ids(stack):
    body = {"samples": [{"input_ids": [5, 6, 7]}, {"text": "shoe", "query": "red "}], "label_token_ids": [3, 4],
            "output": "logits"}
    status, answer, _ = await stack.post("/v1/score", body)
    assert status == 200, answer
    np.testing.assert_allclose(answer["scores"][0], expected_label_logits([5, 6, 7], [3, 4]), rtol=1e-6)
    np.testing.assert_allclose(answer["scores"][1], expected_label_logits(encode(stack, ["red shoe"])[0], [3, 4]),
                               rtol=1e-6)


@pytest.mark.parametrize("apply_softmax", [True, False])
async def test_sglang_schema_answers_in_sglang_shape(stack, apply_softmax):
    body = {"query": "is this relevant: ", "items": ["red shoe", "blue phone"], "label_token_ids": [10, 11],
            "apply_softmax": apply_softmax, "model": "demo"}
    status, answer, _ = await stack.post("/v1/score", body)
    assert status == 200, answer
    assert answer["object"] == "scoring" and answer["model"] == "demo"
    texts = ["is this relevant: red shoe", "is this relevant: blue phone"]
    for ids, row in zip(encode(stack, texts), answer["scores"]):
        logits = expected_label_logits(ids, [10, 11])
        want = np.exp(logits) / np.exp(logits).sum() if apply_softmax else np.exp(expected_logprobs(logits))
        np.testing.assert_allclose(row, want, rtol=1e-5)
    assert answer["usage"]["prompt_tokens"] == sum(len(i) for i in encode(stack, texts))


async def test_sglang_token_ids_and_item_first(stack):
    body = {"query": [1, 2], "items": [[3], [4, 5]], "label_token_ids": [9], "item_first": True}
    status, answer, _ = await stack.post("/v1/score", body)
    assert status == 200, answer
    np.testing.assert_allclose(answer["scores"][1], np.exp(expected_logprobs(expected_label_logits([4, 5, 1, 2], [9]))),
                               rtol=1e-5)


async def test_a_request_larger_than_one_batch_is_split_and_joined_in_order(stack):
    samples = [{"input_ids": [i + 1] * (1 + i % 5)} for i in range(40)]  # bound: 16 samples per batch
    status, answer, _ = await stack.post("/v1/score", {"samples": samples, "label_token_ids": [2], "output": "logits"})
    assert status == 200, answer
    assert len(answer["scores"]) == 40
    for sent, row in zip(samples, answer["scores"]):
        assert math.isclose(row[0], float(expected_label_logits(sent["input_ids"], [2])[0]), rel_tol=1e-6)
    assert max(stack.workers[0].batch_sizes) <= 16


async def test_generate_returns_candidates_with_text(stack):
    status, answer, _ = await stack.post("/v1/generate", {"prompt": "red shoe", "beam_width": 4,
                                                          "max_new_tokens": 3, "num_return_sequences": 2})
    assert status == 200, answer
    prompt = encode(stack, ["red shoe"])[0]
    want = expected_beam(prompt, 2, 3, stack.gateway.limits.vocab_size)
    assert [c["token_ids"] for c in answer["candidates"]] == want
    assert all(isinstance(c["text"], str) for c in answer["candidates"])


async def test_caller_request_id_is_echoed(stack):
    status, body, headers = await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"]},
                                             headers={"X-Request-Id": "abc-123"})
    assert status == 200 and body["id"] == "abc-123" and headers["X-Request-Id"] == "abc-123"
    status, body, headers = await stack.post("/v1/score", {"samples": [""], "labels": ["yes"]},
                                             headers={"X-Request-Id": "abc-124"})
    assert status == 400 and body["error"]["request_id"] == "abc-124"


async def test_probes_metrics_and_openapi(stack):
    for path in ("/healthz", "/readyz", "/openapi.json"):
        response = await stack.client.get(path)
        assert response.status == 200, path
    await stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"]})
    text = await scrape(stack)
    assert sample(text, "boundserve_requests_total", route="/v1/score", outcome="ok") == 1
    assert sample(text, "boundserve_stage_latency_seconds_count", stage="tokenize") == 1
    assert sample(text, "boundserve_workers_ready") == 1


async def test_large_requests_are_tokenized_off_the_event_loop(request_tokenizer):
    from tests.gateway.conftest import endpoint, start_stack
    from loadgen.standin_worker import StandInWorker

    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size).start()
    stack = await start_stack(request_tokenizer, [worker], tokenize_offload_chars=10)
    try:
        status, body, _ = await stack.post("/v1/score", {"samples": SAMPLES, "labels": ["yes"], "output": "logits"})
        assert status == 200, body
        for ids, row in zip(encode(stack, SAMPLES), body["scores"]):
            np.testing.assert_allclose(row, expected_label_logits(ids, body["label_token_ids"]), rtol=1e-6)
    finally:
        await stack.client.close()
        worker.stop()
