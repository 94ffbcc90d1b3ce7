"""The prefix tables as node inputs and the tensor mask equal a brute-force reading of the valid set,
for one catalogue and for several packed into one table set (each request at its own root)."""

import random

import pytest
import torch

from compile.beam.processors import PrefixConstraint, PrefixTables, build_tables
from shared.catalog import CatalogBounds, build_trie, pack

VOCAB = 12
EOS = (11,)


def random_set(seed, count=30, max_len=4):
    rng = random.Random(seed)
    return [[rng.randrange(0, 6) for _ in range(rng.randint(1, max_len))] for _ in range(count)]


def brute_allowed(valid, prefix, last_step):
    """Allowed next tokens of `prefix`, straight from the definition."""
    n = len(prefix)
    allowed = {s[n] for s in valid if len(s) > n and s[:n] == prefix and (not last_step or len(s) == n + 1)}
    if prefix in valid:
        allowed |= set(EOS)
    return allowed


def node_of(constraint, tables, prefix, root=0):
    """Walk the tables with `advance`, one token at a time, as the beam node does."""
    nodes = constraint.start(torch.tensor([root]))
    for token in prefix:
        nodes = constraint.advance(tables, nodes, torch.zeros(1, 1, dtype=torch.int64), torch.tensor([[token]]))
    return nodes


def prefixes_of(valid, seed):
    prefixes = {tuple(s[:i]) for s in valid for i in range(len(s) + 1)}
    rng = random.Random(seed)
    return prefixes | {tuple(rng.randrange(0, 6) for _ in range(rng.randint(1, 3))) for _ in range(20)}  # mostly invalid


@pytest.mark.parametrize("seed", range(6))
def test_mask_equals_brute_force(seed):
    valid = random_set(seed)
    tables = build_tables(valid, VOCAB, 4, max_nodes=200, max_fanout=8)  # padded past the set's own size
    constraint = PrefixConstraint(8, EOS)
    for prefix in sorted(prefixes_of(valid, seed)):
        nodes = node_of(constraint, tables, list(prefix))
        for last in (False, True):
            got = constraint.allowed(tables, nodes, VOCAB, torch.tensor(last))[0, 0]
            want = brute_allowed(valid, list(prefix), last)
            assert set(torch.nonzero(got).flatten().tolist()) == want, (prefix, last)


def test_catalogues_packed_together_each_answer_from_its_own_root():
    sets = {name: random_set(seed) for seed, name in enumerate(("de", "fr", "us"))}
    packed = pack({name: build_trie(valid, VOCAB, 4) for name, valid in sets.items()}, CatalogBounds(400, 6))
    tables = PrefixTables.from_numpy(packed.arrays())
    constraint = PrefixConstraint(6, EOS)
    assert packed.roots["de"] == 0 and len(set(packed.roots.values())) == 3
    for seed, (name, valid) in enumerate(sets.items()):
        for prefix in sorted(prefixes_of(valid, seed)):
            nodes = node_of(constraint, tables, list(prefix), packed.roots[name])
            for last in (False, True):
                got = constraint.allowed(tables, nodes, VOCAB, torch.tensor(last))[0, 0]
                assert set(torch.nonzero(got).flatten().tolist()) == brute_allowed(valid, list(prefix), last)


def test_mask_sets_minus_inf_and_keeps_allowed_values():
    valid = [[1, 2], [1, 3], [4]]
    tables = build_tables(valid, VOCAB, 2)
    constraint = PrefixConstraint(2, EOS)
    log_probs = torch.randn(1, 2, VOCAB)
    nodes = torch.cat([node_of(constraint, tables, []), node_of(constraint, tables, [1])], dim=1)  # [1, 2]
    masked = constraint.mask(tables, log_probs, nodes, 1, torch.tensor(2))
    assert torch.isfinite(masked[0, 0]).nonzero().flatten().tolist() == [1, 4]
    assert torch.isfinite(masked[0, 1]).nonzero().flatten().tolist() == [2, 3]
    assert torch.equal(masked[0, 0, [1, 4]], log_probs[0, 0, [1, 4]])


def test_a_token_off_the_tree_leads_to_the_dead_end_which_allows_nothing():
    tables = build_tables([[1, 2]], VOCAB, 2, max_nodes=10, max_fanout=2)
    constraint = PrefixConstraint(2, EOS)
    nodes = node_of(constraint, tables, [5])
    assert int(nodes) == tables.terminal.numel() - 1
    assert not constraint.allowed(tables, nodes, VOCAB, torch.tensor(False)).any()
