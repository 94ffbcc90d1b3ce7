"""Shared-prefix scoring through HTTP and a real worker on the compiled demo model.

Answers of requests sent shared (ours and SGLang's shapes, text and token ids, a template with a
static header) equal transformers on the whole samples within 1e-4 (fp32), with duplicate samples,
a sample equal to the prefix, and shared and unshared requests computed in one batch; usage
reports the tokens the node reused.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import pytest_asyncio
import torch

from gateway.app import GATEWAY
from shared.config import ScoreConfig
from shared.manifest import read_manifest
from shared.prefix import longest_common_prefix
from tests.compile.reference import hf_last_token, load_hf
from tests.builds import STATIC_TEMPLATE
from tests.gateway.test_gateway_real_worker import encode, real_gateway

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]
TOLERANCE = 1e-4
LABELS = [5, 9, 300]


@pytest.fixture(scope="module")
def hf(demo_checkpoint):
    return load_hf(demo_checkpoint)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(demo_artifacts, tmp_path_factory):
    async with real_gateway(demo_artifacts, tmp_path_factory.mktemp("shared")) as client:
        yield client


def reference(hf, samples: list[list[int]], labels=LABELS) -> dict[str, np.ndarray]:
    """transformers on each whole sample: the label outputs, top-5 and the last hidden state."""
    logits, hidden = hf_last_token(hf, [torch.tensor(s) for s in samples])  # [B, V], [B, H]
    logprobs = torch.log_softmax(logits, dim=-1)
    top = torch.topk(logprobs, 5, dim=-1)
    return {"logits": logits[:, labels].numpy(), "logprobs": logprobs[:, labels].numpy(),
            "probs": torch.softmax(logits[:, labels], dim=-1).numpy(), "topk_ids": top.indices.numpy(),
            "topk_logprobs": top.values.numpy(), "hidden": hidden.numpy()}


async def post(client, body) -> dict:
    response = await client.post("/v1/score", json=body)
    answer = await response.json()
    assert response.status == 200, answer
    return answer


def close(got, want) -> None:
    np.testing.assert_allclose(np.asarray(got, dtype=np.float32), want, rtol=0, atol=TOLERANCE)


def shared_requests(client) -> int:
    return client.app[GATEWAY].metrics.value("boundserve_score_shared_requests_total", shared="true")


def score_batches(metrics) -> float:
    """Scoring batches sent so far (each one observed once in the batch-fill histogram)."""
    return metrics.value("boundserve_batch_fill_ratio_count", workload="score")


async def test_our_shape_with_token_ids_equals_transformers(client, hf):
    rng = np.random.default_rng(0)
    vocab = client.app[GATEWAY].limits.vocab_size
    prefix = rng.integers(0, vocab, 20).tolist()
    suffixes = [rng.integers(0, vocab, n).tolist() for n in (5, 1, 9)]
    samples = [prefix + s for s in (*suffixes, [], suffixes[0])]  # a sample equal to the prefix; a duplicate
    want = reference(hf, samples)
    before = shared_requests(client)
    for output in ("logits", "logprobs", "probs"):
        answer = await post(client, {"samples": [{"input_ids": s} for s in samples], "label_token_ids": LABELS,
                                     "output": output})
        close(answer["scores"], want[output])
        assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 4 * 20}
    answer = await post(client, {"samples": [{"input_ids": s} for s in samples], "output": "topk", "top_k": 5})
    assert answer["topk"]["token_ids"] == want["topk_ids"].tolist()
    close(answer["topk"]["logprobs"], want["topk_logprobs"])
    answer = await post(client, {"samples": [{"input_ids": s} for s in samples], "output": "embedding"})
    close(answer["embeddings"], want["hidden"])
    assert shared_requests(client) - before == 5


async def test_text_samples_with_a_query_equal_transformers(client, hf):
    query, texts = "the user likes trail running and strong coffee; item: ", ["red shoe", "a blue tent", "mug"]
    samples = encode(client, [query + t for t in texts])
    common = longest_common_prefix(samples)
    assert common >= 4
    answer = await post(client, {"samples": texts, "query": query, "label_token_ids": LABELS, "output": "logprobs"})
    close(answer["scores"], reference(hf, samples)["logprobs"])
    assert answer["usage"] == {"samples": 3, "prompt_tokens": sum(map(len, samples)),
                               "prompt_tokens_details": {"cached_tokens": 2 * common}}


@pytest.mark.parametrize("apply_softmax", [True, False])
async def test_sglang_query_and_items_equal_transformers(client, hf, apply_softmax):
    query, items = "the user likes trail running; is this relevant: ", ["red shoe", "blue phone", "red shoe"]
    samples = encode(client, [query + item for item in items])
    want = reference(hf, samples)
    body = {"query": query, "items": items, "label_token_ids": LABELS, "apply_softmax": apply_softmax}
    answer = await post(client, body)
    close(answer["scores"], want["probs"] if apply_softmax else np.exp(want["logprobs"]))
    common = longest_common_prefix(samples)
    assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 2 * common}
    ids_query, ids_items = samples[0][:common], [s[common:] for s in samples]  # the same samples, as token ids
    answer = await post(client, {**body, "query": ids_query, "items": ids_items})
    close(answer["scores"], want["probs"] if apply_softmax else np.exp(want["logprobs"]))


async def test_shared_and_unshared_requests_in_one_batch_equal_transformers(client, hf):
    rng = np.random.default_rng(1)
    vocab = client.app[GATEWAY].limits.vocab_size
    prefix = rng.integers(0, vocab, 24).tolist()
    shared = [prefix + rng.integers(0, vocab, n).tolist() for n in (3, 7)]
    unshared = [rng.integers(0, vocab, n).tolist() for n in (8, 2, 5)]
    # 6 x 40 tokens: fits one batch (8 samples, 256 tokens) with neither of the others, and keeps the
    # worker busy while they queue
    blocker = [rng.integers(0, vocab, 40).tolist() for _ in range(6)]
    want = {"shared": reference(hf, shared)["logits"], "unshared": reference(hf, unshared)["logits"]}
    metrics = client.app[GATEWAY].metrics
    for _ in range(5):  # the two go in one batch when both are queued before the blocker is answered
        batches = score_batches(metrics)
        answers = await asyncio.gather(*(post(client, {"samples": [{"input_ids": s} for s in samples],
                                                       "label_token_ids": LABELS, "output": "logits"})
                                         for samples in (blocker, shared, unshared)))
        close(answers[1]["scores"], want["shared"])
        close(answers[2]["scores"], want["unshared"])
        if score_batches(metrics) - batches == 2:
            return
    pytest.fail("the shared and the unshared request were never computed in one batch")


async def test_a_template_with_a_static_header_equals_transformers(static_template_artifacts, hf, tmp_path):
    score, artifacts = ScoreConfig(prompt_template=STATIC_TEMPLATE), static_template_artifacts
    static = read_manifest(artifacts).node_table().score.static_prefix_ids
    async with real_gateway(artifacts, tmp_path, score=score) as client:
        texts = ["red shoe", "a tent", "red shoe"]
        samples = encode(client, [STATIC_TEMPLATE.format(query="likes trail running", text=t) for t in texts])
        common = longest_common_prefix(samples)
        assert tuple(samples[0][: len(static)]) == static and common > len(static)
        answer = await post(client, {"samples": texts, "query": "likes trail running", "label_token_ids": LABELS,
                                     "output": "probs"})
        close(answer["scores"], reference(hf, samples)["probs"])
        assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 2 * common + len(static)}
        alone = encode(client, [STATIC_TEMPLATE.format(query="coffee", text="a mug")])
        answer = await post(client, {"samples": ["a mug"], "query": "coffee", "label_token_ids": LABELS})
        close(answer["scores"], reference(hf, alone)["probs"])
        assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": len(static)}
