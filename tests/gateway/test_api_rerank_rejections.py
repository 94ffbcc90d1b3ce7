"""The rerank routes in front of the stand-in worker: every refusal path (status, code, a message naming
the field and the fix), and a request of 100 documents with the default (Qwen3-Reranker) template split
into batches, answered whole, its shared query prefix computed once per batch."""

from __future__ import annotations

import pytest
import pytest_asyncio

from gateway.sharing import chunks
from shared.config import RerankConfig
from shared.prefix import longest_common_prefix
from aiohttp.test_utils import TestClient, TestServer

from gateway.app import make_app
from gateway.wiring import Settings
from loadgen.standin_worker import BOUNDS, StandInWorker, standin_manifest
from tests.gateway.conftest import Stack, deployment, endpoint, start_stack, wait_ready
from tests.gateway.test_gateway_rejections import assert_error

QUERY = "red running shoe"


@pytest_asyncio.fixture(loop_scope="function")
async def rerank_stack(request_tokenizer):
    workers = [StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size).start()]
    stack = await start_stack(request_tokenizer, workers, max_samples_per_request=128)
    yield stack
    await stack.client.close()
    for worker in workers:
        worker.stop()


@pytest.mark.parametrize("path, body, status, code, words", [
    ("/v1/rerank", {"query": QUERY, "documents": []}, 400, "invalid_request", ["$.documents", "non-empty list"]),
    ("/v1/rerank", {"query": "", "documents": ["a"]}, 400, "invalid_request", ["$.query"]),
    ("/v1/rerank", {"documents": ["a"]}, 400, "invalid_request", ["query"]),
    ("/v1/rerank", {"query": QUERY, "documents": [{"title": "a"}]}, 400, "invalid_request", ["title"]),
    ("/v1/rerank", {"query": QUERY, "documents": ["a"], "rank_fields": ["title"]}, 400, "invalid_request",
     ["rank_fields", "ranked on their text alone"]),
    ("/v1/rerank", {"query": QUERY, "documents": ["a"], "max_chunks_per_doc": 2}, 400, "invalid_request",
     ["max_chunks_per_doc", "not chunked"]),
    ("/v2/rerank", {"query": QUERY, "documents": ["a"], "top_n": 0}, 400, "invalid_request", ["top_n"]),
    ("/v2/rerank", {"query": QUERY, "documents": ["a"], "model": "rerank-v3.5"}, 404, "not_found",
     ["rerank-v3.5", "GET /v1/models"]),
    ("/rerank", {"query": QUERY, "texts": ["a"], "truncation_direction": "Middle"}, 400, "invalid_request",
     ["truncation_direction"]),
    ("/rerank", {"query": QUERY, "texts": ["a"] * 129}, 413, "too_large", ["texts holds 129", "128"]),
    ("/v1/rerank", {"query": QUERY, "documents": ["a"] * 129}, 413, "too_large", ["documents holds 129"]),
])
async def test_rerank_refusals_name_the_field(rerank_stack, path, body, status, code, words):
    assert_error(*(await rerank_stack.post(path, body))[:2], status, code, *words)


async def test_a_document_over_the_bound_is_refused_and_a_query_over_it_cannot_be_cut(rerank_stack):
    long = "red shoe " * 400
    status, body, _ = await rerank_stack.post("/v1/rerank", {"query": QUERY, "documents": ["a", long]})
    assert_error(status, body, 413, "too_large", "documents[1]", "truncate", "nothing was truncated")
    status, body, _ = await rerank_stack.post("/v1/rerank", {"query": long, "documents": ["a"], "truncate": True})
    assert_error(status, body, 413, "too_large", "documents[0]", "the template and the query alone")


async def test_labels_that_are_not_single_tokens_make_rerank_unavailable(request_tokenizer):
    workers = [StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size).start()]
    config = deployment([workers[0].endpoint]).replace(rerank=RerankConfig(labels=("premium shipping review",)))
    client = TestClient(TestServer(make_app(Settings(config, standin_manifest(request_tokenizer.vocab_size),
                                                     request_tokenizer))))
    await client.start_server()
    stack = Stack(client, workers)
    try:
        await wait_ready(stack)
        status, body, _ = await stack.post("/rerank", {"query": QUERY, "texts": ["a"]})
        assert_error(status, body, 404, "not_found", "[rerank] labels", "premium shipping review")
    finally:
        await client.close()
        workers[0].stop()


async def test_a_hundred_documents_are_split_into_batches_each_computing_the_query_once(rerank_stack,
                                                                                        request_tokenizer):
    documents = [f"premium shoe number {i} " + "with free shipping " * (i % 7) for i in range(100)]
    status, body, _ = await rerank_stack.post("/v1/rerank", {"query": QUERY, "documents": documents,
                                                             "return_documents": True})
    assert status == 200, body
    assert sorted(r["index"] for r in body["results"]) == list(range(100))  # every document answered
    assert all(r["document"]["text"] == documents[r["index"]] for r in body["results"])
    scores = [r["relevance_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
    template = RerankConfig().template
    ids = request_tokenizer.encode([template.format(query=QUERY, document=d) for d in documents])
    shared = longest_common_prefix(ids)
    assert shared >= len(request_tokenizer.encode([template.split("{document}")[0].format(query=QUERY)])[0]) - 2
    parts = chunks(ids, shared, BOUNDS.max_samples_per_batch, BOUNDS.max_tokens_per_batch)
    assert len(parts) > 1  # split: more than one compiled batch holds
    assert body["usage"]["prompt_tokens"] == sum(len(i) for i in ids)
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == sum((len(p) - 1) * shared for p in parts)
