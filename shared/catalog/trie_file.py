"""The compact file of one catalogue: its prefix tree (shared/catalog/trie.py) as an uncompressed .npz.

    format       str    "boundserve-trie/1"
    child_start  [N + 1] int32, edge_token [E] int32, edge_child [E] int32, terminal [N] bool

Made offline from a sequences file (`python -m shared.catalog convert`); loading one is a read of
four arrays and a vectorised check, where building the tree from 1M sequences sorts them first.
A file is checked as untrusted: a malformed tree could send a beam anywhere in the tables.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shared.catalog.trie import Trie, build_trie, read_sequences

FORMAT = "boundserve-trie/1"
SUFFIX = ".npz"


def write_trie(path: str | Path, trie: Trie) -> None:
    """Write `trie` to `path` (a .npz; written beside and renamed, so a reader never sees half a file)."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "wb") as out:
        np.savez(out, format=np.array(FORMAT), child_start=trie.child_start, edge_token=trie.edge_token,
                 edge_child=trie.edge_child, terminal=trie.terminal)
    partial.replace(path)


def read_trie(path: str | Path, vocab_size: int, max_len: int) -> Trie:
    """A trie file, checked: a well-formed tree, ids in the vocabulary, no sequence over max_len."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError) as exc:
        raise ValueError(f"{path}: not a readable .npz trie file: {exc}") from None
    if str(arrays.get("format", "")) != FORMAT:
        raise ValueError(f"{path}: format is {str(arrays.get('format', 'missing'))!r}, expected {FORMAT!r} "
                         "(write it with `python -m shared.catalog convert`)")
    trie = Trie(*(_array(path, arrays, name, kind) for name, kind in
                  (("child_start", "i"), ("edge_token", "i"), ("edge_child", "i"), ("terminal", "b"))))
    problem = _tree_problem(trie, vocab_size, max_len)
    if problem:
        raise ValueError(f"{path}: {problem}")
    return trie


def load_catalog(path: str | Path, vocab_size: int, max_len: int) -> Trie:
    """The catalogue in `path`: a trie file (.npz) or a sequences file (text or .npy), built here."""
    path = Path(path)
    if path.suffix == SUFFIX:
        return read_trie(path, vocab_size, max_len)
    try:
        return build_trie(read_sequences(path), vocab_size, max_len)
    except ValueError as exc:
        message = str(exc)
        raise ValueError(message if message.startswith(f"{path}") else f"{path}: {message}") from None


def _array(path: Path, arrays: dict, name: str, kind: str) -> np.ndarray:
    """arrays[name] as a 1-D int32 (kind "i") or bool ("b") array, or a ValueError naming it."""
    if name not in arrays:
        raise ValueError(f"{path}: no array {name!r}")
    array = arrays[name]
    if array.ndim != 1 or array.dtype.kind not in ("iu" if kind == "i" else "b"):
        raise ValueError(f"{path}: {name} must be a 1-D {'integer' if kind == 'i' else 'bool'} array, "
                         f"got {array.dtype} {list(array.shape)}")
    if kind == "i" and array.size and (array.min() < np.iinfo(np.int32).min or array.max() > np.iinfo(np.int32).max):
        raise ValueError(f"{path}: {name} holds values outside int32")
    return array.astype(np.int32) if kind == "i" else array


def _tree_problem(trie: Trie, vocab_size: int, max_len: int) -> str | None:
    """Why `trie` is not a prefix tree the node can walk (None: it is)."""
    n, e = trie.terminal.size, trie.edge_token.size
    start, child, token = trie.child_start, trie.edge_child, trie.edge_token
    if n < 2 or start.size != n + 1 or child.size != e:
        return (f"sizes disagree or the tree is empty: {n} nodes, child_start {start.size} (nodes + 1), "
                f"{e} edge tokens, {child.size} edge children")
    if start[0] != 0 or start[-1] != e or (np.diff(start) < 0).any():
        return "child_start must rise from 0 to the number of edges"
    if e != n - 1:
        return f"{e} edges for {n} nodes: a tree has one edge into every node but the root"
    parent = np.repeat(np.arange(n, dtype=np.int64), np.diff(start))  # [E]
    if (child <= parent).any() or child.max() >= n or (np.bincount(child, minlength=n)[1:] != 1).any():
        return "every node but the root must be the child of exactly one earlier node"
    if token.min() < 0 or token.max() >= vocab_size:
        return f"an edge token is outside the vocabulary [0, {vocab_size})"
    same_node = parent[1:] == parent[:-1]
    if (same_node & (token[1:] <= token[:-1])).any():
        return "one node's edge tokens must be distinct and ascending"
    if trie.terminal[0]:
        return "the root is terminal: an empty sequence is not a valid output"
    if (~trie.terminal & (np.diff(start) == 0)).any():
        return "a leaf node is not terminal: a prefix that no valid sequence completes"
    depth = np.zeros(n, dtype=np.int64)
    for _ in range(max_len + 1):  # children follow parents, so depth d is right after d passes
        depth[child] = depth[parent] + 1
    if depth.max() > max_len:
        return f"a valid sequence is longer than max_new_tokens = {max_len}"
    return None
