"""The prefix tree of a set of valid sequences, as flat CSR arrays (numpy, vectorised).

Nodes are numbered depth by depth (node 0 = the empty prefix), so every edge leads to a node with a
larger number than its parent's:
    child_start [N + 1] int32   the edges of node n are child_start[n] : child_start[n + 1]
    edge_token  [E] int32       the token of each edge (distinct among one node's edges, ascending)
    edge_child  [E] int32       the node it leads to
    terminal    [N] bool        the node is a complete valid sequence (EOS may follow it)
E = N - 1: every node but the root has exactly one parent edge.

Sequences files (the format `[beam] constraints` has always read): text, one sequence of token ids
per line separated by spaces or commas (`#` starts a comment line), or a .npy int array [N, L]
padded with -1.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Trie:
    """One catalogue's prefix tree (see the module docstring for the arrays)."""

    child_start: np.ndarray  # [N + 1] int32
    edge_token: np.ndarray  # [E] int32
    edge_child: np.ndarray  # [E] int32
    terminal: np.ndarray  # [N] bool

    @property
    def num_nodes(self) -> int:
        return int(self.terminal.size)

    @property
    def num_items(self) -> int:
        """Valid sequences: the terminal nodes."""
        return int(self.terminal.sum())

    @property
    def fan_out(self) -> int:
        """Most children of any node: the work per beam and step."""
        return int(np.diff(self.child_start).max(initial=0))


def read_sequences(path: str | Path) -> list[list[int]] | np.ndarray:
    """Valid sequences from a text file (a list of id lists) or a .npy array ([N, L], -1 padded)."""
    path = Path(path)
    if path.suffix == ".npy":
        rows = np.load(path, allow_pickle=False)
        if rows.ndim != 2 or rows.dtype.kind not in "iu":
            raise ValueError(f"{path}: expected a 2-D integer array [sequences, length] padded with -1, "
                             f"got {rows.dtype} {list(rows.shape)}")
        return rows
    sequences = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.replace(",", " ").strip()
        if not line or line.startswith("#"):
            continue
        try:
            sequences.append([int(t) for t in line.split()])
        except ValueError:
            raise ValueError(f"{path}:{number}: expected token ids separated by spaces, got {line[:60]!r}") from None
    return sequences


def build_trie(sequences: list[list[int]] | np.ndarray, vocab_size: int, max_len: int) -> Trie:
    """The prefix tree of `sequences` (duplicates allowed; every sequence 1..max_len ids < vocab_size)."""
    rows = _as_padded(sequences, vocab_size, max_len)  # [N, L] int64, -1 padded, sorted, unique
    lens = (rows >= 0).sum(1)
    n, width = rows.shape
    first_diff = np.zeros(n, dtype=np.int64)  # first column where row i differs from row i - 1
    if n > 1:
        differs = rows[1:] != rows[:-1]
        first_diff[1:] = np.where(differs.any(1), differs.argmax(1), width)
    node_of_row = np.zeros(n, dtype=np.int64)  # the node of each row's prefix at the current depth
    parents, tokens, children, terminal_nodes = [], [], [], [node_of_row[lens == 0]]
    next_id = 1
    for depth in range(width):
        has = lens > depth
        starts = has & (first_diff <= depth)
        child_of_row = next_id + np.cumsum(starts) - 1
        parents.append(node_of_row[starts])
        tokens.append(rows[starts, depth])
        children.append(child_of_row[starts])
        next_id += int(starts.sum())
        node_of_row = np.where(has, child_of_row, -1)
        terminal_nodes.append(node_of_row[lens == depth + 1])
    terminal = np.zeros(next_id, dtype=bool)
    terminal[np.concatenate(terminal_nodes)] = True
    parent = np.concatenate(parents)
    return Trie(
        child_start=np.searchsorted(parent, np.arange(next_id + 1)).astype(np.int32),
        edge_token=np.concatenate(tokens).astype(np.int32),
        edge_child=np.concatenate(children).astype(np.int32),
        terminal=terminal,
    )


def _as_padded(sequences, vocab_size: int, max_len: int) -> np.ndarray:
    """[N, L] int64, -1 padded, sorted lexicographically (pads first, so a prefix precedes its
    extensions) and unique; refuses an empty set, empty or gapped rows, long rows, ids out of range."""
    if isinstance(sequences, np.ndarray):
        rows = sequences.astype(np.int64)
    else:
        width = max((len(s) for s in sequences), default=0)
        rows = np.full((len(sequences), width), -1, dtype=np.int64)
        for i, s in enumerate(sequences):
            rows[i, : len(s)] = s
    if rows.size == 0:
        raise ValueError("the set of valid sequences is empty")
    rows = np.where(rows < 0, -1, rows)
    lens = (rows >= 0).sum(1)
    if (lens == 0).any() or (rows[:, :-1] < 0).__and__(rows[:, 1:] >= 0).any():
        raise ValueError("every valid sequence needs at least one token and no gaps")
    if int(lens.max()) > max_len:
        raise ValueError(f"a valid sequence has {int(lens.max())} tokens; max_new_tokens is {max_len}")
    rows = rows[:, : int(lens.max())]
    if rows.max() >= vocab_size:
        raise ValueError(f"token id {int(rows.max())} is outside the vocabulary [0, {vocab_size})")
    return _unique_rows(rows, vocab_size)


def _unique_rows(rows: np.ndarray, vocab_size: int) -> np.ndarray:
    """np.unique(rows, axis=0), through one int64 key per row when (vocab + 1) ** L fits (several
    times faster on millions of rows: a 1-D sort instead of a lexsort of row views)."""
    base = vocab_size + 1
    if rows.shape[1] * np.log2(base) >= 62:
        return np.unique(rows, axis=0)
    keys = np.zeros(rows.shape[0], dtype=np.int64)
    for column in rows.T:  # -1 pads -> digit 0, ids -> 1..vocab: the key orders rows as np.unique does
        keys = keys * base + (column + 1)
    keys = np.unique(keys)
    out = np.empty((keys.size, rows.shape[1]), dtype=np.int64)
    for j in range(rows.shape[1] - 1, -1, -1):
        keys, digit = np.divmod(keys, base)
        out[:, j] = digit - 1
    return out
