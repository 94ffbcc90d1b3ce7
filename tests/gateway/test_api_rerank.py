"""The rerank routes in front of a real worker serving the tiny compiled demo model, called with the
real clients: Cohere's SDK (its v1 Client posts to /v1/rerank, its ClientV2 to /v2/rerank) and
text-embeddings-inference's shape by raw HTTP. Relevance equals transformers' on the same checkpoint
(P(yes) / (P(yes) + P(no)) at the prompt's last token, float32) within 1e-4, and the shared query
prefix is computed once: the answer reports every repeat of it as cached.
"""

from __future__ import annotations

import asyncio

import cohere
import numpy as np
import pytest
import pytest_asyncio
import torch

from shared.config import RerankConfig
from shared.prefix import longest_common_prefix
from tests.gateway.test_gateway_real_worker import real_gateway

pytestmark = pytest.mark.slow  # needs the compiled demo artifacts (built once per machine, cached)

TEMPLATE = "relevant query: {query}\ndocument: {document}\nyes or no:"
"""A short reranker prompt (the test bounds allow 64 tokens per prompt); its labels are one token each."""
QUERY = "red running shoe for summer"
DOCUMENTS = ["blue phone case", "red shoe with free shipping", "cheap coffee", "the best hotel near the beach",
             "premium red running shoe"]
MODEL = "test"  # configs/test.toml's name: the model the gateway serves


@pytest.fixture(scope="module")
def reference(demo_checkpoint):
    """transformers on the demo checkpoint: its tokenizer and its model, float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(demo_checkpoint, dtype=torch.float32).eval()
    return AutoTokenizer.from_pretrained(demo_checkpoint), model


def transformers_relevance(reference, query: str, documents: list[str], labels=("yes", "no")) -> np.ndarray:
    """Per document, from transformers' logits at the prompt's last token: P(yes) / (P(yes) + P(no)),
    or P(yes) under the vocabulary with one label (float64 from float32 log-probabilities)."""
    tokenizer, model = reference
    label_ids = [tokenizer.convert_tokens_to_ids(label) for label in labels]
    scores = []
    for document in documents:
        ids = tokenizer(TEMPLATE.format(query=query, document=document), return_tensors="pt").input_ids
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0, -1].float(), dim=-1)[label_ids].double()
        scores.append(torch.sigmoid(logprobs[0] - logprobs[1]).item() if len(labels) == 2
                      else logprobs[0].exp().item())
    return np.array(scores)


def prompt_ids(reference, query: str, documents: list[str]) -> list[list[int]]:
    return [reference[0](TEMPLATE.format(query=query, document=d)).input_ids for d in documents]


@pytest_asyncio.fixture(loop_scope="function")
async def rerank_stack(demo_artifacts, tmp_path):
    async with real_gateway(demo_artifacts, tmp_path, rerank=RerankConfig(template=TEMPLATE)) as client:
        yield client


async def test_cohere_clients_rank_by_transformers_relevance_and_compute_the_query_once(rerank_stack, reference):
    base_url = str(rerank_stack.make_url("")).rstrip("/")
    want = transformers_relevance(reference, QUERY, DOCUMENTS)
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -want[i])
    v1 = cohere.Client(api_key="unused", base_url=base_url)
    answer = await asyncio.to_thread(v1.rerank, query=QUERY, documents=[DOCUMENTS[0], {"text": DOCUMENTS[1]},
                                                                        *DOCUMENTS[2:]],
                                     top_n=3, return_documents=True, model=MODEL)
    assert [r.index for r in answer.results] == order[:3]
    np.testing.assert_allclose([r.relevance_score for r in answer.results], want[order[:3]], atol=1e-4)
    assert [r.document.text for r in answer.results] == [DOCUMENTS[i] for i in order[:3]]
    assert answer.meta.api_version.version == "1"
    ids = prompt_ids(reference, QUERY, DOCUMENTS)
    shared = longest_common_prefix(ids)
    assert shared >= len(reference[0](f"relevant query: {QUERY}").input_ids)  # the query is in the shared prefix
    assert answer.meta.billed_units.input_tokens == sum(len(i) for i in ids)
    assert answer.meta.cached_tokens == (len(DOCUMENTS) - 1) * shared  # computed once, reused by the 4 others

    v2 = cohere.ClientV2(api_key="unused", base_url=base_url)
    answer = await asyncio.to_thread(v2.rerank, model=MODEL, query=QUERY, documents=DOCUMENTS)
    assert [r.index for r in answer.results] == order
    np.testing.assert_allclose([r.relevance_score for r in answer.results], want[order], atol=1e-4)
    assert answer.meta.api_version.version == "2"
    assert all(getattr(r, "document", None) is None for r in answer.results)


async def test_tei_shape_scores_and_log_odds_equal_transformers(rerank_stack, reference):
    want = transformers_relevance(reference, QUERY, DOCUMENTS)
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -want[i])
    response = await rerank_stack.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "return_text": True})
    body = await response.json()
    assert response.status == 200, body
    assert [r["index"] for r in body] == order
    np.testing.assert_allclose([r["score"] for r in body], want[order], atol=1e-4)
    assert [r["text"] for r in body] == [DOCUMENTS[i] for i in order]
    response = await rerank_stack.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "raw_scores": True})
    body = await response.json()
    assert response.status == 200, body
    assert [r["index"] for r in body] == order and all("text" not in r for r in body)
    np.testing.assert_allclose([r["score"] for r in body], np.log(want / (1 - want))[order], atol=1e-3)


async def test_a_long_document_is_refused_unless_truncation_is_asked_and_then_named(rerank_stack, reference):
    long = " ".join(["premium red running shoe with free shipping"] * 12)
    documents = [DOCUMENTS[0], long, DOCUMENTS[2]]
    response = await rerank_stack.post("/v1/rerank", json={"query": QUERY, "documents": documents})
    body = await response.json()
    assert response.status == 413, body
    assert body["error"]["code"] == "too_large"
    assert "documents[1]" in body["error"]["message"] and "truncate" in body["error"]["message"]
    assert "nothing was truncated" in body["error"]["message"]

    for path, body in (("/v1/rerank", {"query": QUERY, "documents": documents, "truncate": True}),
                       ("/rerank", {"query": QUERY, "texts": documents, "truncate": True, "return_text": True})):
        response = await rerank_stack.post(path, json=body)
        answer = await response.json()
        assert response.status == 200, answer
        assert response.headers["X-Truncated-Documents"] == "1"
        results = answer if path == "/rerank" else answer["results"]
        if path == "/v1/rerank":
            [warning] = answer["meta"]["warnings"]
            assert warning.startswith("documents[1] was cut from ")
    cut = next(r["text"] for r in results if r["index"] == 1)
    assert long.startswith(cut) and len(prompt_ids(reference, QUERY, [cut])[0]) <= 64  # the bound, filled
    want = transformers_relevance(reference, QUERY, [DOCUMENTS[0], cut, DOCUMENTS[2]])
    np.testing.assert_allclose([r["score"] for r in sorted(results, key=lambda r: r["index"])], want, atol=1e-4)


async def test_one_label_scores_p_yes_under_the_whole_vocabulary(demo_artifacts, tmp_path, reference):
    async with real_gateway(demo_artifacts, tmp_path, rerank=RerankConfig(template=TEMPLATE, labels=("yes",))) as client:
        response = await client.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
        body = await response.json()
    assert response.status == 200, body
    want = transformers_relevance(reference, QUERY, DOCUMENTS, labels=("yes",))
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(DOCUMENTS))], want, atol=1e-4)
