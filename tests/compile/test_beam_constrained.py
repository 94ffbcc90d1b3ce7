"""Constrained beam search: only valid sequences come out, equal to transformers with the same
prefix_allowed_tokens_fn, and equal to exhaustive search when the beam covers the whole set. The
catalogue is an input of the node (worker/catalog_store.py loads it), so one node serves several
catalogues at once and each version after a swap."""

import pytest
import torch

from compile.beam.module import BeamModule
from worker.runtime.beam_node import BeamNode
from compile.beam.generation_config import beam_rule, read_generation_config
from compile.checkpoint import load_checkpoint
from compile.beam.processors import PrefixConstraint
from compile.model import build_model
from shared.catalog import CatalogBounds
from tests.compile.beam_reference import beam_bounds, hf_beam
from tests.builds import semantic_ids, write_sequences
from tests.compile.reference import load_hf, random_batch
from worker.catalog_store import CatalogStore

LENGTHS = [6, 11]
CATALOG = CatalogBounds(max_nodes=2048, max_fanout=64)
"""The eager nodes' table sizes: room for two of the sets below."""


def constrained_node(path, steps=3, catalog=CATALOG):
    """The eager constrained node of checkpoint `path` and a catalogue store for it (nothing loaded)."""
    ckpt = load_checkpoint(path, "float32")
    rule = beam_rule(read_generation_config(path))
    constraint = PrefixConstraint(catalog.max_fanout, rule.eos_ids)
    module = BeamModule(build_model(ckpt.spec, ckpt.state_dict, torch.float32), rule, steps, constraint)
    node = BeamNode(module, beam_bounds(32, steps), ckpt.spec.vocab_size, rule.early_stopping, rule.pad_id,
                    constrained=True)
    return node, rule, CatalogStore(catalog, ckpt.spec.vocab_size, steps)


def allowed_fn(valid, prompt_len, steps, eos_ids, vocab):
    """transformers' prefix_allowed_tokens_fn for the same rule as the node (brute force over the set)."""
    def fn(batch_id, ids):
        prefix = ids[prompt_len:].tolist()
        n, last = len(prefix), len(prefix) == steps - 1
        allowed = {s[n] for s in valid if len(s) > n and s[:n] == prefix and (not last or len(s) == n + 1)}
        if prefix in valid:
            allowed |= set(eos_ids)
        return sorted(allowed) or list(range(vocab))  # a dead beam (-inf already): any mask is a no-op
    return fn


def assert_equals_transformers(out, request, hf, prompt, valid, width, steps, rule):
    """Request `request` of `out` holds transformers' constrained beams for `prompt`, each one valid."""
    fn = allowed_fn(valid, len(prompt), steps, rule.eos_ids, hf.config.vocab_size)
    tokens, scores, lengths = hf_beam(hf, prompt, width, steps, width, rule.eos_ids, rule.length_penalty,
                                      prefix_allowed_tokens_fn=fn)
    real = int((scores > -1e8).sum())
    assert real > 0 and out.lengths[request, :real].tolist() == lengths[:real].tolist()
    for j in range(real):
        n = int(lengths[j])
        assert out.sequences[request, j, :n].tolist() == tokens[j, :n].tolist()
    torch.testing.assert_close(out.scores[request, :real], scores[:real], atol=1e-4, rtol=0)
    for j in range(width):
        n = int(out.lengths[request, j])
        seq = out.sequences[request, j, :n].tolist()
        if n:
            body = seq[:-1] if seq[-1] in rule.eos_ids else seq
            assert body in valid, seq


@pytest.mark.parametrize("family,width", [("qwen3", 4), ("llama", 8)])
def test_constrained_equals_transformers_and_is_valid(checkpoint_factory, tmp_path, family, width):
    path = checkpoint_factory(family, name=f"beam-{family}")
    valid = semantic_ids(1, 300, 3) + semantic_ids(2, 20, 2)  # some shorter ids: EOS may follow them
    node, rule, store = constrained_node(path)
    store.swap(write_sequences(tmp_path / "valid.txt", valid))
    hf = load_hf(path)
    prompts = random_batch(1024, LENGTHS, seed=5)
    out = node(torch.cat(prompts), torch.tensor(LENGTHS), width, 3, width,
               catalog=store.current().node_inputs(["", ""]))
    for i, p in enumerate(prompts):
        assert_equals_transformers(out, i, hf, p, valid, width, 3, rule)


def test_requests_of_one_call_each_follow_their_own_catalogue_and_a_swap_changes_the_next_call(
        checkpoint_factory, tmp_path):
    """Two markets loaded at once, one request in each, both equal transformers; after the default
    catalogue is swapped for another set, the next call follows the new set (same node, no rebuild)."""
    path = checkpoint_factory("qwen3", name="beam-qwen3")
    de, fr, new = semantic_ids(3, 200, 3), semantic_ids(4, 150, 3) + semantic_ids(5, 10, 2), semantic_ids(6, 250, 3)
    node, rule, store = constrained_node(path)
    store.update({"default": write_sequences(tmp_path / "de.txt", de), "fr": write_sequences(tmp_path / "fr.txt", fr)})
    hf = load_hf(path)
    prompts = random_batch(1024, LENGTHS, seed=9)
    before = store.current()
    out = node(torch.cat(prompts), torch.tensor(LENGTHS), 4, 3, 4, catalog=before.node_inputs(["", "fr"]))
    assert_equals_transformers(out, 0, hf, prompts[0], de, 4, 3, rule)
    assert_equals_transformers(out, 1, hf, prompts[1], fr, 4, 3, rule)
    assert store.swap(write_sequences(tmp_path / "new.txt", new)) == before.version + 1
    out = node(torch.cat(prompts), torch.tensor(LENGTHS), 4, 3, 4, catalog=store.current().node_inputs(["", "fr"]))
    assert_equals_transformers(out, 0, hf, prompts[0], new, 4, 3, rule)
    assert_equals_transformers(out, 1, hf, prompts[1], fr, 4, 3, rule)


def test_constrained_equals_exhaustive_search(checkpoint_factory, tmp_path):
    """With W above the number of valid prefixes beam search keeps everything: it must return the
    top k of all valid completions scored one by one."""
    path = checkpoint_factory("qwen2", name="beam-qwen2")
    valid = semantic_ids(7, 9, 3, alphabet=range(3, 9)) + [[5], [6, 7]]
    node, rule, store = constrained_node(path)
    store.swap(write_sequences(tmp_path / "valid.txt", valid))
    hf = load_hf(path)
    prompt = random_batch(1024, [9], seed=8)[0]
    completions = []
    for s in valid:
        seq = s if len(s) == 3 else s + [rule.eos_ids[0]]
        with torch.inference_mode():
            logits = hf(torch.cat([prompt, torch.tensor(seq)])[None]).logits[0].float()
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)[torch.arange(len(seq)), torch.tensor(seq)]
        completions.append((float(logp.sum()) / len(seq) ** rule.length_penalty, seq))
    completions.sort(reverse=True)
    k = 6
    out = node(prompt, torch.tensor([9]), 32, 3, k, catalog=store.current().node_inputs([""]))
    for j, (score, seq) in enumerate(completions[:k]):
        assert out.sequences[0, j, : len(seq)].tolist() == seq
        assert abs(float(out.scores[0, j]) - score) < 1e-4


def test_fewer_valid_sequences_than_k_leaves_empty_slots(checkpoint_factory, tmp_path):
    path = checkpoint_factory("qwen3", name="beam-qwen3")
    node, _, store = constrained_node(path)
    store.swap(write_sequences(tmp_path / "valid.txt", [[10, 11, 12], [10, 13, 14]]))
    out = node(torch.arange(20, 25), torch.tensor([5]), 8, 3, 4, catalog=store.current().node_inputs([""]))
    assert out.lengths[0].tolist()[2:] == [0, 0] and bool(torch.isinf(out.scores[0, 2:]).all())
    assert sorted(out.sequences[0, :2].tolist()) == [[10, 11, 12], [10, 13, 14]]


def test_a_constrained_node_refuses_a_call_without_a_catalogue(checkpoint_factory):
    from shared.bounds import BoundsError

    node, _, _ = constrained_node(checkpoint_factory("qwen3", name="beam-qwen3"))
    with pytest.raises(BoundsError, match="needs a catalogue"):
        node(torch.arange(20, 25), torch.tensor([5]), 4, 3, 4)
