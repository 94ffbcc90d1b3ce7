"""shared/manifest.py: the manifest decoded once, with older manifests' absent fields defaulted and
a broken one refused naming its key."""

import json

import pytest

from shared.bounds import Bounds
from shared.manifest import (Manifest, ManifestError, bounds_differences, manifest_json, parse_manifest, read_manifest,
                             threads_difference)

BUILT = {
    "format_version": 1, "name": "demo", "build_key": "k", "dtype": "float32",
    "machine": {"torch": "2.13", "device": "cpu", "machine": "x86_64", "cpu_isa": "avx512"},
    "bounds": {"max_samples_per_batch": 8, "max_tokens_per_sample": 64, "max_tokens_per_batch": 256,
               "max_labels": 4, "max_top_k": 5, "max_prompt_tokens": 64, "max_beam_width": 8,
               "max_new_tokens": 4, "max_beam_requests_per_batch": 2, "max_prefix_tokens": 32},
    "model": {"family": "qwen3", "vocab_size": 1000, "hidden_size": 64, "rope": {"theta": 1e6}},
    "nodes": {"score": {"package": "score.pt2", "sha256": "a" * 64, "gemm": "aten",
                        "outputs": ["label_logits", "head"], "static_prefix_ids": [1, 2]},
              "beam": {"package": "beam.pt2", "sha256": "b" * 64, "gemm": "onednn", "eos_ids": [0], "pad_id": 0,
                       "early_stopping": "never"}},
    "weights": {"file": "weights.safetensors", "sha256": "c" * 64},
}


def test_a_built_manifest_reads_typed_and_round_trips():
    manifest = parse_manifest(json.dumps(BUILT))
    assert manifest.bounds.max_prefix_tokens == 32 and manifest.model.vocab_size == 1000
    assert manifest.node_table().workloads() == ("score", "beam")
    assert manifest.node_table().score.static_prefix_ids == (1, 2)
    assert manifest.node_table().beam.early_stopping == "never"
    assert (manifest.node_table().score.gemm, manifest.node_table().beam.gemm) == ("aten", "onednn")
    assert parse_manifest(manifest_json(manifest)) == manifest


def test_an_older_manifest_keeps_the_defaults_readers_always_tolerated():
    bounds = {k: v for k, v in BUILT["bounds"].items() if k != "max_prefix_tokens"}
    score = {k: v for k, v in BUILT["nodes"]["score"].items() if k != "static_prefix_ids"}
    manifest = parse_manifest(json.dumps({**BUILT, "bounds": bounds, "nodes": {"score": score}}))
    assert manifest.bounds.max_prefix_tokens is None and manifest.bounds.limit("max_prefix_tokens") == 64
    over = parse_manifest(json.dumps({**BUILT, "bounds": {**BUILT["bounds"], "max_prefix_tokens": 100}}))
    assert over.bounds.limit("max_prefix_tokens") == 64  # never over a sample
    assert manifest.node_table().score.static_prefix_ids == () and manifest.node_table().beam is None
    assert manifest.serves("score") and not manifest.serves("beam")
    assert manifest.node_table().score.gemm == "aten"
    one_kernel = {**BUILT, "gemm": "onednn", "nodes": {"score": {k: v for k, v in score.items() if k != "gemm"}}}
    assert parse_manifest(json.dumps(one_kernel)).node_table().score.gemm == ""  # before it was per node
    bare = parse_manifest(json.dumps({"bounds": BUILT["bounds"]}))  # a hand-written one: no nodes, no model
    assert bare.serves("beam") and bare.model.vocab_size is None and bare.name == ""


@pytest.mark.parametrize("change,match", [
    ({"bounds": {**BUILT["bounds"], "max_top_k": "5"}}, 'bounds.max_top_k = "5" must be an integer'),
    ({"nodes": {"score": {"package": 3}}}, "nodes.score.package = 3 must be a string"),
    ({"model": {"vocab_size": "big"}}, 'model.vocab_size = "big"'),
])
def test_a_broken_manifest_is_refused_naming_the_key(change, match):
    with pytest.raises(ManifestError, match=match):
        parse_manifest(json.dumps({**BUILT, **change}), "artifacts/manifest.json")


def test_reading_a_folder_without_a_manifest_says_how_to_build_one(tmp_path):
    with pytest.raises(ManifestError, match="not found: build the artifacts first"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps(BUILT))
    assert read_manifest(tmp_path).bounds == Bounds(**BUILT["bounds"])
    assert isinstance(read_manifest(tmp_path), Manifest)


def test_a_config_is_compared_with_what_the_artifacts_were_built_for():
    from shared.config import parse_config

    manifest = parse_manifest(json.dumps({**BUILT, "cpu_threads": 2}))
    same = parse_config({"bounds": BUILT["bounds"], "worker": {"cpu_threads": 2}})
    assert bounds_differences(manifest, same) == [] and threads_difference(manifest, same) is None
    other = parse_config({"bounds": {**BUILT["bounds"], "max_labels": 8}, "worker": {"cpu_threads": 1}})
    assert bounds_differences(manifest, other) == ["bounds.max_labels = 8, compiled for 4"]
    assert threads_difference(manifest, other) == (
        "the artifacts were compiled for 2 CPU thread(s) per call but [worker] cpu_threads = 1; set cpu_threads = 2 "
        "or rebuild the artifacts with this config")
    assert bounds_differences(parse_manifest(json.dumps({**BUILT, "bounds": None})), other) == []  # none recorded
