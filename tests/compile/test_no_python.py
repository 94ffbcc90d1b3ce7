"""The compiled packages call no Python: they run in a process that never imports this project (a
bfloat16 package with the kernel library of its folder, loaded by torch alone), and two threads share
one package (both finish, with the results of one thread alone)."""

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from worker.runtime.beam_node import node_inputs
from worker.runtime.loader import load_nodes
from tests.compile.reference import random_batch

LABELS = torch.tensor([0, 5, 17])

# Loads a package with torch alone (no project module, so no Python operator could be registered),
# runs the saved inputs and compares with the outputs the project's own runtime got.
BARE_RUN = """
import sys
import torch
from safetensors.torch import load_file

torch.set_num_threads(1)
package_path, weights_path, io_path, *library = sys.argv[1:]
for path in library:  # the C++ operators the package calls (worker/runtime/kernels)
    torch.ops.load_library(path)
saved = torch.load(io_path)
package = torch._inductor.aoti_load_package(package_path)
weights = load_file(weights_path)
package.load_constants({n: weights[n] for n in package.get_constant_fqns()}, check_full_update=True,
                       user_managed=True)
outputs = package(*saved["inputs"])
assert all(torch.equal(got, want) for got, want in zip(outputs, saved["outputs"], strict=True))
project = sorted(m for m in sys.modules if m.split(".")[0] in ("compile", "shared", "worker", "gateway", "tests"))
assert not project, project
print("same outputs", len(outputs))
"""


def run_bare(artifacts: Path, package: str, inputs, outputs, tmp_path, library: str | None = None) -> str:
    io_path = tmp_path / f"{package}-io.pt"
    torch.save({"inputs": list(inputs), "outputs": list(outputs)}, io_path)
    done = subprocess.run([sys.executable, "-c", BARE_RUN, str(artifacts / package),
                           str(artifacts / "weights.safetensors"), str(io_path),
                           *([str(artifacts / library)] if library else [])],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("artifacts", ["demo_artifacts", "bf16_kernel_artifacts", "llama_artifacts"])
def test_scoring_package_runs_without_the_project(artifacts, request, tmp_path):
    """bf16_kernel_artifacts where the CPU has AVX512-BF16 and no AMX, llama_artifacts (float32, heads 16
    wide) where it has AVX512-BF16: their attention is worker/runtime/kernels' operator, from the folder's library
    loaded by torch alone."""
    folder = request.getfixturevalue(artifacts)
    if artifacts == "llama_artifacts":
        folder = folder[1]  # (checkpoint, artifacts)
    nodes = load_nodes(folder)
    node = nodes.score
    prefix, *suffixes = random_batch(node.vocab_size, [4, 5, 50, 17], 0)  # one shared prefix, three samples
    ids = torch.cat([prefix, *suffixes])
    inputs, *_ = node.package_inputs(ids, torch.tensor([len(s) for s in suffixes]), LABELS, torch.tensor([len(prefix)]),
                                    torch.tensor([3]), keep=[0])  # the prefix's keys/values returned too
    with torch.inference_mode():
        outputs = node.package(*inputs)
    library = nodes.manifest.kernels.file if nodes.manifest.kernels else None
    assert "same outputs 11" in run_bare(folder, "score.pt2", inputs, outputs, tmp_path, library)  # 6 + 3 token + 2 kv


def test_beam_package_runs_without_the_project(beam_artifacts, tmp_path):
    nodes = load_nodes(beam_artifacts)
    prompts = random_batch(nodes.beam.vocab_size, [7, 12], 1)
    inputs = node_inputs(torch.cat(prompts), torch.tensor([7, 12]), 4, 3, False, nodes.beam.block)
    with torch.inference_mode():
        outputs = nodes.beam._run(*inputs)
    assert "same outputs 3" in run_bare(beam_artifacts, "beam.pt2", inputs, outputs, tmp_path)


@pytest.mark.parametrize("artifacts", ["demo_artifacts", "bf16_kernel_artifacts"])
def test_two_threads_share_one_package(artifacts, request):
    """With the attention as a Python operator this hung the process: a call waiting for the
    package's only runner held the GIL the running call needed. (Here the calls take turns for the
    package's one runner, waiting for it with the GIL released: worker/runtime/package_runner.py.)"""
    node = load_nodes(request.getfixturevalue(artifacts)).score  # one runner: the case that deadlocked
    batches = [random_batch(node.vocab_size, lengths, seed) for seed, lengths in enumerate([[40, 64, 9], [3, 50]])]
    call = lambda samples: node(torch.cat(samples), torch.tensor([len(s) for s in samples]), LABELS, 3)  # noqa: E731
    expected = [call(b).label_logits for b in batches]
    start, results = threading.Barrier(2), [[], []]

    def work(i):
        start.wait()  # both threads enter the package together
        for _ in range(3):
            results[i].append(call(batches[i]).label_logits)

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a call never returned"
    for i in range(2):
        assert len(results[i]) == 3 and all(torch.equal(r, expected[i]) for r in results[i])


# Loading artifacts compiled for 1 thread in a process running 2: refused before any call.
MORE_THREADS = """
import sys
import torch
from worker.runtime.machine import ArtifactMismatch
from worker.runtime.loader import load_nodes

torch.set_num_threads(2)
try:
    load_nodes(sys.argv[1])
except ArtifactMismatch as exc:
    print(exc)
"""


def test_a_process_on_more_threads_than_compiled_is_refused_naming_both(demo_artifacts):
    import json

    assert json.loads((demo_artifacts / "manifest.json").read_text())["cpu_threads"] == 1
    done = subprocess.run([sys.executable, "-c", MORE_THREADS, str(demo_artifacts)], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert "compiled for 1 CPU thread(s) but this process runs 2" in done.stdout, done.stderr[-2000:]


def test_a_call_on_more_threads_than_compiled_is_refused(demo_artifacts):
    import pytest

    from worker.runtime.machine import ArtifactMismatch

    node = load_nodes(demo_artifacts).score
    torch.set_num_threads(2)
    try:
        with pytest.raises(ArtifactMismatch, match="compiled for 1 CPU thread"):
            node(torch.tensor([1, 2, 3]), torch.tensor([3]), LABELS, 1)
    finally:
        torch.set_num_threads(1)
