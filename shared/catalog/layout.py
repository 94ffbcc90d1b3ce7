"""Several named catalogues packed into the fixed-size tables the compiled beam node takes as inputs.

The node is compiled once for `[beam] max_catalog_nodes` (trie nodes of every loaded catalogue
together) and `max_catalog_fanout` (most children of any node: the edges it scans per beam and
step); any catalogue set within them runs on the same package. The tables have rows = max_nodes + 1
(the last row is the dead end a beam falls into when it leaves every catalogue):
    child_start [rows + 1] int32  CSR over the edges (padding and dead rows: no edges)
    edge_token  [rows] int32      the token of each edge (padding: 0)
    edge_child  [rows] int32      the node it leads to (padding: the dead end)
    edge_ends   [rows] bool       that node is a complete valid sequence
    terminal    [rows] bool       the node is a complete valid sequence (EOS may follow it)
The catalogues' trees follow one another; `roots` maps each name to its root row, where a request
that names it starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from shared.catalog.trie import Trie


DEFAULT_CATALOG = "default"
"""The catalogue `[beam] constraints` loads at start, and the one a request that names none is served by."""


class CatalogTooLarge(ValueError):
    """A catalogue set that does not fit the tables the beam node was compiled for; names the bound."""


@dataclass(frozen=True)
class CatalogBounds:
    """The table sizes compiled into the beam node (the manifest's beam facts)."""

    max_nodes: int
    max_fanout: int

    @property
    def rows(self) -> int:
        """Rows of every node table: the nodes and the dead end."""
        return self.max_nodes + 1

    def check(self, tries: Mapping[str, Trie]) -> None:
        """Raise CatalogTooLarge naming the bound a set of catalogues breaks."""
        for name, trie in tries.items():
            if trie.fan_out > self.max_fanout:
                raise CatalogTooLarge(
                    f"catalogue {name!r} has a node with {trie.fan_out} children, more than "
                    f"beam.max_catalog_fanout = {self.max_fanout} the beam node was compiled for: rebuild with a "
                    "larger max_catalog_fanout")
        total = sum(trie.num_nodes for trie in tries.values())
        if total > self.max_nodes:
            sizes = ", ".join(f"{name!r} {trie.num_nodes:,}" for name, trie in tries.items())
            raise CatalogTooLarge(
                f"the catalogues hold {total:,} trie nodes together ({sizes}), more than "
                f"beam.max_catalog_nodes = {self.max_nodes:,} the beam node was compiled for: rebuild with a "
                "larger max_catalog_nodes, or load fewer or smaller catalogues")


@dataclass(frozen=True)
class PackedTables:
    """The node's table inputs (see the module docstring) and the root row of each catalogue."""

    child_start: np.ndarray
    edge_token: np.ndarray
    edge_child: np.ndarray
    edge_ends: np.ndarray
    terminal: np.ndarray
    roots: dict[str, int]

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The five tables in the node's input order."""
        return self.child_start, self.edge_token, self.edge_child, self.edge_ends, self.terminal


def pack(tries: Mapping[str, Trie], bounds: CatalogBounds) -> PackedTables:
    """One table set holding every catalogue of `tries` (checked against `bounds` first)."""
    bounds.check(tries)
    rows = bounds.rows
    dead = rows - 1
    child_start = np.empty(rows + 1, dtype=np.int32)
    edge_token = np.zeros(rows, dtype=np.int32)
    edge_child = np.full(rows, dead, dtype=np.int32)
    terminal = np.zeros(rows, dtype=bool)
    roots, node, edge = {}, 0, 0
    for name, trie in tries.items():
        n, e = trie.num_nodes, trie.edge_token.size
        roots[name] = node
        child_start[node : node + n] = trie.child_start[:-1] + edge
        edge_token[edge : edge + e] = trie.edge_token
        edge_child[edge : edge + e] = trie.edge_child + node
        terminal[node : node + n] = trie.terminal
        node, edge = node + n, edge + e
    child_start[node:] = edge  # padding rows and the dead end: no edges
    return PackedTables(child_start, edge_token, edge_child, terminal[edge_child], terminal, roots)
