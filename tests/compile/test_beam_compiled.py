"""The AOTInductor-compiled beam node (built by the build CLI's chain) equals transformers and the
eager node, shares its weights with the scoring node, and serves R = 1, W = 1 and 1-token prompts."""

import dataclasses
import hashlib

import pytest
import torch

from worker.runtime.loader import load_nodes
from shared.catalog import CatalogTooLarge
from shared.catalog.__main__ import main as catalog_cli
from shared.config import BeamConfig, ScoreConfig, load_config
from tests.compile.beam_reference import assert_same_as_hf, hf_beam
from tests.compile.reference import load_hf, random_batch
from tests.compile.test_beam_constrained import assert_equals_transformers, constrained_node
from tests.builds import CATALOG_BOUNDS, ROOT, VALID, semantic_ids, write_sequences
from worker.catalog_store import CatalogStore

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


NEXT = semantic_ids(21, 280, 3) + semantic_ids(22, 30, 1)
"""The catalogue swapped in after VALID."""
FR = semantic_ids(31, 120, 3)
"""A market's own catalogue, loaded beside it."""


def package_state(folder):
    """Every file of an artifacts folder: (size, mtime_ns, sha256) by name."""
    return {f.name: (f.stat().st_size, f.stat().st_mtime_ns, hashlib.sha256(f.read_bytes()).hexdigest())
            for f in sorted(folder.iterdir()) if f.is_file()}


def test_compiled_constrained_node_equals_transformers_on_every_catalogue_version_without_a_rebuild(
        demo_checkpoint, constrained_beam_artifacts, tmp_path):
    """Version 1 (the build's catalogue), version 2 (another set, from a trie file) and version 3 (a
    market beside it), each equal to transformers' prefix_allowed_tokens_fn and to the eager node, on
    one package that no swap touches, which a build naming another catalogue finds up to date."""
    from compile.build import build

    before = package_state(constrained_beam_artifacts)
    nodes = load_nodes(constrained_beam_artifacts)
    facts = nodes.manifest.node_table().beam
    assert facts.constrained and (facts.max_catalog_nodes, facts.max_catalog_fanout) == (2048, 64)
    store = CatalogStore.for_manifest(nodes.manifest, "cpu")
    eager, rule, eager_store = constrained_node(demo_checkpoint, steps=3, catalog=store.bounds)
    hf = load_hf(demo_checkpoint)
    prompts = random_batch(1024, [7, 3], seed=11)
    ids, lens = torch.cat(prompts), torch.tensor([7, 3])
    trie_file = tmp_path / "next.npz"
    assert catalog_cli(["convert", str(write_sequences(tmp_path / "next.txt", NEXT)), str(trie_file),
                        "--vocab-size", "1024", "--max-new-tokens", "3"]) == 0
    versions = [({"default": write_sequences(tmp_path / "valid.txt", VALID)}, ["", ""], [VALID, VALID]),
                ({"default": trie_file}, ["", "default"], [NEXT, NEXT]),
                ({"fr": write_sequences(tmp_path / "fr.txt", FR)}, ["fr", ""], [FR, NEXT])]
    for number, (files, names, sets) in enumerate(versions, 1):
        assert store.update(files).version == number
        eager_store.update(files)
        catalog = store.current()
        for w in (8, 4):
            ours = nodes.beam(ids, lens, w, 3, w, catalog=catalog.node_inputs(names))
            want = eager(ids, lens, w, 3, w, catalog=eager_store.current().node_inputs(names))
            assert torch.equal(ours.sequences, want.sequences) and torch.equal(ours.lengths, want.lengths)
            torch.testing.assert_close(ours.scores, want.scores, atol=1e-4, rtol=0)
            for i, (prompt, valid) in enumerate(zip(prompts, sets)):
                assert_equals_transformers(ours, i, hf, prompt, valid, w, 3, rule)
    assert package_state(constrained_beam_artifacts) == before
    config = load_config(ROOT / "configs/test.toml")
    config = config.replace(model=dataclasses.replace(config.model, path=str(demo_checkpoint)),
                            score=ScoreConfig(enabled=False), bounds=dataclasses.replace(config.bounds, max_new_tokens=3),
                            beam=BeamConfig(enabled=True, constraints=str(tmp_path / "fr.txt"), **CATALOG_BOUNDS))
    build(config, constrained_beam_artifacts)  # the build with another catalogue named: up to date, nothing done
    assert package_state(constrained_beam_artifacts) == before


def test_a_catalogue_beyond_the_compiled_tables_is_refused_naming_the_bound_and_the_old_one_serves(
        constrained_beam_artifacts, tmp_path):
    nodes = load_nodes(constrained_beam_artifacts)
    store = CatalogStore.for_manifest(nodes.manifest, "cpu")
    version = store.swap(write_sequences(tmp_path / "valid.txt", VALID))
    too_many = semantic_ids(41, 2000, 3)  # ~2,000 leaves alone: more nodes than 2048 with their prefixes
    with pytest.raises(CatalogTooLarge, match="beam.max_catalog_nodes = 2,048 the beam node was compiled for"):
        store.swap(write_sequences(tmp_path / "big.txt", too_many), name="big")
    wide = [[t] for t in range(3, 3 + 65)]  # 65 children of the root
    with pytest.raises(CatalogTooLarge, match="65 children, more than beam.max_catalog_fanout = 64"):
        store.swap(write_sequences(tmp_path / "wide.txt", wide))
    assert store.version == version and set(store.current().roots) == {"default"}
    out = nodes.beam(torch.arange(20, 25), torch.tensor([5]), 4, 3, 4, catalog=store.current().node_inputs([""]))
    assert all(seq[: n - 1] in VALID or seq[:n] in VALID
               for seq, n in zip(out.sequences[0].tolist(), out.lengths[0].tolist()))
