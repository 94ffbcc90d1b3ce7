"""The worker's catalogue store on its own (no node): versions, named catalogues packed together, a failed
update leaving the current version serving, and the CatalogSwap answers built from it."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from shared import protocol
from shared.catalog import CatalogBounds, CatalogTooLarge, build_trie, pack
from tests.builds import semantic_ids, write_sequences
from worker.catalog_admin import swap_answer
from worker.catalog_store import CatalogStore, UnknownCatalog

VOCAB = 64


def store(max_nodes=2000, max_fanout=60) -> CatalogStore:
    return CatalogStore(CatalogBounds(max_nodes, max_fanout), VOCAB, 3)


def test_each_update_is_a_new_version_whose_tables_are_the_packed_catalogues(tmp_path):
    catalogs = store()
    assert catalogs.current() is None and catalogs.version == 0
    de, fr = semantic_ids(1, 100, 3), semantic_ids(2, 80, 2)
    assert catalogs.swap(write_sequences(tmp_path / "de.txt", de)) == 1
    assert catalogs.swap(write_sequences(tmp_path / "fr.txt", fr), name="fr") == 2
    current = catalogs.current()
    want = pack({"default": build_trie(de, VOCAB, 3), "fr": build_trie(fr, VOCAB, 3)}, catalogs.bounds)
    assert dict(current.roots) == want.roots
    assert all(np.array_equal(t.numpy(), a) for t, a in zip(current.tables, want.arrays()))
    roots = current.node_inputs(["fr", "", "default"])[0]
    assert roots.tolist() == [want.roots["fr"], 0, 0]
    assert catalogs.remove("fr") == 3 and set(catalogs.current().roots) == {"default"}
    with pytest.raises(UnknownCatalog, match="catalogue 'fr' is not loaded \\(loaded: default\\)"):
        catalogs.current().root("fr")


def test_a_batch_keeps_the_version_it_started_on(tmp_path):
    catalogs = store()
    catalogs.swap(write_sequences(tmp_path / "a.txt", semantic_ids(3, 50, 3)))
    held = catalogs.current()  # what a running batch holds
    tables = [t.clone() for t in held.tables]
    catalogs.swap(write_sequences(tmp_path / "b.txt", semantic_ids(4, 50, 3)))
    assert catalogs.current() is not held and held.version == 1
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(held.tables, tables))  # never written in place


def test_a_failed_update_leaves_the_current_version(tmp_path):
    catalogs = store(max_nodes=300)
    catalogs.swap(write_sequences(tmp_path / "ok.txt", semantic_ids(5, 60, 3)))
    before = catalogs.current()
    with pytest.raises(CatalogTooLarge, match="beam.max_catalog_nodes = 300"):
        catalogs.update({"big": write_sequences(tmp_path / "big.txt", semantic_ids(6, 400, 3))})
    with pytest.raises(ValueError, match="token id 99 is outside the vocabulary"):
        catalogs.update({"default": write_sequences(tmp_path / "bad.txt", [[1, 99]])})
    with pytest.raises(UnknownCatalog, match="cannot unload 'nope': not loaded"):
        catalogs.update({}, unload=("nope",))
    with pytest.raises(ValueError, match="a catalogue name has 1 to 64 characters"):
        catalogs.update({"x" * 65: tmp_path / "ok.txt"})
    assert catalogs.current() is before


def test_concurrent_updates_each_make_one_version_and_none_is_lost(tmp_path):
    catalogs = store(max_nodes=20_000)
    files = {f"m{i}": write_sequences(tmp_path / f"m{i}.txt", semantic_ids(10 + i, 60, 3)) for i in range(6)}
    threads = [threading.Thread(target=catalogs.swap, args=(path, name)) for name, path in files.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert catalogs.version == 6 and set(catalogs.current().roots) == set(files)


def test_swap_answers_name_the_version_or_why_nothing_changed(tmp_path):
    catalogs = store()
    path = write_sequences(tmp_path / "de.txt", semantic_ids(7, 40, 3))
    answer = swap_answer(catalogs, protocol.CatalogSwap("s1", load={"de": str(path)}))
    assert (answer.version, answer.error, answer.items, answer.max_nodes) == (1, "", {"de": 40}, 2000)
    answer = swap_answer(catalogs, protocol.CatalogSwap("s2", load={"de": str(tmp_path / "missing.txt")}))
    assert answer.version == 1 and "missing.txt" in answer.error
    answer = swap_answer(None, protocol.CatalogSwap("s3", load={"de": str(path)}))
    assert answer.version == 0 and "unconstrained" in answer.error
    frames = protocol.encode(answer)
    assert protocol.decode(frames) == answer
