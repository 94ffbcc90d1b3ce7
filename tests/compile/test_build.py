"""The build chain: manifest contents, up-to-date skipping, refusal of foreign artifacts, CLI errors."""

import dataclasses
import json
import re
import shutil
import subprocess
import sys

import pytest
import torch

from compile.build import build, build_key, checkpoint_hash
from worker.runtime.machine import ArtifactMismatch
from worker.runtime.loader import load_nodes
from shared.config import load_config
from tests.builds import ROOT, build_artifacts


def test_manifest_describes_the_build(demo_artifacts):
    manifest = json.loads((demo_artifacts / "manifest.json").read_text())
    assert manifest["bounds"]["max_tokens_per_batch"] == 256
    assert manifest["dtype"] == "float32"
    assert manifest["machine"] == {"torch": torch.__version__, "device": "cpu", "machine": manifest["machine"]["machine"],
                                   "cpu_isa": torch.backends.cpu.get_cpu_capability(),
                                   "cpu_vnni": "yes" if torch.cpu._is_vnni_supported() else "no",
                                   "cpu_bf16": "yes" if torch.cpu._is_avx512_bf16_supported() else "no",
                                   "cpu_amx": "yes" if torch.cpu._is_amx_tile_supported() else "no"}
    assert manifest["kernels"] is None  # a float32 build: its packages call no kernel of worker/runtime/kernels
    assert manifest["nodes"]["score"]["package"] == "score.pt2"
    assert len(manifest["nodes"]["score"]["sha256"]) == 64 and len(manifest["model"]["sha256"]) == 64
    for name in manifest["tokenizer_files"]:
        assert (demo_artifacts / name).is_file()
    assert "tokenizer.json" in manifest["tokenizer_files"]


def test_up_to_date_artifacts_are_not_rebuilt(demo_checkpoint, demo_artifacts, capfd):
    before = (demo_artifacts / "score.pt2").stat().st_mtime_ns
    build_artifacts(demo_checkpoint, "demo")
    assert "up to date" in capfd.readouterr().err
    assert (demo_artifacts / "score.pt2").stat().st_mtime_ns == before


def test_build_key_follows_bounds_and_checkpoint(demo_checkpoint, checkpoint_factory):
    config = load_config(ROOT / "configs/test.toml")
    sha = checkpoint_hash(demo_checkpoint)
    wider = config.replace(bounds=config.bounds.__class__(**{**config.bounds.__dict__, "max_top_k": 6}))
    assert build_key(config, sha) == build_key(config, sha)
    assert build_key(config, sha) != build_key(wider, sha)
    assert build_key(config, sha) != build_key(config, checkpoint_hash(checkpoint_factory("llama")))


def test_build_key_follows_an_input_files_content_not_its_path(demo_checkpoint, tmp_path):
    config = load_config(ROOT / "configs/test.toml")
    sha = checkpoint_hash(demo_checkpoint)
    a, b, c = tmp_path / "a.txt", tmp_path / "elsewhere.txt", tmp_path / "c.txt"
    a.write_text("5 6 7\n8 9\n")
    b.write_text("5 6 7\n8 9\n")
    c.write_text("5 6 7\n8 10\n")

    def key(path, section="quantize", field="calibration", **more):
        part = getattr(config, section)
        on = {"beam": "enabled", "quantize": "int8"}[section]  # a disabled feature's file does not count
        fields = {**part.__dict__, field: str(path), on: True, **more}
        return build_key(config.replace(**{section: part.__class__(**fields)}), sha)

    assert key(a) == key(b)  # moved: the same artifacts (a test's temporary folder, a deployment's checkout)
    assert key(a) != key(c)  # edited in place: rebuilt
    # a catalogue is data the worker loads (the tables are compiled by size): no file of it makes another build
    tables = {"max_catalog_nodes": 64, "max_catalog_fanout": 16}
    assert key(a, "beam", "constraints", **tables) == key(c, "beam", "constraints", **tables)


def test_the_build_key_covers_the_runtime_the_build_compiles_in(demo_checkpoint, monkeypatch, tmp_path):
    """The kernels' C++ and the runtime's layout go into the packages: editing them is another build."""
    import compile.build as build_module

    config = load_config(ROOT / "configs/test.toml")
    sha = checkpoint_hash(demo_checkpoint)
    assert any(p.suffix == ".cpp" and "worker/runtime/kernels" in p.as_posix() for p in build_module.build_sources())
    assert any(p.name == "layout.py" and "worker/runtime" in p.as_posix() for p in build_module.build_sources())
    before = build_key(config, sha)
    edited = tmp_path / "packed_attention.cpp"
    edited.write_text("// another kernel\n")
    monkeypatch.setattr(build_module, "build_sources", lambda: [edited])
    assert build_key(config, sha) != before


OTHER_ISA = "AVX512" if torch.backends.cpu.get_cpu_capability() != "AVX512" else "AVX2"
OTHER_VNNI = "no" if torch.cpu._is_vnni_supported() else "yes"


@pytest.mark.parametrize("fact,value,message", [
    ("cpu_isa", OTHER_ISA, f"cpu_isa: built for '{OTHER_ISA}'"),
    ("cpu_vnni", OTHER_VNNI, f"cpu_vnni: built for '{OTHER_VNNI}'"),
    ("torch", "2.0.0", "torch: built for '2.0.0'"),
    ("device", "cuda", "compiled for device 'cuda'"),
])
def test_artifacts_for_another_machine_are_refused(demo_artifacts, tmp_path, fact, value, message):
    copy = shutil.copytree(demo_artifacts, tmp_path / "copy")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["machine"][fact] = value
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactMismatch, match=message):
        load_nodes(copy)


def test_tampered_package_is_refused(demo_artifacts, tmp_path):
    copy = shutil.copytree(demo_artifacts, tmp_path / "copy")
    with open(copy / "score.pt2", "ab") as f:
        f.write(b"x")
    with pytest.raises(ArtifactMismatch, match="does not match the manifest's hash"):
        load_nodes(copy)


def test_cli_reports_bad_input_clearly(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[bounds]\nmax_new_tokens = 9\n")
    result = subprocess.run(
        [sys.executable, "-m", "compile", "--config", str(bad), "--model", str(tmp_path), "--out", str(tmp_path / "o")],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 2
    assert "bounds.max_new_tokens = 9 must be an integer between 1 and 5" in result.stderr
    good = ROOT / "configs/test.toml"
    result = subprocess.run(
        [sys.executable, "-m", "compile", "--config", str(good), "--model", str(tmp_path), "--out", str(tmp_path / "o")],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert result.returncode == 2 and "no config.json" in result.stderr


@pytest.mark.parametrize("positions,beam,message", [
    (48, False, "bounds.max_tokens_per_sample = 64 tokens, more than the model's max_position_embeddings (48"),
    (66, True, "bounds.max_prompt_tokens + bounds.max_new_tokens = 68 tokens, more than the model's "
               "max_position_embeddings (66"),
])
def test_bounds_past_the_models_positions_are_refused(checkpoint_factory, tmp_path, positions, beam, message):
    """A token past max_position_embeddings has no row in the RoPE table: the build says so before any work."""
    checkpoint = checkpoint_factory("qwen2", max_position_embeddings=positions)
    config = load_config(ROOT / "configs/test.toml")
    config = config.replace(model=dataclasses.replace(config.model, path=str(checkpoint)),
                            beam=dataclasses.replace(config.beam, enabled=beam))
    with pytest.raises(ValueError, match=re.escape(message)):
        build(config, tmp_path / "out")
    assert not (tmp_path / "out").exists()
