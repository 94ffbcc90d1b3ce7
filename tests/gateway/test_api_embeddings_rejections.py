"""/v1/embeddings and /v1/models in front of the stand-in worker: every refusal path (status, code, a
message naming the field and the fix), the bearer token on /v1/models, and the answer's shape."""

from __future__ import annotations

import pytest
import pytest_asyncio

from loadgen.standin_worker import StandInWorker
from tests.gateway.conftest import endpoint, start_stack
from tests.gateway.test_gateway_rejections import assert_error


@pytest_asyncio.fixture(loop_scope="function")
async def small_stack(request_tokenizer):
    workers = [StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size).start()]
    stack = await start_stack(request_tokenizer, workers, max_samples_per_request=4, auth_token="secret")
    yield stack
    await stack.client.close()
    workers[0].stop()


AUTH = {"Authorization": "Bearer secret"}


@pytest.mark.parametrize("body, status, code, words", [
    ({"input": ["red shoe", [1, 2]]}, 400, "invalid_request", ["$.input[1]", "token ids", "$.input[0] is text"]),
    ({"input": [1, [2]]}, 400, "invalid_request", ["$.input[1]"]),
    ({"input": []}, 400, "invalid_request", ["$.input"]),
    ({"input": [[1, 999999]]}, 400, "invalid_request", ["$.input[0][1]", "999999"]),
    ({"input": "red shoe", "encoding_format": "int8"}, 400, "invalid_request", ["encoding_format", "base64"]),
    ({"input": "red shoe", "dimensions": 0}, 400, "invalid_request", ["dimensions"]),
    ({"input": "red shoe", "model": "text-embedding-3-small"}, 404, "not_found", ["text-embedding-3-small", "demo"]),
    ({"input": ["a", "b", "c", "d", "e"]}, 413, "too_large", ["$.input holds 5 inputs", "at most 4"]),
    ({"input": [1] * 513}, 413, "too_large", ["$.input holds 513 token ids", "512"]),
    ({"input": [[1], [1] * 513]}, 413, "too_large", ["$.input[1] holds 513 token ids"]),
    ({"input": ""}, 400, "invalid_request", ["no tokens"]),
    ({"input": "red shoe", "colour": 1}, 400, "invalid_request", ["colour"]),
])
async def test_embeddings_refusals_name_the_field(small_stack, body, status, code, words):
    status_got, answer, _ = await small_stack.post("/v1/embeddings", body, headers=AUTH)
    assert_error(status_got, answer, status, code, *words)


async def test_embeddings_answer_in_openai_shape_and_models_need_the_token(small_stack):
    status, answer, _ = await small_stack.post("/v1/embeddings", {"input": ["red shoe", "tea"], "model": "demo"},
                                               headers=AUTH)
    assert status == 200, answer
    assert answer["object"] == "list" and answer["model"] == "demo"
    assert [(d["object"], d["index"]) for d in answer["data"]] == [("embedding", 0), ("embedding", 1)]
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 0
    response = await small_stack.client.get("/v1/models")
    assert response.status == 401
    response = await small_stack.client.get("/v1/models", headers=AUTH)
    assert (await response.json()) == {"object": "list", "data": [{"id": "demo", "object": "model", "created": 0,
                                                                   "owned_by": "boundserve"}]}
