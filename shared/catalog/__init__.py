"""Catalogues for constrained beam search: the valid output sequences of a generative-retrieval
deployment, as data the beam node reads at run time rather than code compiled into it.

    trie.py       the prefix tree of a set of sequences as flat CSR arrays (numpy), and the
                  sequences files it is made from
    trie_file.py  the compact file format of one tree (.npz), written offline, read by the worker
    layout.py     several named trees packed into the fixed-size tables the beam node takes, and
                  the compiled bounds they must fit

numpy only: the offline converter, the build's early check and the worker all use it.
"""

from shared.catalog.layout import DEFAULT_CATALOG, CatalogBounds, CatalogTooLarge, PackedTables, pack
from shared.catalog.trie import Trie, build_trie, read_sequences
from shared.catalog.trie_file import load_catalog, read_trie, write_trie

__all__ = ["DEFAULT_CATALOG", "CatalogBounds", "CatalogTooLarge", "PackedTables", "Trie", "build_trie", "load_catalog",
           "pack", "read_sequences", "read_trie", "write_trie"]
