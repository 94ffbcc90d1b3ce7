"""Beam batches through a real worker equal the beam node called directly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shared import protocol


@pytest.fixture(scope="module")
def beam_worker(beam_artifacts, tmp_path_factory, worker_process_class, client_class):
    from worker.runtime.loader import load_nodes

    nodes = load_nodes(beam_artifacts, "cpu")
    if nodes.beam is None:
        pytest.skip("the artifacts carry no beam node")
    worker = worker_process_class(beam_artifacts, tmp_path_factory.mktemp("beam-worker"))
    client = client_class(worker.endpoint)
    ready = client.hello()
    assert isinstance(ready, protocol.Ready), worker.log()
    yield nodes, client, ready
    client.close()
    worker.kill()


def test_ready_has_a_beam_latency_model(beam_worker):
    _, _, ready = beam_worker
    assert set(ready.workloads) == {"score", "beam"}
    model = ready.latency["beam"]
    assert min(model.alpha, model.beta, model.gamma, model.delta) >= 0


@pytest.mark.parametrize("num_beams,steps,k", [(4, 3, 2), (1, 2, 1)])
def test_beam_results_equal_the_node_called_directly(beam_worker, num_beams, steps, k):
    nodes, client, ready = beam_worker
    vocab = ready.model["vocab_size"]
    rng = np.random.default_rng(num_beams)
    prompts = [rng.integers(0, vocab, size=n) for n in (7, 19, 3)]
    requests = [protocol.BeamRequest(f"b{i}", 60_000.0, protocol.pack_ids(ids, "int64")) for i, ids in enumerate(prompts)]
    requests.insert(1, protocol.BeamRequest("late", -1.0, protocol.pack_ids(prompts[0], "int64")))
    batch = protocol.BeamBatch(batch_id=77 + num_beams, token_dtype="int64", num_beams=num_beams, max_new_tokens=steps,
                        num_return_sequences=k, requests=tuple(requests))
    client.send(batch)
    reply = client.reply_to(batch.batch_id)
    assert isinstance(reply, protocol.BeamResults), reply
    assert [r.status for r in reply.results] == ["ok", "expired", "ok", "ok"]
    want = nodes.beam(torch.as_tensor(np.concatenate(prompts)), torch.tensor([len(x) for x in prompts]),
                      num_beams, steps, k)
    live = [r for r in reply.results if r.status == "ok"]
    for j, result in enumerate(live):
        got = result.arrays(num_return_sequences=k)
        np.testing.assert_array_equal(got["sequences"], want.sequences[j].numpy())
        np.testing.assert_array_equal(got["lengths"], want.lengths[j].numpy())
        np.testing.assert_allclose(got["scores"], want.scores[j].numpy(), rtol=1e-5, atol=1e-5)


def test_beam_batch_beyond_bounds_is_refused(beam_worker):
    _, client, ready = beam_worker
    too_wide = ready.bounds.max_beam_width + 1
    batch = protocol.BeamBatch(batch_id=5, token_dtype="int32", num_beams=too_wide, max_new_tokens=1,
                        num_return_sequences=1, requests=(protocol.BeamRequest("w", 1000.0, protocol.pack_ids([1, 2])),))
    client.send(batch)
    reply = client.reply_to(5)
    assert isinstance(reply, protocol.Error) and reply.code == protocol.ErrorCode.OUT_OF_BOUNDS and "num_beams" in reply.message
