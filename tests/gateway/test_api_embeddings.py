"""/v1/embeddings and /v1/models in front of a real worker serving the tiny compiled demo model, called
with OpenAI's Python SDK: each vector equals transformers' final-norm hidden state at the input's last
token (`last_hidden_state[:, -1]`, float32) within 1e-4, whether sent as floats or base64, for texts and
token ids alike; usage counts the inputs' tokens as OpenAI does."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest
import pytest_asyncio
import torch

from tests.gateway.test_api_rerank import MODEL, reference  # noqa: F401 (a fixture)
from tests.gateway.test_gateway_real_worker import real_gateway

pytestmark = pytest.mark.slow  # needs the compiled demo artifacts (built once per machine, cached)

TEXTS = ["red running shoe", "is this relevant: blue phone case for summer", "cheap coffee"]


def transformers_embeddings(reference, token_ids: list[list[int]]) -> np.ndarray:  # noqa: F811
    _, model = reference
    rows = []
    for ids in token_ids:
        with torch.no_grad():
            rows.append(model.model(torch.tensor([ids])).last_hidden_state[0, -1].float().numpy())
    return np.stack(rows)


@pytest_asyncio.fixture(loop_scope="function")
async def openai_client(demo_artifacts, tmp_path):
    async with real_gateway(demo_artifacts, tmp_path) as client:
        async with openai.AsyncOpenAI(api_key="unused", base_url=str(client.make_url("/v1"))) as sdk:
            yield sdk


async def test_openai_sdk_embeddings_equal_transformers_hidden_states(openai_client, reference):  # noqa: F811
    token_ids = [reference[0](text).input_ids for text in TEXTS]
    want = transformers_embeddings(reference, token_ids)
    for asked in ({"encoding_format": "float"}, {}):  # left out, the SDK asks for base64 and decodes it itself
        answer = await openai_client.embeddings.create(model=MODEL, input=TEXTS, **asked)
        assert [d.index for d in answer.data] == [0, 1, 2]
        np.testing.assert_allclose([d.embedding for d in answer.data], want, atol=1e-4)
        assert answer.usage.prompt_tokens == answer.usage.total_tokens == sum(len(i) for i in token_ids)
        assert answer.model == MODEL
    answer = await openai_client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="base64")
    vectors = [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in answer.data]
    np.testing.assert_allclose(vectors, want, atol=1e-4)
    answer = await openai_client.embeddings.create(model=MODEL, input=token_ids, dimensions=want.shape[1])
    np.testing.assert_allclose([d.embedding for d in answer.data], want, atol=1e-4)
    answer = await openai_client.embeddings.create(model=MODEL, input=token_ids[1])  # one input as token ids
    np.testing.assert_allclose(answer.data[0].embedding, want[1], atol=1e-4)
    answer = await openai_client.embeddings.create(model=MODEL, input=TEXTS[2])  # one text
    np.testing.assert_allclose(answer.data[0].embedding, want[2], atol=1e-4)
    with pytest.raises(openai.BadRequestError, match="hidden size"):
        await openai_client.embeddings.create(model=MODEL, input=TEXTS, dimensions=want.shape[1] // 2)
    with pytest.raises(openai.NotFoundError, match="text-embedding-3-small"):
        await openai_client.embeddings.create(model="text-embedding-3-small", input=TEXTS)


async def test_openai_sdk_lists_the_served_model(openai_client):
    models = [model async for model in openai_client.models.list()]
    assert [m.id for m in models] == [MODEL]
    assert models[0].owned_by == "boundserve" and models[0].created > 0
