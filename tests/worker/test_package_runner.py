"""A CPU build ships the package runner library and the worker runs its packages through it: a call
releases the GIL for the whole run, so the worker's receiving thread reads, decodes and answers while a
batch computes.

How often another thread gets the GIL during a call is counted, in a process of its own (no thread but
the two below asks for the GIL) and with a switch interval far longer than the test, so that a thread
waiting for the GIL gets it only when its holder releases it. The calling thread signals, then calls the
package; the other thread counts its turns until the call returns, giving the GIL up after each. Through
torch's loader, which releases the GIL only for a moment of the call (seen: once at most), the caller
takes it back and keeps it for the rest of the run, so the count stops at once; through the runner it
goes on for the whole run."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.compile.reference import random_batch
from worker.runtime import package_runner
from worker.runtime.artifacts import load_package
from worker.runtime.kernels import KernelMismatch
from worker.runtime.loader import load_nodes
from worker.runtime.machine import ArtifactMismatch

LABELS = torch.tensor([0, 5, 17])
TRIES, MOMENTS = 5, 2

PROBE = """
import json, sys, threading, time
from pathlib import Path

import torch
from worker.runtime.artifacts import load_package
from worker.runtime.loader import load_nodes
from tests.worker.test_package_runner import score_inputs

folder, sha256, tries = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
torch.set_num_threads(1)
nodes = load_nodes(folder)
inputs = score_inputs(nodes.score)
packages = {"runner": nodes.score.package, "torch": load_package(folder / "score.pt2", sha256, nodes.weights, "cpu")}


def turns_during_the_call(package, most=1000):
    started, state = threading.Event(), {"returned": False}

    def call():
        started.set()
        with torch.inference_mode():
            package(*inputs)
        state["returned"] = True

    caller = threading.Thread(target=call)
    caller.start()
    started.wait()
    turns = 0
    while not state["returned"] and turns < most:
        turns += 1
        time.sleep(0)  # gives the GIL up: a caller waiting for it takes it
    caller.join()
    return turns


sys.setswitchinterval(1000.0)
print(json.dumps({name: [turns_during_the_call(p) for _ in range(tries)] for name, p in packages.items()}))
"""


def score_inputs(node):
    """The package's inputs for eight samples of 32 tokens (the test config's largest batch)."""
    samples = random_batch(node.vocab_size, [32] * 8, 0)
    inputs, *_ = node.package_inputs(torch.cat(samples), torch.tensor([len(s) for s in samples]), LABELS,
                                     torch.zeros(8, dtype=torch.long), torch.ones(8, dtype=torch.long))
    return inputs


def test_a_cpu_build_ships_the_runner_and_its_calls_release_the_gil(demo_artifacts):
    manifest = json.loads((demo_artifacts / "manifest.json").read_text())
    assert manifest["runner"]["file"] == package_runner.LIBRARY
    nodes = load_nodes(demo_artifacts)
    assert isinstance(nodes.score.package, package_runner.RunnerPackage)
    inputs = score_inputs(nodes.score)
    sha256 = manifest["nodes"]["score"]["sha256"]
    torch_loaded = load_package(demo_artifacts / "score.pt2", sha256, nodes.weights, "cpu")
    with torch.inference_mode():
        assert all(torch.equal(a, b) for a, b in zip(nodes.score.package(*inputs), torch_loaded(*inputs), strict=True))
    done = subprocess.run([sys.executable, "-c", PROBE, str(demo_artifacts), sha256, str(TRIES)], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    turns = json.loads(done.stdout.strip().splitlines()[-1])
    assert max(turns["torch"]) <= MOMENTS, turns  # why the runner exists
    assert max(turns["runner"]) > 5 * MOMENTS, turns


def test_a_folder_without_the_runner_loads_with_torchs_loader(demo_artifacts, tmp_path):
    folder = tmp_path / "older"
    shutil.copytree(demo_artifacts, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / manifest.pop("runner")["file"]).unlink()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    node = load_nodes(folder).score
    assert not isinstance(node.package, package_runner.RunnerPackage)
    samples = random_batch(node.vocab_size, [9, 4], 1)
    assert node(torch.cat(samples), torch.tensor([9, 4]), LABELS, 2).label_logits.shape == (2, 3)


def test_a_changed_runner_file_is_refused(demo_artifacts, tmp_path):
    folder = tmp_path / "changed"
    shutil.copytree(demo_artifacts, folder)
    with open(folder / package_runner.LIBRARY, "ab") as library:
        library.write(b"\0")
    with pytest.raises(ArtifactMismatch, match="boundserve_runner.so: content does not match the manifest's hash"):
        load_nodes(folder)


def test_a_process_loads_one_build_of_the_runner(demo_artifacts, tmp_path):
    """The same content from another path is not loaded twice (its class would be registered again); a
    different build is refused before it is loaded."""
    built = demo_artifacts / package_runner.LIBRARY
    package_runner.load(built)  # the folder's runner is this process's build
    same = shutil.copyfile(built, tmp_path / "same.so")
    package_runner.load(same)
    other = tmp_path / "other.so"
    other.write_bytes(built.read_bytes() + b"\0")
    with pytest.raises(KernelMismatch, match="other.so: this process already runs another build of the package"):
        package_runner.load(other)


def test_a_call_with_the_wrong_number_of_inputs_says_so(demo_artifacts):
    package = load_nodes(demo_artifacts).score.package
    with pytest.raises(TypeError, match=r"the package takes \d+ tensors, was given 1 values"):
        package(torch.zeros(3))
