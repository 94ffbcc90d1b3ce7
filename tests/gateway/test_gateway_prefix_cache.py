"""The worker's prefix cache seen through HTTP: a context sent again is read from the cache, its
answer unchanged, and usage.prompt_tokens_details.cached_tokens counts the cross-request hit."""

from __future__ import annotations

import numpy as np
import pytest
import pytest_asyncio

from gateway.app import GATEWAY
from tests.gateway.test_gateway_real_worker import ROOT, real_gateway

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]
LABELS = [5, 9, 300]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(demo_artifacts, tmp_path_factory):
    folder = tmp_path_factory.mktemp("prefix-cache")
    config = folder / "worker.toml"  # the suite's config with the worker's prefix cache on
    config.write_text((ROOT / "configs/test.toml").read_text().replace("prefix_cache_mb = 0", "prefix_cache_mb = 16"))
    async with real_gateway(demo_artifacts, folder, worker_config=config) as client:
        yield client


async def test_a_repeated_context_counts_its_cross_request_hit_in_usage(client):
    rng, vocab = np.random.default_rng(0), client.app[GATEWAY].limits.vocab_size
    context = rng.integers(0, vocab, 40).tolist()
    samples = [context + rng.integers(0, vocab, n).tolist() for n in (3, 7, 2)]
    body = {"samples": [{"input_ids": s} for s in samples], "label_token_ids": LABELS, "output": "logprobs"}
    answers = []
    for _ in range(3):  # seen, inserted on the second sighting, read on the third
        response = await client.post("/v1/score", json=body)
        answers.append(await response.json())
        assert response.status == 200, answers[-1]
    cached = [a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers]
    assert cached[0] == cached[1] == 2 * len(context)  # shared within the request: computed once of 3
    assert cached[2] == 3 * len(context)  # the third computes none of it
    np.testing.assert_allclose(answers[2]["scores"], answers[0]["scores"], rtol=0, atol=1e-5)
    assert answers[2]["usage"]["prompt_tokens"] == answers[0]["usage"]["prompt_tokens"]
