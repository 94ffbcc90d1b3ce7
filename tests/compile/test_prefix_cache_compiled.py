"""The COMPILED scoring package reads prefix-cache hits exactly and returns the rows to insert.

For each family's session package (no new compile): a batch computed from scratch, keeping its
prefixes' keys/values, then the same batch reading those rows back as hits (the whole prefix, a
proper prefix, beside a miss, over a sample equal to the prefix) equals it within 1e-5 (fp32) for
every head; the rows the package returns equal the prefix's keys/values computed alone by the model;
a proper-prefix hit returns the whole prefix's rows (its cached part and its computed rest).
"""

import pytest
import torch

from worker.runtime.layout import CPU_BLOCK
from compile.checkpoint import load_checkpoint
from compile.model import build_model
from worker.runtime.loader import load_nodes
from compile.score.export import static_prefix_kv

LABELS = torch.tensor([0, 5, 17, 300])
TOLERANCE = 1e-5
# Groups as (prefix length, suffix lengths, hit): the hit its leading tokens read from the cache.
CASES = {
    "whole_prefix_hit": [(40, [5, 9, 2], 40)],
    "proper_prefix_hit": [(40, [5, 9, 2], 25)],
    "proper_hit_with_an_empty_suffix": [(30, [0, 7, 3], 29)],
    "hits_beside_misses": [(0, [6, 11], 0), (33, [4, 1], 33), (12, [2, 2], 0), (50, [1], 17)],
}


@pytest.fixture(scope="module", params=["qwen3", "llama", "qwen2"])
def family(request):
    """(score node, the model in eager fp32) of one family's session package."""
    if request.param == "qwen3":
        path, artifacts = request.getfixturevalue("demo_checkpoint"), request.getfixturevalue("demo_artifacts")
    elif request.param == "llama":
        path, artifacts = request.getfixturevalue("llama_artifacts")
    else:
        path, artifacts, _ = request.getfixturevalue("qwen2_with_head")
    checkpoint = load_checkpoint(path, "float32")
    return load_nodes(artifacts).score, build_model(checkpoint.spec, checkpoint.state_dict, torch.float32)


def batch(groups, vocab_size: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    ids, lens, prefixes = [], [], []
    for prefix_len, suffix_lens, _ in groups:
        prefix = torch.randint(0, vocab_size, (prefix_len,), generator=generator)
        prefixes.append(prefix)
        ids += [prefix, *(torch.randint(0, vocab_size, (n,), generator=generator) for n in suffix_lens)]
        lens += suffix_lens
    return (torch.cat(ids), torch.tensor(lens), torch.tensor([len(p) for p in prefixes]),
            torch.tensor([len(s) for _, s, _ in groups]), prefixes)


def assert_same(got, want) -> None:
    for name in ("label_logits", "label_logprobs", "label_probs", "topk_logprobs", "hidden", "head"):
        a, b = getattr(got, name), getattr(want, name)
        if b is not None:
            assert (a - b).abs().max() <= TOLERANCE, name
    assert torch.equal(got.topk_ids, want.topk_ids)


@pytest.mark.parametrize("name", list(CASES))
def test_a_compiled_hit_equals_the_answer_from_scratch(family, name):
    node, model = family
    groups = CASES[name]
    ids, lens, prefix_lens, sizes, prefixes = batch(groups, node.vocab_size, seed=len(name))
    shared = [g for g, (n, _, _) in enumerate(groups) if n]
    scratch = node(ids, lens, LABELS, 5, prefix_lens, sizes, keep=shared)
    assert sorted(scratch.prefix_kv) == shared
    for g in shared:  # the rows to insert are the prefix's own keys/values
        keys, values = static_prefix_kv(model, prefixes[g].tolist(), "cpu", CPU_BLOCK)
        got_k, got_v = scratch.prefix_kv[g]
        assert got_k.shape == (model.spec.num_layers, len(prefixes[g]), model.spec.num_kv_heads, model.spec.head_dim)
        assert (got_k - keys[:, : len(prefixes[g])]).abs().max() <= TOLERANCE
        assert (got_v - values[:, : len(prefixes[g])]).abs().max() <= TOLERANCE
    hits = [(scratch.prefix_kv[g][0][:, :hit], scratch.prefix_kv[g][1][:, :hit]) if hit else None
            for g, (_, _, hit) in enumerate(groups)]
    cached = node(ids, lens, LABELS, 5, prefix_lens, sizes, hits=hits, keep=shared)
    assert_same(cached, scratch)
    for g, (prefix_len, suffix_lens, hit) in enumerate(groups):
        if hit:
            assert cached.cached_tokens[g] > scratch.cached_tokens[g]  # the hit was read, not computed
            for got, want in zip(cached.prefix_kv[g], scratch.prefix_kv[g]):  # cached part + computed rest
                assert (got - want).abs().max() <= TOLERANCE
        else:
            assert cached.cached_tokens[g] == scratch.cached_tokens[g]


def test_hits_of_the_wrong_shape_are_refused(demo_artifacts):
    node = load_nodes(demo_artifacts).score
    layers, kv_heads, head_dim = node.kv_shape
    wrong = torch.zeros(layers, 10, kv_heads + 1, head_dim)
    with pytest.raises(ValueError, match="are not"):
        node(torch.arange(14), torch.tensor([2, 2]), LABELS, 5, torch.tensor([10]), torch.tensor([2]),
             hits=[(wrong, wrong)])
