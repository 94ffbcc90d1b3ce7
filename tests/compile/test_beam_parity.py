"""The eager beam node equals transformers' generate(num_beams=W, ...) on tiny checkpoints.

Covers every family, W in {1, 4, 32}, S in {1, 2, 4} on a node built for S = 4 (fewer steps are
served by the same node), k <= W, several prompt lengths in one batch, with the checkpoint's EOS and
with EOS ids chosen among the likeliest tokens (so finished hypotheses compete), length penalties
and every early_stopping mode.
"""

import json
from collections import Counter

import pytest
import torch

from compile.beam.module import BeamModule
from worker.runtime.beam_node import BeamNode
from compile.beam.generation_config import beam_rule, read_generation_config
from compile.checkpoint import load_checkpoint
from compile.linear import use_gemm
from compile.model import build_model
from tests.compile.beam_reference import assert_same_as_hf, beam_bounds, hf_beam
from tests.compile.reference import load_hf, random_batch

LENGTHS = [5, 17, 2]
MAX_STEPS = 4


def eager_node(path, max_beams=32, gemm="aten"):
    """gemm: the linears' kernel (on oneDNN the SwiGLU and residual pointwise work are GEMM epilogues)."""
    ckpt = load_checkpoint(path, "float32")
    rule = beam_rule(read_generation_config(path))
    model = use_gemm(build_model(ckpt.spec, ckpt.state_dict, torch.float32), gemm)
    module = BeamModule(model, rule, MAX_STEPS)
    bounds = beam_bounds(max_beams, MAX_STEPS)
    return BeamNode(module, bounds, ckpt.spec.vocab_size, rule.early_stopping, rule.pad_id), rule, ckpt.spec.vocab_size


def set_generation(path, **fields):
    """Rewrite generation_config.json (transformers and the node both read it)."""
    file = path / "generation_config.json"
    gen = json.loads(file.read_text())
    gen.update(fields)
    file.write_text(json.dumps(gen))


def likely_tokens(hf, prompts, count):
    """The tokens transformers' beams pick most often: as EOS ids they surely enter the candidates."""
    seen = Counter()
    for p in prompts:
        new, _, _ = hf_beam(hf, p, 8, MAX_STEPS, 8, eos_ids=(), length_penalty=1.0)
        seen.update(new.flatten().tolist())
    return [t for t, _ in seen.most_common(count)]


def check_matrix(path, widths, steps, eos_ids, gemm="aten"):
    node, rule, vocab = eager_node(path, gemm=gemm)
    hf = load_hf(path)
    prompts = random_batch(vocab, LENGTHS, seed=3)
    ended_early = 0
    for w in widths:
        for s in steps:
            k = min(w, 3)
            ours = node(torch.cat(prompts), torch.tensor(LENGTHS), w, s, k)
            for i, p in enumerate(prompts):
                assert_same_as_hf(ours, i, hf_beam(hf, p, w, s, k, eos_ids, rule.length_penalty))
            ended_early += int((ours.lengths < s).sum())
    return ended_early


@pytest.mark.parametrize("gemm", ["aten", pytest.param("onednn", marks=pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN"))])
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "llama"])
def test_parity_checkpoint_eos(checkpoint_factory, family, gemm):
    path = checkpoint_factory(family, name=f"beam-{family}")
    eos = tuple(beam_rule(read_generation_config(path)).eos_ids)
    check_matrix(path, [1, 4, 32], [1, 2, 4], eos, gemm)


@pytest.mark.parametrize("family,eos_count,gen", [
    ("qwen3", 1, {}),
    ("qwen2", 2, {"length_penalty": 0.6}),
    ("llama", 1, {"length_penalty": 2.0, "early_stopping": True}),
    ("qwen3", 2, {"length_penalty": 1.5, "early_stopping": "never"}),
    ("qwen2", 1, {"length_penalty": -0.5, "early_stopping": "never"}),
    ("llama", 1, {"repetition_penalty": 1.3}),
    ("qwen3", 2, {"repetition_penalty": 0.7, "length_penalty": 0.8}),
])
def test_parity_with_eos_among_candidates(checkpoint_factory, tmp_path, family, eos_count, gen):
    import shutil

    path = tmp_path / "ckpt"
    shutil.copytree(checkpoint_factory(family, name=f"beam-{family}"), path)
    eos = likely_tokens(load_hf(path), random_batch(1024, LENGTHS, seed=3), eos_count)
    set_generation(path, eos_token_id=eos if eos_count > 1 else eos[0], **gen)
    ended_early = check_matrix(path, [1, 4, 32], [2, 4], tuple(eos))
    assert ended_early > 0, "no candidate ended with EOS: the test would not exercise finished hypotheses"


def test_refuses_unsupported_generation_options(checkpoint_factory, tmp_path):
    import shutil

    from compile.beam.generation_config import UnsupportedGenerationOption

    path = tmp_path / "ckpt"
    shutil.copytree(checkpoint_factory("qwen3", name="beam-qwen3"), path)
    set_generation(path, no_repeat_ngram_size=2)
    with pytest.raises(UnsupportedGenerationOption, match="no_repeat_ngram_size"):
        beam_rule(read_generation_config(path))


def test_bounds_are_refused_clearly(checkpoint_factory):
    from shared.bounds import BoundsError

    node, _, _ = eager_node(checkpoint_factory("qwen3", name="beam-qwen3"), max_beams=8)
    ids, lens = torch.arange(5), torch.tensor([5])
    for kwargs, words in [
        (dict(num_beams=9, max_new_tokens=2, num_return_sequences=1), "max_beam_width"),
        (dict(num_beams=4, max_new_tokens=5, num_return_sequences=1), "max_new_tokens"),
        (dict(num_beams=4, max_new_tokens=2, num_return_sequences=5), "num_beams"),
    ]:
        with pytest.raises(BoundsError, match=words):
            node(ids, lens, **kwargs)
    with pytest.raises(BoundsError, match="max_prompt_tokens"):
        node(torch.arange(65), torch.tensor([65]), 4, 2, 1)
