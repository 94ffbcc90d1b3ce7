"""`python -m gateway` and `python -m worker` refuse to start, exit 2 with one line saying why, on CPU
workers to spawn for another thread count than the artifacts', a port already taken, a tokenizer file
they cannot read and a worker entry the config does not have; never a traceback. Configured bounds
other than the compiled ones are refused with both values named, and so are artifacts whose manifest
records no bounds: the compiled bounds are the only ones at run time."""

from __future__ import annotations

import dataclasses
import json

import msgspec.structs
import socket

import pytest

from gateway.__main__ import _settings
from gateway.__main__ import main as gateway_main
from gateway.limits import Limits
from gateway.tokenizer import RequestTokenizer
from loadgen.standin_worker import BOUNDS as STANDIN_BOUNDS
from loadgen.standin_worker import standin_manifest
from shared.config import load_config
from shared.manifest import MANIFEST, manifest_json
from worker.__main__ import main as worker_main

CONFIG = """
[bounds]
{bounds}
[worker]
endpoints = ["ipc:///tmp/boundserve-startup-test-0"]
devices = ["cpu"]
cpu_threads = {threads}
[gateway]
port = {port}
access_log = false
"""


def artifacts(folder, tokenizer_dir, request_tokenizer, **manifest):
    """An artifacts folder holding what the gateway reads: the stand-in's manifest and a tokenizer."""
    folder.mkdir()
    built = msgspec.structs.replace(standin_manifest(request_tokenizer.vocab_size), cpu_threads=2, **manifest)
    (folder / MANIFEST).write_bytes(manifest_json(built))
    (folder / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    return folder


def config(tmp_path, max_labels, threads=2, port=0):
    """A config whose bounds are the stand-in's but for max_labels."""
    bounds = {**dataclasses.asdict(STANDIN_BOUNDS), "max_labels": max_labels}
    lines = "\n".join(f"{name} = {value}" for name, value in bounds.items() if value is not None)
    path = tmp_path / "deploy.toml"
    path.write_text(CONFIG.format(bounds=lines, threads=threads, port=port))
    return str(path)


def refusal(capfd) -> str:
    """What the gateway's log said (JSON lines on stderr)."""
    return capfd.readouterr().err


def test_spawning_cpu_workers_for_another_thread_count_is_refused(tmp_path, tokenizer_dir, request_tokenizer, capfd):
    """Each worker would refuse the artifacts and be restarted, again and again: the gateway refuses first."""
    folder = artifacts(tmp_path / "art", tokenizer_dir, request_tokenizer)
    deploy = config(tmp_path, STANDIN_BOUNDS.max_labels, threads=1)
    assert gateway_main(["--config", deploy, "--artifacts", str(folder), "--spawn-workers"]) == 2
    said = refusal(capfd)
    assert "cannot start" in said and "compiled for 2 CPU thread(s) per call but [worker] cpu_threads = 1" in said


def test_spawning_workers_that_are_found_by_dns_is_refused(tmp_path, tokenizer_dir, request_tokenizer, capfd):
    """--spawn-workers starts the endpoints list; found workers are someone else's to start."""
    folder = artifacts(tmp_path / "art", tokenizer_dir, request_tokenizer)
    deploy = config(tmp_path, STANDIN_BOUNDS.max_labels)
    text = open(deploy).read().replace("[worker]\n", '[worker]\ndiscovery = "dns"\nservice = "boundserve-worker"\n')
    open(deploy, "w").write(text)
    assert gateway_main(["--config", deploy, "--artifacts", str(folder), "--spawn-workers"]) == 2
    said = json.loads(refusal(capfd).splitlines()[-1])["message"]  # a JSON log line
    assert said.startswith("cannot start") and 'with discovery = "dns" the workers are found, not started' in said


def test_configured_bounds_other_than_the_compiled_are_refused_naming_both(tmp_path, tokenizer_dir,
                                                                           request_tokenizer, capfd):
    """At run time the compiled bounds are the only ones: a config whose [bounds] say otherwise is refused
    with both values named, instead of letting an edited [bounds] seem to take effect without a rebuild."""
    folder = artifacts(tmp_path / "art", tokenizer_dir, request_tokenizer)
    compiled = STANDIN_BOUNDS.max_labels
    assert gateway_main(["--config", config(tmp_path, compiled + 1), "--artifacts", str(folder)]) == 2
    said = refusal(capfd)
    assert f"bounds.max_labels = {compiled + 1}, compiled for {compiled}" in said, said
    assert "leave [bounds] out" in said


def test_a_config_without_bounds_serves_the_compiled_ones(tmp_path, tokenizer_dir, request_tokenizer):
    folder = artifacts(tmp_path / "art", tokenizer_dir, request_tokenizer)
    path = tmp_path / "no-bounds.toml"
    path.write_text(CONFIG.replace("[bounds]\n{bounds}\n", "").format(threads=2, port=0))
    settings = _settings(load_config(path), folder, spawn_workers=False)
    assert settings.config.bounds is None
    served = Limits.of(settings.config, settings.manifest, request_tokenizer.vocab_size)
    assert served.bounds == settings.manifest.bounds


def test_a_manifest_without_bounds_is_refused_not_served_with_the_configs(tmp_path, tokenizer_dir,
                                                                          request_tokenizer, capfd):
    """The config's [bounds] never stand in for the compiled ones, even where the manifest records none."""
    folder = artifacts(tmp_path / "art", tokenizer_dir, request_tokenizer, bounds=None)
    assert gateway_main(["--config", config(tmp_path, STANDIN_BOUNDS.max_labels), "--artifacts", str(folder)]) == 2
    said = refusal(capfd)
    assert "cannot start" in said and "manifest records no bounds" in said, said


def test_a_port_already_taken_is_refused_in_one_line(tmp_path, tokenizer_dir, request_tokenizer, capfd):
    folder = artifacts(tmp_path / "art", tokenizer_dir, request_tokenizer)
    compiled = STANDIN_BOUNDS.max_labels
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert gateway_main(["--config", config(tmp_path, compiled, port=port), "--artifacts", str(folder)]) == 2
    said = refusal(capfd)
    assert f"cannot listen on 127.0.0.1:{port}" in said and "in use" in said, said


def test_a_tokenizer_file_that_does_not_read_is_named(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not a tokenizer")
    with pytest.raises(ValueError, match="tokenizer.json is not a tokenizer the tokenizers library reads"):
        RequestTokenizer.from_artifacts(tmp_path)


@pytest.mark.parametrize("index", ["1", "-1"])
def test_a_worker_index_the_config_does_not_have_is_refused(tmp_path, capsys, index):
    assert worker_main(["--config", config(tmp_path, 8), "--artifacts", str(tmp_path), "--index", index]) == 2
    assert f"--index {index}: {tmp_path / 'deploy.toml'} has 1 [worker] entry, 0 to 0" in capsys.readouterr().err
