"""The AOTInductor-compiled beam node (built by the build CLI's chain) equals transformers and the
eager node, shares its weights with the scoring node, and serves R = 1, W = 1 and 1-token prompts."""

import pytest
import torch

from worker.runtime.loader import load_nodes
from shared.config import BeamConfig, ScoreConfig
from tests.compile.beam_reference import assert_same_as_hf, hf_beam
from tests.compile.reference import load_hf, random_batch
from tests.compile.test_beam_constrained import constrained_node, semantic_ids
from tests.builds import build_artifacts, demo, suite_build

pytestmark = pytest.mark.slow



def test_compiled_beam_equals_transformers(beam_artifacts, demo_checkpoint):
    nodes = load_nodes(beam_artifacts)
    assert nodes.beam is not None and nodes.score is not None
    hf = load_hf(demo_checkpoint)
    eos = nodes.manifest.node_table().beam.eos_ids
    for lengths in ([9, 1, 30], [12]):
        prompts = random_batch(1024, lengths, seed=len(lengths))
        for w, s in [(1, 4), (4, 1), (4, 2), (8, 4)]:
            k = min(w, 3)
            ours = nodes.beam(torch.cat(prompts), torch.tensor(lengths), w, s, k)
            assert ours.sequences.shape == (len(lengths), k, s)
            for i, p in enumerate(prompts):
                assert_same_as_hf(ours, i, hf_beam(hf, p, w, s, k, eos, 1.0))


def test_beam_and_score_nodes_share_one_weights_file(beam_artifacts):
    nodes = load_nodes(beam_artifacts)
    assert nodes.manifest.node_table().workloads() == ("score", "beam")
    beam_names = set(nodes.beam._run.get_constant_fqns())
    score_names = set(nodes.score.package.get_constant_fqns())
    assert {n for n in beam_names if n.startswith("model.")} == {n for n in score_names if n.startswith("model.")}
    assert beam_names <= set(nodes.weights)  # one file, loaded once, handed to both packages


VALID = semantic_ids(1, 300, 3) + semantic_ids(2, 20, 2)
"""The constrained build's valid sequences (3 and 2 tokens)."""


@suite_build(compile_s=150)
def constrained_beam_artifacts(make, folder):
    """demo_checkpoint's beam node alone, constrained to VALID, unrolled for 3 new tokens (the longest
    valid sequence; test.toml's 4 would unroll one more step, ~1/4 more compile time)."""
    file = folder / "valid.txt"
    file.write_text("\n".join(" ".join(map(str, s)) for s in VALID))
    return build_artifacts(demo(make), "beam-constrained", score=ScoreConfig(enabled=False),
                           beam=BeamConfig(enabled=True, constraints=str(file)), bounds={"max_new_tokens": 3})


def test_compiled_constrained_node_returns_only_valid_sequences(demo_checkpoint, constrained_beam_artifacts):
    nodes = load_nodes(constrained_beam_artifacts)
    eager, rule = constrained_node(demo_checkpoint, VALID, steps=3)
    prompts = random_batch(1024, [7, 3], seed=11)
    for w, s in [(8, 3), (4, 2)]:
        ours = nodes.beam(torch.cat(prompts), torch.tensor([7, 3]), w, s, w)
        want = eager(torch.cat(prompts), torch.tensor([7, 3]), w, s, w)
        assert torch.equal(ours.sequences, want.sequences) and torch.equal(ours.lengths, want.lengths)
        torch.testing.assert_close(ours.scores, want.scores, atol=1e-4, rtol=0)
        for seq, n in zip(ours.sequences.reshape(-1, s).tolist(), ours.lengths.flatten().tolist()):
            if n:
                body = seq[: n - 1] if seq[n - 1] in rule.eos_ids else seq[:n]
                assert body in VALID
