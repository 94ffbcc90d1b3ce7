"""The offline prefix tables and the tensor mask equal a brute-force reading of the valid set."""

import random

import numpy as np
import pytest
import torch

from compile.beam.processors import PrefixConstraint, build_tables, read_sequences

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


def node_of(constraint, prefix):
    """Walk the tables with `advance`, one token at a time, as the beam node does."""
    nodes = constraint.start(1, "cpu")
    for token in prefix:
        nodes = constraint.advance(nodes, torch.zeros(1, 1, dtype=torch.int64), torch.tensor([[token]]))
    return nodes


@pytest.mark.parametrize("seed", range(6))
def test_mask_equals_brute_force(seed):
    valid = random_set(seed)
    constraint = PrefixConstraint(build_tables(valid, VOCAB, 4), EOS)
    prefixes = {tuple(s[:i]) for s in valid for i in range(len(s) + 1)}
    rng = random.Random(seed)
    prefixes |= {tuple(rng.randrange(0, 6) for _ in range(rng.randint(1, 3))) for _ in range(20)}  # mostly invalid
    for prefix in sorted(prefixes):
        nodes = node_of(constraint, list(prefix))
        for last in (False, True):
            got = constraint.allowed(nodes, VOCAB, torch.tensor(last))[0, 0]
            want = brute_allowed(valid, list(prefix), last)
            assert set(torch.nonzero(got).flatten().tolist()) == want, (prefix, last)


def test_mask_sets_minus_inf_and_keeps_allowed_values():
    valid = [[1, 2], [1, 3], [4]]
    constraint = PrefixConstraint(build_tables(valid, VOCAB, 2), EOS)
    log_probs = torch.randn(1, 2, VOCAB)
    nodes = torch.cat([node_of(constraint, []), node_of(constraint, [1])], dim=1)  # [1, 2]
    masked = constraint.mask(log_probs, nodes, 1, torch.tensor(2))
    assert torch.isfinite(masked[0, 0]).nonzero().flatten().tolist() == [1, 4]
    assert torch.isfinite(masked[0, 1]).nonzero().flatten().tolist() == [2, 3]
    assert torch.equal(masked[0, 0, [1, 4]], log_probs[0, 0, [1, 4]])


def test_tables_are_compact_and_csr_shaped():
    valid = random_set(0, count=200, max_len=4)
    tables = build_tables(valid, VOCAB, 4)
    unique_prefixes = {tuple(s[:i]) for s in valid for i in range(1, len(s) + 1)}
    assert tables["edge_token"].numel() == len(unique_prefixes)  # one edge per distinct non-empty prefix
    assert tables["terminal"].sum() == len({tuple(s) for s in valid})
    assert tables["child_start"].dtype == torch.int32 and bool((tables["child_start"].diff() >= 0).all())


def test_read_sequences_text_and_npy(tmp_path):
    text = tmp_path / "valid.txt"
    text.write_text("# semantic ids\n1 2 3\n4,5\n\n6\n")
    assert read_sequences(text) == [[1, 2, 3], [4, 5], [6]]
    array = tmp_path / "valid.npy"
    np.save(array, np.array([[1, 2, 3], [4, 5, -1]]))
    assert read_sequences(array) == [[1, 2, 3], [4, 5]]
    text.write_text("1 2 x\n")
    with pytest.raises(ValueError, match="valid.txt:1"):
        read_sequences(text)


def test_bad_sets_are_refused():
    with pytest.raises(ValueError, match="max_new_tokens"):
        build_tables([[1, 2, 3]], VOCAB, 2)
    with pytest.raises(ValueError, match="vocabulary"):
        build_tables([[1, 99]], VOCAB, 4)
    with pytest.raises(ValueError, match="empty"):
        build_tables([], VOCAB, 4)
