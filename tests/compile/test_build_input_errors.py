"""Bad input to `python -m compile`: exit status 2 with a message naming the file (and key) and the problem,
no traceback, found before any work; and a build that fails late leaves its artifacts folder as it was.

Every refusal here comes before the checkpoint loads (`no_work` turns loading into a failure), so no test
but the last compiles anything."""

import json
import shutil
from pathlib import Path

import pytest

import compile.build
from compile.__main__ import main
from compile.build import build, build_key, checkpoint_hash
from shared.config import load_config
from tests.builds import ROOT

CATALOG_LINES = "max_catalog_nodes = 4096\nmax_catalog_fanout = 64"
"""[beam] table bounds that a constraints file needs beside it."""

TEST_TOML = (ROOT / "configs/test.toml").read_text()


@pytest.fixture
def no_work(monkeypatch):
    """Loading the checkpoint fails the test: the input must be refused before the build starts."""
    def load_checkpoint(*args, **kwargs):
        raise AssertionError("the build started before refusing its input")
    monkeypatch.setattr(compile.build, "load_checkpoint", load_checkpoint)


def config_file(tmp_path: Path, beam: str = "enabled = false", extra: str = "") -> Path:
    """configs/test.toml with its [beam] section's body replaced and `extra` sections added."""
    assert "[beam]\nenabled = false\n" in TEST_TOML
    path = tmp_path / "deployment.toml"
    path.write_text(TEST_TOML.replace("[beam]\nenabled = false\n", f"[beam]\n{beam}\n") + "\n" + extra)
    return path


def compile_cli(capsys, checkpoint: Path, out: Path, config: Path = ROOT / "configs/test.toml") -> tuple[int, str]:
    """`python -m compile` in this process: (exit status, stderr). A raw exception fails the test."""
    status = main(["--config", str(config), "--model", str(checkpoint), "--out", str(out)])
    return status, capsys.readouterr().err


def broken_copy(checkpoint: Path, dst: Path, edit) -> Path:
    """A copy of the checkpoint with config.json's parsed content replaced by edit(content)."""
    shutil.copytree(checkpoint, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(edit(config)))
    return dst


def without(key):
    return lambda config: {k: v for k, v in config.items() if k != key}


def setting(key, value):
    return lambda config: {**config, key: value}


@pytest.mark.parametrize("edit,message", [
    (without("hidden_size"), "config.json: missing key 'hidden_size'"),
    (without("num_attention_heads"), "config.json: missing key 'num_attention_heads'"),
    (lambda config: [], "config.json: expected a JSON object of settings, got a list"),
    (setting("num_hidden_layers", "4"), 'config.json: num_hidden_layers = "4" must be a positive integer'),
    (setting("max_position_embeddings", "abc"),
     'config.json: max_position_embeddings = "abc" must be a positive integer'),
    (setting("rms_norm_eps", "small"), 'config.json: rms_norm_eps = "small" must be a number'),
    (setting("rope_scaling", [1]), "config.json: rope_scaling = [1] must be a JSON object"),
    (setting("rope_scaling", {"rope_type": "llama3", "factor": 8.0}), "config.json: missing key 'low_freq_factor'"),
], ids=["no-hidden_size", "no-heads", "list", "str-layers", "str-positions", "str-eps", "list-rope", "llama3-key"])
def test_a_broken_config_json_is_refused_naming_the_file_and_key(demo_checkpoint, tmp_path, capsys, no_work,
                                                                 edit, message):
    checkpoint = broken_copy(demo_checkpoint, tmp_path / "broken", edit)
    status, err = compile_cli(capsys, checkpoint, tmp_path / "out")
    assert status == 2
    assert f"compile: error: {checkpoint}/{message}" in err
    assert not (tmp_path / "out").exists()


def test_a_truncated_config_json_is_refused_naming_the_file(demo_checkpoint, tmp_path, capsys, no_work):
    checkpoint = shutil.copytree(demo_checkpoint, tmp_path / "broken")
    text = (checkpoint / "config.json").read_text()
    (checkpoint / "config.json").write_text(text[:len(text) // 2])
    status, err = compile_cli(capsys, checkpoint, tmp_path / "out")
    assert status == 2 and f"compile: error: {checkpoint}/config.json: not valid JSON: " in err


def test_truncated_weights_are_refused_naming_the_file(demo_checkpoint, tmp_path, capsys):
    checkpoint = shutil.copytree(demo_checkpoint, tmp_path / "broken")
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    status, err = compile_cli(capsys, checkpoint, tmp_path / "out")
    assert status == 2
    assert f"compile: error: {weights}: cannot read the weights" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # the first build of a folder that failed leaves none


def test_an_out_that_is_a_file_is_refused(demo_checkpoint, tmp_path, capsys, no_work):
    file, inside = tmp_path / "file", tmp_path / "file" / "out"
    file.write_text("")
    status, err = compile_cli(capsys, demo_checkpoint, file)
    assert status == 2 and f"compile: error: {file}: is a file, not an artifacts folder" in err
    status, err = compile_cli(capsys, demo_checkpoint, inside)
    assert status == 2 and f"{inside}: cannot be created as an artifacts folder: {file} is a file" in err


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs Linux's /sys, where no one may create a folder")
def test_an_out_that_cannot_be_written_is_refused_before_the_checkpoint_loads(demo_checkpoint, capsys, no_work):
    status, err = compile_cli(capsys, demo_checkpoint, Path("/sys/boundserve-artifacts"))
    assert status == 2 and "compile: error: /sys/boundserve-artifacts: cannot write the artifacts folder (" in err


def test_a_checkpoint_without_tokenizer_json_is_refused_before_the_build(demo_checkpoint, tmp_path, capsys, no_work):
    checkpoint = shutil.copytree(demo_checkpoint, tmp_path / "no-tokenizer")
    (checkpoint / "tokenizer.json").unlink()
    status, err = compile_cli(capsys, checkpoint, tmp_path / "out")
    assert status == 2 and f"compile: error: {checkpoint}: no tokenizer.json" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("lines,message", [
    ("5 6 7\nfoo bar\n", "{file}:2: expected token ids separated by spaces, got 'foo bar'"),
    ("5 6 7\n5000\n", "{file}: token id 5000 is outside the vocabulary [0, 1024)"),
    ("# nothing\n", "{file}: the set of valid sequences is empty"),
], ids=["not-ids", "past-vocabulary", "empty"])
def test_a_bad_constraints_file_is_refused_before_the_build(demo_checkpoint, tmp_path, capsys, no_work, lines,
                                                            message):
    file = tmp_path / "constraints.txt"
    file.write_text(lines)
    config = config_file(tmp_path, beam=f"enabled = true\nconstraints = '{file}'\n{CATALOG_LINES}")
    status, err = compile_cli(capsys, demo_checkpoint, tmp_path / "out", config)
    assert status == 2 and "compile: error: beam.constraints " + message.format(file=file) in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("beam,extra,setting", [
    (f"enabled = true\nconstraints = 'nope.txt'\n{CATALOG_LINES}", "", "beam.constraints = 'nope.txt'"),
    ("enabled = false", "[quantize]\nint8 = true\ncalibration = 'nonexistent.txt'\n",
     "quantize.calibration = 'nonexistent.txt'"),
    ("enabled = false", "[score.mlp_head]\nweights = 'head.safetensors'\nlayer_sizes = [64, 2]\n",
     "score.mlp_head.weights = 'head.safetensors'"),
], ids=["constraints", "calibration", "mlp_head"])
def test_a_missing_file_of_an_enabled_feature_is_refused_naming_the_setting(demo_checkpoint, tmp_path, capsys,
                                                                            no_work, beam, extra, setting):
    config = config_file(tmp_path, beam=beam, extra=extra)
    status, err = compile_cli(capsys, demo_checkpoint, tmp_path / "out", config)
    assert status == 2 and f"compile: error: {setting}: no such file" in err


def test_a_disabled_features_file_is_not_read(demo_checkpoint, tmp_path):
    """beam.constraints with the beam node off, quantize.calibration with int8 off: neither file is read,
    nor counted in the build key (whether such a setting should be refused is shared/config.py's call)."""
    plain = load_config(config_file(tmp_path, beam=f"enabled = false\n{CATALOG_LINES}"))
    named = load_config(config_file(tmp_path, beam=f"enabled = false\nconstraints = 'nope.txt'\n{CATALOG_LINES}",
                                    extra="[quantize]\nint8 = false\ncalibration = 'nonexistent.txt'\n"))
    sha = checkpoint_hash(demo_checkpoint)
    assert build_key(named, sha) == build_key(plain, sha)


def test_a_catalogue_beyond_the_table_bounds_is_refused_before_the_build_naming_the_bound(
        demo_checkpoint, tmp_path, capsys, no_work):
    file = tmp_path / "items.txt"
    file.write_text("\n".join(f"{a} {b}" for a in range(3, 13) for b in range(3, 13)))  # 111 nodes, fan-out 10
    for bounds, message in [("max_catalog_nodes = 110\nmax_catalog_fanout = 64", "the catalogues hold 111 trie nodes together "
                             "('default' 111), more than beam.max_catalog_nodes = 110"),
                            ("max_catalog_nodes = 4096\nmax_catalog_fanout = 9", "'default' has a node with 10 "
                             "children, more than beam.max_catalog_fanout = 9")]:
        config = config_file(tmp_path, beam=f"enabled = true\nconstraints = '{file}'\n{bounds}")
        status, err = compile_cli(capsys, demo_checkpoint, tmp_path / "out", config)
        assert status == 2 and f"compile: error: beam.constraints = '{file}': " in err and message in err
        assert not (tmp_path / "out").exists()


def test_the_catalogues_content_is_not_in_the_build_key_its_table_bounds_are(demo_checkpoint, tmp_path):
    """A new catalogue runs on the same artifacts (the worker loads it); other table bounds are another build."""
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("3 4 5\n")
    second.write_text("6 7\n8\n")
    sha = checkpoint_hash(demo_checkpoint)
    keys = [build_key(load_config(config_file(tmp_path, beam=f"enabled = true\nconstraints = '{path}'\n{lines}")), sha)
            for path, lines in [(first, CATALOG_LINES), (second, CATALOG_LINES),
                                (first, "max_catalog_nodes = 4097\nmax_catalog_fanout = 64")]]
    assert keys[0] == keys[1] != keys[2]


def test_a_failed_build_leaves_the_artifacts_folder_as_it_was(demo_checkpoint, tmp_path, monkeypatch):
    """A build writes into out/.building and moves the files into out only once all are written: the
    previous artifacts stay whole when a later one fails after writing a package. (AOTInductor is
    replaced by a stub writing a placeholder package: the point is where files go, not what they hold.)"""
    config = load_config(ROOT / "configs/test.toml")
    config = config.replace(model=config.model.__class__(**{**config.model.__dict__, "path": str(demo_checkpoint)}))
    out = tmp_path / "out"

    def stub_compile(program, package, *args):
        package.write_bytes(b"package of build %d" % len(built))
        if len(built) == 1:
            raise RuntimeError("the C++ compiler failed")

    built = []
    monkeypatch.setattr(compile.build, "aoti_compile", stub_compile)
    built.append(build(config, out, force=True))  # the first build succeeds
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    assert {"manifest.json", "score.pt2", "weights.safetensors", "tokenizer.json"} <= set(before)
    with pytest.raises(RuntimeError, match="the C\\+\\+ compiler failed"):
        build(config, out, force=True)
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before  # no .building folder left either


@pytest.mark.parametrize("config, device", [("configs/demo.toml", "cuda"), ("configs/compose-gpu.toml", "cpu")])
def test_device_flag_builds_for_that_device_whatever_the_configs_workers(tmp_path, capsys, config, device):
    """--device overrides model.device and, with it, the kind of the workers' devices (a config's workers
    run the kind its packages are compiled for): the build goes on to its next check, here the checkpoint."""
    status = main(["--config", str(ROOT / config), "--device", device, "--model", str(tmp_path / "none"),
                   "--out", str(tmp_path / "out")])
    said = capsys.readouterr().err
    assert status == 2 and "no config.json" in said and "do not match" not in said, said


@pytest.mark.parametrize("content, message", [
    ("[]", "generation_config.json: expected a JSON object of options, got a list"),
    ('"x"', "generation_config.json: expected a JSON object of options, got a str"),
    ('{"eos_token_id": [null]}', "eos_token_id holds null; token ids are integers >= 0"),
    ('{"eos_token_id": {"a": 1}}', 'eos_token_id holds {"a": 1}; token ids are integers >= 0'),
    ('{"pad_token_id": "0"}', "pad_token_id holds \"0\"; token ids are integers >= 0"),
    ('{"length_penalty": "long"}', "length_penalty = \"long\" must be a number"),
])
def test_a_bad_generation_config_is_refused_before_the_build(demo_checkpoint, tmp_path, capsys, no_work, content,
                                                             message):
    checkpoint = shutil.copytree(demo_checkpoint, tmp_path / "ckpt")
    (checkpoint / "generation_config.json").write_text(content)
    status, err = compile_cli(capsys, checkpoint, tmp_path / "out", config_file(tmp_path, beam="enabled = true"))
    assert status == 2 and "compile: error: " in err and message in err, err
