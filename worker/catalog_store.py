"""The worker's catalogues for constrained beam search: loaded from files, versioned, swapped whole.

The beam node takes its prefix tables as inputs (compile/beam/module.py), so a catalogue is data: the
store holds the current `Catalog` (every named sub-catalogue packed into one table set on the node's
device, shared/catalog/layout.py) and replaces it with a new one in one reference assignment. A batch
reads `current()` once and runs on that catalogue to its end, so a swap takes effect between batches
and never inside one; the answer carries the version that served it. Building the next catalogue
(reading and checking files, packing, copying to the device) happens beside the running batches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from shared.catalog import DEFAULT_CATALOG, CatalogBounds, Trie, load_catalog, pack
from shared.manifest import Manifest
from shared.protocol import MAX_CATALOG_NAME_CHARS


class UnknownCatalog(ValueError):
    """A request named a catalogue that is not loaded."""


@dataclass(frozen=True)
class CatalogSummary:
    """What one swap left loaded: for logs and the admin answer."""

    version: int
    items: dict[str, int]
    """Valid sequences per loaded catalogue."""
    nodes: int
    """Trie nodes of all of them together (at most max_nodes)."""
    max_nodes: int
    load_s: float
    """Seconds from reading the file to the new catalogue being current."""


@dataclass(frozen=True)
class Catalog:
    """One immutable version: the loaded catalogues' trees and their packed tables on the device."""

    version: int
    tries: Mapping[str, Trie]
    roots: Mapping[str, int]
    tables: tuple[torch.Tensor, ...]
    """child_start, edge_token, edge_child, edge_ends, terminal (shared/catalog/layout.py), on the device."""

    def root(self, name: str) -> int:
        """The root row of catalogue `name` ("" names the default one)."""
        name = name or DEFAULT_CATALOG
        if name not in self.roots:
            raise UnknownCatalog(f"catalogue {name!r} is not loaded (loaded: {', '.join(sorted(self.roots))})")
        return self.roots[name]

    def node_inputs(self, names: Sequence[str]) -> tuple[torch.Tensor, ...]:
        """The beam node's catalogue inputs for requests naming `names`: roots [R] int64 (host), tables."""
        return (torch.tensor([self.root(n) for n in names], dtype=torch.int64), *self.tables)


class CatalogStore:
    """The current catalogue of one worker; `swap` and `remove` make a new version (one writer at a time)."""

    def __init__(self, bounds: CatalogBounds, vocab_size: int, max_len: int, device: str = "cpu") -> None:
        self.bounds = bounds  # the table sizes compiled into the beam node (its manifest facts)
        self.vocab_size = vocab_size
        self.max_len = max_len  # bounds.max_new_tokens: the longest sequence the node can produce
        self.device = torch.device(device)
        self._writer = threading.Lock()
        self._current: Catalog | None = None

    @classmethod
    def for_manifest(cls, manifest: Manifest, device: str) -> CatalogStore | None:
        """The store for an artifacts folder's beam node (None: no beam node, or an unconstrained one)."""
        facts = manifest.node_table().beam
        if facts is None or not facts.constrained:
            return None
        return cls(CatalogBounds(facts.max_catalog_nodes, facts.max_catalog_fanout), manifest.model.vocab_size,
                   facts.max_steps, device)

    def current(self) -> Catalog | None:
        """The catalogue a batch starting now runs on (None: none loaded yet)."""
        return self._current

    @property
    def version(self) -> int:
        """0 before the first load; +1 with every swap or removal."""
        return 0 if self._current is None else self._current.version

    def swap(self, path: str | Path, name: str = DEFAULT_CATALOG) -> int:
        """Load catalogue `name` from `path` (a trie .npz or a sequences file) in place of the one of that
        name (or beside the others), atomically; returns the new version. A file that is bad or a set
        that no longer fits the compiled tables raises ValueError and leaves the current one serving."""
        return self.update({name: path}).version

    def remove(self, name: str) -> int:
        """Unload catalogue `name` (requests naming it are refused from the next batch on); the new version."""
        return self.update({}, unload=(name,)).version

    def update(self, load: Mapping[str, str | Path], unload: Sequence[str] = ()) -> CatalogSummary:
        """Load several catalogues and unload others as one new version; ValueError (CatalogTooLarge,
        UnknownCatalog, a bad file) leaves the current version serving."""
        started = time.perf_counter()
        for name in load:
            if not name or len(name) > MAX_CATALOG_NAME_CHARS:
                raise ValueError(f"a catalogue name has 1 to {MAX_CATALOG_NAME_CHARS} characters, got {name!r}")
        loaded = {name: load_catalog(path, self.vocab_size, self.max_len) for name, path in load.items()}
        with self._writer:
            tries = dict(self._current.tries) if self._current is not None else {}
            missing = [name for name in unload if name not in tries]
            if missing:
                raise UnknownCatalog(f"cannot unload {', '.join(map(repr, missing))}: not loaded")
            for name in unload:
                del tries[name]
            return self._install(tries | loaded, started)

    def _install(self, tries: dict[str, Trie], started: float) -> CatalogSummary:
        packed = pack(tries, self.bounds)  # CatalogTooLarge names the bound
        tables = tuple(torch.from_numpy(a).to(self.device) for a in packed.arrays())
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # the copies land before any batch reads them
        version = self.version + 1
        self._current = Catalog(version, tries, packed.roots, tables)  # the swap: one assignment
        return CatalogSummary(version, {n: t.num_items for n, t in tries.items()},
                              sum(t.num_nodes for t in tries.values()), self.bounds.max_nodes,
                              time.perf_counter() - started)
