"""Constrained beam search: only valid sequences come out, equal to transformers with the same
prefix_allowed_tokens_fn, and equal to exhaustive search when the beam covers the whole set."""

import random

import pytest
import torch

from compile.beam.module import BeamModule
from worker.runtime.beam_node import BeamNode
from compile.beam.generation_config import beam_rule, read_generation_config
from compile.checkpoint import load_checkpoint
from compile.beam.processors import PrefixConstraint, build_tables
from compile.model import build_model
from tests.compile.beam_reference import beam_bounds, hf_beam
from tests.compile.reference import load_hf, random_batch

LENGTHS = [6, 11]


def constrained_node(path, valid, steps=3):
    ckpt = load_checkpoint(path, "float32")
    rule = beam_rule(read_generation_config(path))
    constraint = PrefixConstraint(build_tables(valid, ckpt.spec.vocab_size, steps), rule.eos_ids)
    module = BeamModule(build_model(ckpt.spec, ckpt.state_dict, torch.float32), rule, steps, constraint)
    node = BeamNode(module, beam_bounds(32, steps), ckpt.spec.vocab_size, rule.early_stopping, rule.pad_id)
    return node, rule


def semantic_ids(seed, count, length, alphabet=range(3, 60)):
    rng = random.Random(seed)
    return [[rng.choice(alphabet) for _ in range(length)] for _ in range(count)]


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


@pytest.mark.parametrize("family,width", [("qwen3", 4), ("llama", 8)])
def test_constrained_equals_transformers_and_is_valid(checkpoint_factory, family, width):
    path = checkpoint_factory(family, name=f"beam-{family}")
    valid = semantic_ids(1, 300, 3) + semantic_ids(2, 20, 2)  # some shorter ids: EOS may follow them
    node, rule = constrained_node(path, valid)
    hf = load_hf(path)
    prompts = random_batch(1024, LENGTHS, seed=5)
    out = node(torch.cat(prompts), torch.tensor(LENGTHS), width, 3, width)
    for i, p in enumerate(prompts):
        fn = allowed_fn(valid, len(p), 3, rule.eos_ids, 1024)
        tokens, scores, lengths = hf_beam(hf, p, width, 3, width, rule.eos_ids, rule.length_penalty,
                                          prefix_allowed_tokens_fn=fn)
        real = int((scores > -1e8).sum())
        assert real > 0 and out.lengths[i, :real].tolist() == lengths[:real].tolist()
        for j in range(real):
            n = int(lengths[j])
            assert out.sequences[i, j, :n].tolist() == tokens[j, :n].tolist()
        torch.testing.assert_close(out.scores[i, :real], scores[:real], atol=1e-4, rtol=0)
        for j in range(width):
            n = int(out.lengths[i, j])
            seq = out.sequences[i, j, :n].tolist()
            if n:
                body = seq[:-1] if seq[-1] in rule.eos_ids else seq
                assert body in valid, seq


def test_constrained_equals_exhaustive_search(checkpoint_factory):
    """With W above the number of valid prefixes beam search keeps everything: it must return the
    top k of all valid completions scored one by one."""
    path = checkpoint_factory("qwen2", name="beam-qwen2")
    valid = semantic_ids(7, 9, 3, alphabet=range(3, 9)) + [[5], [6, 7]]
    node, rule = constrained_node(path, valid)
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
    out = node(prompt, torch.tensor([9]), 32, 3, k)
    for j, (score, seq) in enumerate(completions[:k]):
        assert out.sequences[0, j, : len(seq)].tolist() == seq
        assert abs(float(out.scores[0, j]) - score) < 1e-4


def test_fewer_valid_sequences_than_k_leaves_empty_slots(checkpoint_factory):
    path = checkpoint_factory("qwen3", name="beam-qwen3")
    node, _ = constrained_node(path, [[10, 11, 12], [10, 13, 14]])
    out = node(torch.arange(20, 25), torch.tensor([5]), 8, 3, 4)
    assert out.lengths[0].tolist()[2:] == [0, 0] and bool(torch.isinf(out.scores[0, 2:]).all())
    assert sorted(out.sequences[0, :2].tolist()) == [[10, 11, 12], [10, 13, 14]]
