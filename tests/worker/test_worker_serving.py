"""A real worker process on the compiled demo model: handshake, results equal to the node called
directly, deadline drops, bounds refusals, overload, and survival of random frames."""

from __future__ import annotations

import itertools

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared import protocol

batch_ids = itertools.count(1000)


@pytest.fixture(scope="module")
def nodes(demo_artifacts):
    from worker.runtime.loader import load_nodes

    return load_nodes(demo_artifacts, "cpu")


def token_ids(rng, vocab, n):
    return rng.integers(0, vocab, size=n)


def score_request(rid, ids, lens, labels=(), top_k=0, hidden=False, deadline_ms=60_000.0, dtype="int32"):
    return protocol.ScoreRequest(rid, deadline_ms, protocol.pack_ids(ids, dtype), tuple(lens), tuple(labels), top_k, hidden)


def score_batch(*requests, dtype="int32"):
    return protocol.ScoreBatch(batch_id=next(batch_ids), token_dtype=dtype, requests=tuple(requests))


def direct(node, ids, lens, labels, top_k):
    out = node(torch.as_tensor(ids, dtype=torch.int64), torch.tensor(lens, dtype=torch.int64),
               torch.tensor(labels, dtype=torch.int64), top_k)
    return {k: (None if v is None else v.numpy()) for k, v in vars(out).items()
            if k not in ("prefix_kv", "token_logprobs")}  # none kept, none asked


def test_ready_carries_bounds_model_and_latency(client, nodes):
    ready = client.ready
    assert ready.protocol_version == protocol.PROTOCOL_VERSION
    assert ready.bounds == nodes.manifest.bounds
    assert "score" in ready.workloads and ready.model["vocab_size"] == nodes.manifest.model.vocab_size
    model = ready.latency["score"]
    assert min(model.alpha, model.beta, model.gamma, model.delta) >= 0
    assert model.predict_ms(8, 32) > 0


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_score_results_equal_the_node_called_directly(client, nodes, dtype):
    vocab = client.ready.model["vocab_size"]
    rng = np.random.default_rng(1)
    specs = [  # (sample lengths, labels, top_k, return_hidden)
        ((5, 17, 9), (3, 7, 11), 4, True),
        ((30,), (7,), 5, False),
        ((2, 12), (), 2, True),
    ]
    requests, inputs = [], []
    for i, (lens, labels, k, hidden) in enumerate(specs):
        ids = token_ids(rng, vocab, sum(lens))
        inputs.append((ids, lens, labels, k, hidden))
        requests.append(score_request(f"r{i}", ids, lens, labels, k, hidden, dtype=dtype))
    batch = score_batch(*requests, dtype=dtype)
    client.send(batch)
    reply = client.reply_to(batch.batch_id)
    assert isinstance(reply, protocol.ScoreResults), reply
    assert [r.request_id for r in reply.results] == ["r0", "r1", "r2"]
    for result, (ids, lens, labels, k, hidden) in zip(reply.results, inputs):
        assert result.status == protocol.Status.OK and result.num_samples == len(lens)
        want = direct(nodes.score, ids, lens, labels, k)
        got = result.arrays()
        for name, key in (("label_logits", "label_logits"), ("label_logprobs", "label_logprobs"),
                          ("label_probs", "label_probs"), ("topk_logprobs", "topk_logprobs")):
            if labels or name.startswith("topk"):
                np.testing.assert_allclose(got[name], want[key], rtol=1e-4, atol=1e-5, err_msg=name)
        np.testing.assert_array_equal(got["topk_ids"], want["topk_ids"])
        if hidden:
            np.testing.assert_allclose(got["hidden"], want["hidden"], rtol=1e-4, atol=1e-5)
        else:
            assert "hidden" not in got


def shared_request(rid, prefix, suffixes, labels=(), top_k=0):
    """A request sent as one shared prefix plus per-sample suffixes (sample i = prefix + suffix i)."""
    ids = [*prefix, *(t for s in suffixes for t in s)]
    return protocol.ScoreRequest(rid, 60_000.0, protocol.pack_ids(ids), tuple(len(s) for s in suffixes), tuple(labels), top_k,
                          True, len(prefix))


def test_shared_prefix_requests_equal_the_node_on_whole_samples(client, nodes):
    vocab = client.ready.model["vocab_size"]
    rng = np.random.default_rng(6)
    prefix = token_ids(rng, vocab, 20).tolist()
    suffixes = [token_ids(rng, vocab, n).tolist() for n in (5, 1, 9)] + [[]]  # the last sample is the prefix
    duplicates = [[], []]  # two samples, both equal to their prefix
    unshared = [token_ids(rng, vocab, n).tolist() for n in (7, 3)]
    batch = score_batch(shared_request("shared", prefix, suffixes, (3, 7), 4),
                        score_request("unshared", [t for s in unshared for t in s], (7, 3), (7, 11), 2, True),
                        shared_request("dupes", prefix[:6], duplicates, (3,), 1))
    client.send(batch)
    reply = client.reply_to(batch.batch_id)
    assert isinstance(reply, protocol.ScoreResults), reply
    wanted = (([prefix + s for s in suffixes], (3, 7), 4, 3 * 20), (unshared, (7, 11), 2, 0),
              ([prefix[:6]] * 2, (3,), 1, 6))  # (whole samples, labels, top_k, cached tokens)
    for result, (samples, labels, k, cached) in zip(reply.results, wanted):
        assert result.status == protocol.Status.OK and result.num_samples == len(samples), result
        assert result.cached_tokens == cached  # the prefix's tokens, once per sample after the first
        want = direct(nodes.score, [t for s in samples for t in s], [len(s) for s in samples], labels, k)
        got = result.arrays()
        for name in ("label_logits", "label_logprobs", "label_probs", "topk_logprobs", "hidden"):
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)
        np.testing.assert_array_equal(got["topk_ids"], want["topk_ids"])


def test_a_shared_prefix_over_its_bound_is_refused_alone(client):
    bounds = client.ready.bounds
    per_sample, per_prefix = bounds.max_tokens_per_sample, bounds.max_prefix_tokens
    # a prefix one token over its bound, or (when that bound is the sample bound) a sample one token over
    prefix_len, want = (per_prefix + 1, "max_prefix_tokens") if per_prefix < per_sample else (per_sample, "tokens")
    batch = score_batch(shared_request("long-prefix", [1] * prefix_len, [[2]]),
                        shared_request("fine", [1, 2], [[3], []]))
    client.send(batch)
    reply = client.reply_to(batch.batch_id)
    refused, fine = reply.results
    assert refused.status == protocol.Status.ERROR and want in refused.error, refused.error
    assert fine.status == protocol.Status.OK and fine.num_samples == 2


def test_single_request_batch_matches_exactly_shaped_call(client, nodes):
    vocab = client.ready.model["vocab_size"]
    ids = token_ids(np.random.default_rng(2), vocab, 40)
    batch = score_batch(score_request("only", ids, (25, 15), (1, 2, 3), 5, True))
    client.send(batch)
    result = client.reply_to(batch.batch_id).results[0]
    want = direct(nodes.score, ids, (25, 15), (1, 2, 3), 5)
    got = result.arrays()
    np.testing.assert_allclose(got["label_probs"], want["label_probs"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["hidden"], want["hidden"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["topk_ids"], want["topk_ids"])


def test_expired_requests_are_answered_and_never_computed(client):
    vocab = client.ready.model["vocab_size"]
    rng = np.random.default_rng(3)
    before = client.counters()
    batch = score_batch(
        score_request("late", token_ids(rng, vocab, 10), (10,), (1,), 1, deadline_ms=-1.0),
        score_request("live", token_ids(rng, vocab, 10), (10,), (1,), 1),
        score_request("late2", token_ids(rng, vocab, 8), (8,), (), 0, deadline_ms=0.0),
    )
    client.send(batch)
    reply = client.reply_to(batch.batch_id)
    assert [r.status for r in reply.results] == ["expired", "ok", "expired"]
    assert reply.results[0].arrays() == {} and reply.results[1].num_samples == 1
    middle = client.counters()
    assert middle.requests_expired - before.requests_expired == 2
    assert middle.requests_computed - before.requests_computed == 1
    assert middle.batches_computed - before.batches_computed == 1

    all_late = score_batch(*(score_request(f"x{i}", token_ids(rng, vocab, 64), (64,), (1,), 5, deadline_ms=-5.0)
                             for i in range(4)))
    client.send(all_late)
    reply = client.reply_to(all_late.batch_id)
    assert all(r.status == "expired" for r in reply.results)
    assert reply.compute_ms == 0.0  # the model was never called
    after = client.counters()
    assert after.batches_computed == middle.batches_computed
    assert after.requests_computed == middle.requests_computed
    assert after.requests_expired - middle.requests_expired == 4


def test_out_of_bounds_requests_and_batches_are_refused_then_service_continues(client):
    bounds, vocab = client.ready.bounds, client.ready.model["vocab_size"]
    rng = np.random.default_rng(4)
    long_len = bounds.max_tokens_per_sample + 1
    batch = score_batch(
        score_request("too-long", token_ids(rng, vocab, long_len), (long_len,)),
        score_request("bad-id", [vocab + 5, 1], (2,)),
        score_request("big-k", [1, 2], (2,), top_k=bounds.max_top_k + 1),
        score_request("fine", [1, 2, 3], (3,), (4,), 1),
    )
    client.send(batch)
    reply = client.reply_to(batch.batch_id)
    statuses = {r.request_id: (r.status, r.error) for r in reply.results}
    assert statuses["too-long"][0] == "error" and "tokens" in statuses["too-long"][1]
    assert statuses["bad-id"][0] == "error" and "vocabulary" in statuses["bad-id"][1]
    assert statuses["big-k"][0] == "error" and "top_k" in statuses["big-k"][1]
    assert statuses["fine"][0] == "ok"

    per = bounds.max_tokens_per_sample
    count = bounds.max_tokens_per_batch // per + 1
    too_big = score_batch(*(score_request(f"t{i}", token_ids(rng, vocab, per), (per,)) for i in range(count)))
    client.send(too_big)
    error = client.reply_to(too_big.batch_id)
    assert isinstance(error, protocol.Error) and error.code == protocol.ErrorCode.OUT_OF_BOUNDS and "tokens" in error.message

    ok = score_batch(score_request("after", [5, 6], (2,), (1,), 1))
    client.send(ok)
    assert client.reply_to(ok.batch_id).results[0].status == "ok"


def test_unsupported_and_unexpected_messages(client):
    if "beam" not in client.ready.workloads:
        beam = protocol.BeamBatch(next(batch_ids), "int32", 2, 2, 1, (protocol.BeamRequest("b", 1000.0, protocol.pack_ids([1, 2])),))
        client.send(beam)
        reply = client.reply_to(beam.batch_id)
        assert isinstance(reply, protocol.Error) and reply.code == protocol.ErrorCode.UNSUPPORTED
    client.send(protocol.Heartbeat("gw", 0, 0, False, protocol.WorkerCounters()))
    reply = client.recv_where(lambda m: isinstance(m, protocol.Error))
    assert reply.code == protocol.ErrorCode.UNSUPPORTED and "Heartbeat" in reply.message


def test_handshake_rules(worker_process, client_class):
    other = client_class(worker_process.endpoint, gateway_id="gw-2")
    try:
        batch = score_batch(score_request("r", [1, 2], (2,)))
        other.send(batch)
        reply = other.reply_to(batch.batch_id)
        assert isinstance(reply, protocol.Error) and reply.code == protocol.ErrorCode.HELLO_REQUIRED
        other.send(protocol.Hello(protocol_version=protocol.PROTOCOL_VERSION + 1, gateway_id="gw-2"))
        reply = other.recv_where(lambda m: isinstance(m, protocol.Error))
        assert reply.code == protocol.ErrorCode.VERSION_MISMATCH
        ready = other.hello()
        assert isinstance(ready, protocol.Ready)
        other.send(batch)
        assert other.reply_to(batch.batch_id).results[0].status == "ok"
        # a second gateway gets heartbeats too
        assert other.counters().batches_computed >= 1
    finally:
        other.send(protocol.Goodbye(sender_id="gw-2"))
        other.close()


def test_only_a_known_gateway_is_obeyed_and_a_version_change_unregisters_it(worker_process, client_class):
    stranger = client_class(worker_process.endpoint, gateway_id="gw-3")
    try:
        stranger.send(protocol.Shutdown(reason="not a gateway you know"))
        reply = stranger.recv_where(lambda m: isinstance(m, protocol.Error))
        assert reply.code == protocol.ErrorCode.HELLO_REQUIRED and "Shutdown" in reply.message
        assert isinstance(stranger.hello(), protocol.Ready)  # still serving: the Shutdown was not obeyed
        batch = score_batch(score_request("v", [1, 2], (2,)))
        stranger.send(protocol.Hello(protocol_version=protocol.PROTOCOL_VERSION + 1, gateway_id="gw-3"))
        assert stranger.recv_where(lambda m: isinstance(m, protocol.Error)).code == protocol.ErrorCode.VERSION_MISMATCH
        stranger.send(batch)
        reply = stranger.reply_to(batch.batch_id)
        assert isinstance(reply, protocol.Error) and reply.code == protocol.ErrorCode.HELLO_REQUIRED
    finally:
        stranger.close()


def test_full_queue_answers_overloaded_at_once(client):
    bounds, vocab = client.ready.bounds, client.ready.model["vocab_size"]
    rng = np.random.default_rng(5)
    per = bounds.max_tokens_per_sample
    count = bounds.max_tokens_per_batch // per
    batches = [score_batch(*(score_request(f"q{i}", token_ids(rng, vocab, per), (per,), (1,), 5) for i in range(count)))
               for _ in range(40)]
    for batch in batches:
        client.send(batch)
    replies = [client.reply_to(b.batch_id, timeout_s=120) for b in batches]
    overloaded = [r for r in replies if isinstance(r, protocol.Error)]
    served = [r for r in replies if isinstance(r, protocol.ScoreResults)]
    assert len(overloaded) + len(served) == len(batches)
    assert overloaded and all(r.code == protocol.ErrorCode.OVERLOADED for r in overloaded)
    assert len(served) >= 1


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20,
)


def is_not_control(frames: list[bytes]) -> bool:
    """Random frames must not happen to be a valid Shutdown or Goodbye (those end the session)."""
    try:
        return not isinstance(protocol.decode(frames), (protocol.Shutdown, protocol.Goodbye))
    except protocol.ProtocolError:
        return True


random_frames = st.one_of(
    st.lists(st.binary(max_size=64), min_size=0, max_size=4),
    st.tuples(st.sampled_from(sorted(set(protocol.MESSAGE_TYPES) - {protocol.Shutdown.TYPE, protocol.Goodbye.TYPE})), msgpack_values).map(
        lambda t: [bytes([t[0]]), msgpack.packb(t[1])]),
    st.tuples(st.sampled_from([3, 5]), st.lists(msgpack_values, max_size=8)).map(
        lambda t: [bytes([t[0]]), msgpack.packb([next(batch_ids), "int32", *t[1]])]),
).filter(is_not_control)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames=st.lists(random_frames, min_size=1, max_size=3))
def test_fuzzed_frames_never_kill_the_worker(client, worker_process, frames):
    for message in frames:
        client.send_raw(message if message else [b""])
    batch = score_batch(score_request("probe", [1, 2, 3], (3,), (1,), 1))
    client.send(batch)
    reply = client.reply_to(batch.batch_id, timeout_s=30)
    assert isinstance(reply, protocol.ScoreResults) and reply.results[0].status == "ok"
    assert worker_process.process.poll() is None


def test_malformed_batch_is_answered_by_batch_id_then_service_continues(client):
    client.send_raw([bytes([protocol.ScoreBatch.TYPE]), msgpack.packb([555, "int16", []])])
    reply = client.reply_to(555)
    assert isinstance(reply, protocol.Error) and reply.code == protocol.ErrorCode.MALFORMED and "token_dtype" in reply.message
    ok = score_batch(score_request("after-malformed", [5, 6], (2,), (1,), 1))
    client.send(ok)
    assert client.reply_to(ok.batch_id).results[0].status == "ok"
