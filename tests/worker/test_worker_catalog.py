"""Catalogues through a real worker on a constrained beam node: the results carry the catalogue version
that served them and equal the node called directly on that version; CatalogSwap loads new catalogues
(and markets beside them) between batches without a restart; bad swaps and unknown names are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shared import protocol
from shared.catalog import build_trie, write_trie
from tests.builds import CATALOG_BOUNDS, VALID, semantic_ids, write_sequences

NEXT = semantic_ids(51, 250, 3) + semantic_ids(52, 20, 2)
FR = semantic_ids(53, 100, 3)
PROMPTS = [np.arange(20, 27), np.arange(100, 103), np.arange(7, 16)]


@pytest.fixture(scope="module")
def catalog_worker(constrained_beam_artifacts, tmp_path_factory, worker_process_class, client_class):
    from worker.runtime.loader import load_nodes

    folder = tmp_path_factory.mktemp("catalog-worker")
    start = write_sequences(folder / "valid.txt", VALID)
    lines = ["enabled = true", f'constraints = "{start}"'] + [f"{k} = {v}" for k, v in CATALOG_BOUNDS.items()]
    worker = worker_process_class(constrained_beam_artifacts, folder, beam_lines="\n".join(lines))
    client = client_class(worker.endpoint)
    ready = client.hello()
    assert isinstance(ready, protocol.Ready), worker.log()
    yield load_nodes(constrained_beam_artifacts, "cpu"), client, folder, worker
    client.close()
    worker.kill()


def direct(nodes, files: dict, names: list[str], num_beams: int = 4, k: int = 3):
    """The node called in this process on a catalogue store holding `files` (what a version holds)."""
    from worker.catalog_store import CatalogStore

    store = CatalogStore.for_manifest(nodes.manifest, "cpu")
    store.update(files)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(names))]
    return nodes.beam(torch.as_tensor(np.concatenate(prompts)), torch.tensor([len(x) for x in prompts]),
                      num_beams, 3, k, catalog=store.current().node_inputs(names))


def beam_batch(batch_id: int, names: list[str], num_beams: int = 4, k: int = 3) -> protocol.BeamBatch:
    requests = tuple(protocol.BeamRequest(f"r{batch_id}-{i}", 60_000.0, protocol.pack_ids(PROMPTS[i % len(PROMPTS)], "int64"),
                                   catalog=name) for i, name in enumerate(names))
    return protocol.BeamBatch(batch_id=batch_id, token_dtype="int64", num_beams=num_beams, max_new_tokens=3,
                       num_return_sequences=k, requests=requests)


def assert_same(results, want, k: int = 3) -> None:
    for j, result in enumerate(results):
        got = result.arrays(num_return_sequences=k)
        np.testing.assert_array_equal(got["sequences"], want.sequences[j].numpy())
        np.testing.assert_array_equal(got["lengths"], want.lengths[j].numpy())
        np.testing.assert_allclose(got["scores"], want.scores[j].numpy(), rtol=1e-5, atol=1e-5)


def swap(client, request_id: str, **fields) -> protocol.CatalogState:
    client.send(protocol.CatalogSwap(request_id=request_id, **fields))
    return client.recv_where(lambda m: isinstance(m, protocol.CatalogState) and m.request_id == request_id, 60.0)


def test_catalogues_swap_between_batches_and_each_result_names_the_version_that_served_it(catalog_worker):
    nodes, client, folder, _ = catalog_worker
    client.send(beam_batch(1, ["", "default", "nope"]))
    reply = client.reply_to(1)
    assert [r.status for r in reply.results] == ["ok", "ok", "error"], reply
    assert "catalogue 'nope' is not loaded (loaded: default)" in reply.results[2].error
    version = reply.results[0].catalog_version
    assert version >= 1 and reply.results[1].catalog_version == version
    assert_same(reply.results[:2], direct(nodes, {"default": folder / "valid.txt"}, ["", ""]))

    trie = folder / "next.npz"
    write_trie(trie, build_trie(NEXT, nodes.manifest.model.vocab_size, 3))
    files = {"default": trie, "fr": write_sequences(folder / "fr.txt", FR)}
    state = swap(client, "swap-1", load={name: str(path) for name, path in files.items()})
    assert not state.error and state.version == version + 1
    assert state.items == {"default": len({tuple(s) for s in NEXT}), "fr": len({tuple(s) for s in FR})}
    assert 0 < state.nodes <= state.max_nodes == CATALOG_BOUNDS["max_catalog_nodes"]
    client.send(beam_batch(2, ["fr", "", "fr"]))
    reply = client.reply_to(2)
    assert [r.catalog_version for r in reply.results] == [state.version] * 3
    assert_same(reply.results, direct(nodes, files, ["fr", "", "fr"]))


def test_a_batch_sent_during_a_swap_runs_wholly_on_one_version(catalog_worker):
    """A batch before the swap message, one after: whichever version served each (the swap runs beside
    the batches), every request of it equals the node on that version's catalogues."""
    nodes, client, folder, _ = catalog_worker
    before = swap(client, "swap-a", load={"default": str(write_sequences(folder / "a.txt", semantic_ids(61, 200, 3)))})
    assert not before.error
    files = {before.version: {"default": folder / "a.txt"}, before.version + 1: {"default": folder / "b.txt"}}
    write_sequences(folder / "b.txt", semantic_ids(62, 220, 3))
    client.send(beam_batch(3, ["", "", ""]))
    client.send(protocol.CatalogSwap(request_id="swap-b", load={"default": str(folder / "b.txt")}))
    client.send(beam_batch(4, ["", "", ""]))
    replies = [client.reply_to(3), client.reply_to(4)]
    state = client.recv_where(lambda m: isinstance(m, protocol.CatalogState) and m.request_id == "swap-b", 60.0)
    assert state.version == before.version + 1
    for reply in replies:
        versions = {r.catalog_version for r in reply.results}
        assert len(versions) == 1 and versions <= set(files), versions
        assert_same(reply.results, direct(nodes, files[versions.pop()], ["", "", ""]))


def test_a_swap_beyond_the_compiled_tables_or_of_a_bad_file_is_refused_and_the_current_version_serves(
        catalog_worker):
    nodes, client, folder, worker = catalog_worker
    client.send(beam_batch(5, [""]))
    version = client.reply_to(5).results[0].catalog_version
    big = write_sequences(folder / "big.txt", semantic_ids(71, 2500, 3))
    state = swap(client, "swap-big", load={"big": str(big)})
    assert state.version == version and "beam.max_catalog_nodes = 2,048 the beam node was compiled for" in state.error
    bad = folder / "bad.txt"
    bad.write_text("1 2 3\n4 x\n")
    state = swap(client, "swap-bad", load={"default": str(bad)})
    assert state.version == version and f"{bad}:2: expected token ids" in state.error
    state = swap(client, "swap-missing", unload=("nowhere",))
    assert state.version == version and "cannot unload 'nowhere': not loaded" in state.error
    client.send(beam_batch(6, [""]))
    assert client.reply_to(6).results[0].catalog_version == version
    assert "catalog_refused" in worker.log()


def test_a_swap_from_a_peer_that_has_not_said_hello_is_refused(catalog_worker, client_class):
    _, _, folder, worker = catalog_worker
    stranger = client_class(worker.endpoint, gateway_id="stranger")
    try:
        stranger.send(protocol.CatalogSwap(request_id="sneaky", load={"default": str(folder / "valid.txt")}))
        reply = stranger.recv_where(lambda m: isinstance(m, (protocol.Error, protocol.CatalogState)))
        assert isinstance(reply, protocol.Error) and reply.code == protocol.ErrorCode.HELLO_REQUIRED
    finally:
        stranger.close()
