"""The prefix cache through a real worker (real ZeroMQ, the compiled demo package).

A request's prefix is inserted on its second sighting and read on the third, whose answer equals
the first within 1e-5 and reports the hit in cached_tokens; the heartbeat reports what is held and
the counters; a chunk of a split request is inserted at once; a stream of unique prefixes never
holds more bytes than the budget; prefix_cache_mb = 0 never hits.
"""

from __future__ import annotations

import numpy as np
import pytest

from shared import protocol
from shared.prefix import prefix_key

TOLERANCE = 1e-5
LABELS = (3, 7, 11)
BUDGET_MB = 1


def request(rid: str, prefix: list[int], suffixes: list[list[int]]) -> protocol.ScoreRequest:
    ids = np.array(prefix + [t for s in suffixes for t in s], dtype=np.int32)
    return protocol.ScoreRequest(rid, 60_000.0, protocol.pack_ids(ids), tuple(len(s) for s in suffixes), LABELS, 3,
                          True, prefix_len=len(prefix))


def score(client, batch_id: int, *requests: protocol.ScoreRequest) -> list[protocol.ScoreResult]:
    client.send(protocol.ScoreBatch(batch_id, "int32", requests))
    reply = client.reply_to(batch_id)
    assert isinstance(reply, protocol.ScoreResults), reply
    assert all(r.status == protocol.Status.OK for r in reply.results), reply
    return list(reply.results)


def floats(result: protocol.ScoreResult, name: str) -> np.ndarray:
    return np.frombuffer(getattr(result, name), dtype=np.float32)


def assert_close(got: protocol.ScoreResult, want: protocol.ScoreResult) -> None:
    for name in ("label_logits", "label_logprobs", "label_probs", "topk_logprobs", "hidden"):
        np.testing.assert_allclose(floats(got, name), floats(want, name), rtol=0, atol=TOLERANCE, err_msg=name)
    assert got.topk_ids == want.topk_ids


def tokens(rng, vocab: int, n: int) -> list[int]:
    return rng.integers(0, vocab, n).tolist()


def start(worker_process_class, client_class, artifacts, folder, mb: int):
    worker = worker_process_class(artifacts, folder, prefix_cache_mb=mb)
    client = client_class(worker.endpoint)
    ready = client.hello()
    assert isinstance(ready, protocol.Ready), worker.log()
    return worker, client, ready.model["vocab_size"]


@pytest.fixture(scope="module")
def cached(demo_artifacts, tmp_path_factory, worker_process_class, client_class):
    """(client, vocab) of a worker with a 1 MiB prefix cache."""
    worker, client, vocab = start(worker_process_class, client_class, demo_artifacts,
                                  tmp_path_factory.mktemp("cache-on"), BUDGET_MB)
    yield client, vocab
    client.close()
    worker.kill()


def test_the_third_sighting_reads_the_prefix_and_equals_the_first(cached):
    client, vocab = cached
    rng = np.random.default_rng(1)
    prefix, suffixes = tokens(rng, vocab, 48), [tokens(rng, vocab, n) for n in (3, 9, 1)]
    before = client.heartbeat().prefix_cache
    first, second, third = (score(client, 10 + k, request(f"same~{k}", prefix, suffixes))[0] for k in range(3))
    after = client.heartbeat().prefix_cache
    assert_close(second, first)
    assert_close(third, first)
    assert first.cached_tokens == second.cached_tokens  # within the request only: 2 of 3 copies of the prefix
    assert third.cached_tokens == first.cached_tokens + len(prefix)  # and the one it computed before
    assert after.insertions == before.insertions + 1 and after.hits == before.hits + 1
    assert after.hit_tokens == before.hit_tokens + len(prefix)
    assert (prefix_key(prefix), len(prefix)) in after.held
    assert 0 < after.bytes_held <= after.budget_bytes == BUDGET_MB << 20


def test_a_longer_prefix_reads_the_held_one_and_the_rest_is_computed(cached):
    client, vocab = cached
    rng = np.random.default_rng(2)
    held, more, suffixes = tokens(rng, vocab, 30), tokens(rng, vocab, 12), [tokens(rng, vocab, n) for n in (4, 2)]
    for k in range(2):  # seen twice: held
        score(client, 20 + k, request(f"short~{k}", held, suffixes))
    whole = [held + more + s for s in suffixes]  # the same samples, unshared: nothing read from the cache
    scratch = score(client, 22, protocol.ScoreRequest("long~0", 60_000.0, protocol.pack_ids(np.array(sum(whole, []), dtype=np.int32)),
                                               tuple(len(w) for w in whole), LABELS, 3, True))[0]
    hit = score(client, 23, request("long~1", held + more, suffixes))[0]
    assert_close(hit, scratch)
    assert hit.cached_tokens >= len(held) + len(more)  # the held 30 read, one copy of the 42 shared


def test_a_chunk_of_a_split_request_is_held_at_once(cached):
    client, vocab = cached
    rng = np.random.default_rng(3)
    prefix = tokens(rng, vocab, 40)
    chunks = [[tokens(rng, vocab, n) for n in (2, 5)] for _ in range(3)]
    results = [score(client, 30 + k, request(f"split~7#{k}", prefix, s))[0] for k, s in enumerate(chunks)]
    assert results[1].cached_tokens == results[0].cached_tokens + len(prefix)  # chunk 0 inserted it
    assert results[2].cached_tokens == results[1].cached_tokens


def test_unique_prefixes_never_hold_more_than_the_budget(cached):
    client, vocab = cached
    rng = np.random.default_rng(4)
    for k in range(40):  # chunks, so each is inserted at once: 40 x 60 tokens is over 1 MiB on this model
        requests = [request(f"unique{k}-{j}~1#0", tokens(rng, vocab, 60), [tokens(rng, vocab, 3)]) for j in range(3)]
        score(client, 100 + k, *requests)
    report = client.heartbeat().prefix_cache
    assert report.evictions > 0
    assert 0 < report.bytes_held <= report.budget_bytes == BUDGET_MB << 20
    assert len(report.held) < 120


def test_a_cache_of_zero_megabytes_never_hits(demo_artifacts, tmp_path_factory, worker_process_class, client_class):
    worker, client, vocab = start(worker_process_class, client_class, demo_artifacts,
                                  tmp_path_factory.mktemp("cache-off"), 0)
    try:
        rng = np.random.default_rng(5)
        prefix, suffixes = tokens(rng, vocab, 48), [tokens(rng, vocab, n) for n in (3, 9)]
        first, _, third = (score(client, k, request(f"off~{k}", prefix, suffixes))[0] for k in range(3))
        assert third.cached_tokens == first.cached_tokens
        assert_close(third, first)
        report = client.heartbeat().prefix_cache
        assert report == protocol.PrefixCacheReport()  # off: budget 0, nothing held, nothing counted
    finally:
        client.close()
        worker.kill()
