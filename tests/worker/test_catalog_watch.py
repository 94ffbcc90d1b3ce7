"""[beam] constraints watched: a rewritten or renamed-over file becomes the next default catalogue; an
unchanged file or a bad one changes nothing (the current version keeps serving)."""

from __future__ import annotations

import os

import pytest

from shared.catalog import CatalogBounds, build_trie, pack
from tests.builds import semantic_ids, write_sequences
from worker.catalog_store import CatalogStore
from worker.catalog_watch import CatalogWatch
from worker.logs import JsonLog

VOCAB = 64


@pytest.fixture
def watched(tmp_path):
    store = CatalogStore(CatalogBounds(2000, 60), VOCAB, 3)
    path = write_sequences(tmp_path / "items.txt", semantic_ids(1, 100, 3))
    store.swap(path)
    return store, path, CatalogWatch(store, path, 3600.0, JsonLog("test"))  # checked by hand, never by time


def tables_of(store):
    return [t.numpy().tolist() for t in store.current().tables]


def test_an_unchanged_file_is_not_reloaded(watched):
    store, _, watch = watched
    assert watch.check() is None and store.version == 1


def test_a_file_replaced_by_a_rename_becomes_the_next_version(watched, tmp_path):
    store, path, watch = watched
    items = semantic_ids(2, 120, 3)
    os.replace(write_sequences(tmp_path / "next.txt", items), path)  # how a deploy tool swaps a file atomically
    assert watch.check() == 2 and store.version == 2
    want = pack({"default": build_trie(items, VOCAB, 3)}, store.bounds)
    assert tables_of(store) == [a.tolist() for a in want.arrays()]
    assert watch.check() is None  # seen once, loaded once


def test_a_bad_file_keeps_the_current_version_until_it_changes_again(watched, tmp_path):
    store, path, watch = watched
    before = tables_of(store)
    path.write_text("not token ids\n")
    assert watch.check() is None and store.version == 1 and tables_of(store) == before
    assert watch.check() is None  # the same bad file is not tried again
    write_sequences(path, semantic_ids(3, 50, 2))
    assert watch.check() == 2


def test_a_catalogue_beyond_the_compiled_tables_is_refused(watched):
    store, path, watch = watched
    write_sequences(path, semantic_ids(4, 3000, 3))  # more trie nodes than the 2000 compiled
    assert watch.check() is None and store.version == 1


def test_the_thread_starts_and_stops(watched):
    _, _, watch = watched
    watch.start()
    watch.stop()
    assert not watch._thread.is_alive()
