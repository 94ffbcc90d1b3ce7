"""Catalogue data (shared/catalog): the trie equals the set it is built from, the trie file round-trips
and refuses malformed trees, sequences files read as before, and a set beyond the compiled table
bounds is refused naming the bound."""

import random

import numpy as np
import pytest

from shared.catalog import (CatalogBounds, CatalogTooLarge, Trie, build_trie, load_catalog, pack, read_sequences,
                            read_trie, write_trie)
from shared.catalog.__main__ import main as catalog_cli

VOCAB = 12


def random_set(seed, count=200, max_len=4):
    rng = random.Random(seed)
    return [[rng.randrange(0, 6) for _ in range(rng.randint(1, max_len))] for _ in range(count)]


def sequences_of(trie: Trie) -> set[tuple[int, ...]]:
    """Every terminal node's path, walked from the root: the set the trie holds."""
    out, stack = set(), [(0, ())]
    while stack:
        node, path = stack.pop()
        if trie.terminal[node]:
            out.add(path)
        for e in range(trie.child_start[node], trie.child_start[node + 1]):
            stack.append((int(trie.edge_child[e]), path + (int(trie.edge_token[e]),)))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_trie_holds_exactly_the_set_and_is_compact(seed):
    valid = random_set(seed)
    trie = build_trie(valid, VOCAB, 4)
    assert sequences_of(trie) == {tuple(s) for s in valid}
    assert trie.num_nodes == 1 + len({tuple(s[:i]) for s in valid for i in range(1, len(s) + 1)})
    assert trie.num_items == len({tuple(s) for s in valid})
    assert trie.child_start.dtype == np.int32 and bool((np.diff(trie.child_start) >= 0).all())


def test_a_large_vocabulary_takes_the_row_sort_and_builds_the_same_tree():
    valid = random_set(9)
    small, large = build_trie(valid, VOCAB, 4), build_trie(valid, 1 << 20, 4)  # (V+1)^4 > 2^62: np.unique rows
    assert all(np.array_equal(a, b) for a, b in zip(vars(small).values(), vars(large).values()))


def test_trie_file_round_trips_and_loads_like_its_sequences(tmp_path):
    valid = random_set(1)
    text = tmp_path / "items.txt"
    text.write_text("\n".join(" ".join(map(str, s)) for s in valid))
    assert catalog_cli(["convert", str(text), str(tmp_path / "items.npz"), "--vocab-size", str(VOCAB),
                        "--max-new-tokens", "4"]) == 0
    loaded, built = load_catalog(tmp_path / "items.npz", VOCAB, 4), load_catalog(text, VOCAB, 4)
    assert all(np.array_equal(a, b) for a, b in zip(vars(loaded).values(), vars(built).values()))


def tampered(tmp_path, **arrays):
    trie = build_trie([[1, 2], [1, 3], [4]], VOCAB, 2)
    path = tmp_path / "bad.npz"
    np.savez(path, format=np.array("boundserve-trie/1"), **(vars(trie) | arrays))
    return path


@pytest.mark.parametrize("arrays,message", [
    ({"edge_token": np.array([1, 4, 2, 99], dtype=np.int32)}, "outside the vocabulary"),
    ({"edge_child": np.array([1, 2, 3, 3], dtype=np.int32)}, "exactly one earlier node"),
    ({"edge_child": np.array([1, 0, 3, 4], dtype=np.int32)}, "exactly one earlier node"),
    ({"edge_token": np.array([4, 1, 2, 3], dtype=np.int32)}, "distinct and ascending"),
    ({"child_start": np.array([0, 2, 4, 4, 4], dtype=np.int32)}, "sizes disagree"),
    ({"terminal": np.array([False, False, False, True, True])}, "leaf node is not terminal"),
    ({"edge_child": np.array([1, 2, 3, 4], dtype=np.int64) * 1.0}, "1-D integer array"),
], ids=["vocabulary", "two-parents", "cycle", "order", "sizes", "dead-leaf", "dtype"])
def test_a_malformed_trie_file_is_refused_saying_why(tmp_path, arrays, message):
    with pytest.raises(ValueError, match=message):
        read_trie(tampered(tmp_path, **arrays), VOCAB, 2)


def test_a_trie_file_deeper_than_max_new_tokens_or_of_another_format_is_refused(tmp_path):
    path = tmp_path / "deep.npz"
    write_trie(path, build_trie([[1, 2, 3]], VOCAB, 3))
    with pytest.raises(ValueError, match="longer than max_new_tokens = 2"):
        read_trie(path, VOCAB, 2)
    np.savez(tmp_path / "other.npz", child_start=np.zeros(2, dtype=np.int32))
    with pytest.raises(ValueError, match="expected 'boundserve-trie/1'"):
        read_trie(tmp_path / "other.npz", VOCAB, 2)


def test_read_sequences_text_and_npy(tmp_path):
    text = tmp_path / "valid.txt"
    text.write_text("# semantic ids\n1 2 3\n4,5\n\n6\n")
    assert read_sequences(text) == [[1, 2, 3], [4, 5], [6]]
    array = tmp_path / "valid.npy"
    np.save(array, np.array([[1, 2, 3], [4, 5, -1]]))
    assert sequences_of(build_trie(read_sequences(array), VOCAB, 3)) == {(1, 2, 3), (4, 5)}
    text.write_text("1 2 x\n")
    with pytest.raises(ValueError, match="valid.txt:1"):
        read_sequences(text)


def test_bad_sets_are_refused():
    with pytest.raises(ValueError, match="max_new_tokens"):
        build_trie([[1, 2, 3]], VOCAB, 2)
    with pytest.raises(ValueError, match="vocabulary"):
        build_trie([[1, 99]], VOCAB, 4)
    with pytest.raises(ValueError, match="empty"):
        build_trie([], VOCAB, 4)
    with pytest.raises(ValueError, match="no gaps"):
        build_trie(np.array([[1, -1, 2]]), VOCAB, 4)


def test_a_set_beyond_the_compiled_bounds_is_refused_naming_the_bound():
    trie = build_trie(random_set(2), VOCAB, 4)
    with pytest.raises(CatalogTooLarge, match=f"beam.max_catalog_nodes = {trie.num_nodes - 1}"):
        pack({"all": trie}, CatalogBounds(trie.num_nodes - 1, 16))
    with pytest.raises(CatalogTooLarge, match=f"'all' has a node with {trie.fan_out} children, more than "
                                              f"beam.max_catalog_fanout = {trie.fan_out - 1}"):
        pack({"all": trie}, CatalogBounds(10_000, trie.fan_out - 1))
    with pytest.raises(CatalogTooLarge, match="'a' .*'b' .*beam.max_catalog_nodes"):  # together, not each alone
        pack({"a": trie, "b": trie}, CatalogBounds(trie.num_nodes * 2 - 1, 16))
    packed = pack({"a": trie, "b": trie}, CatalogBounds(trie.num_nodes * 2, 16))
    assert packed.roots == {"a": 0, "b": trie.num_nodes} and packed.terminal.size == trie.num_nodes * 2 + 1
