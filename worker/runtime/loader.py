"""Loading compiled artifacts for a worker: every node of one folder, sharing one set of weights.

`load_nodes` checks the manifest against this machine and this process's thread count, loads the
weights once and hands the same tensors to every package (no second copy), and wraps each package
in its node, which validates a batch against the compiled bounds before it ever reaches the package.
The packages call no Python: two threads may call one at once (given a runner each).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from worker.runtime.artifacts import load_kernels, load_package, load_runner, load_weights, read_manifest
from worker.runtime.beam_node import BeamNode
from worker.runtime.machine import check_compatible, check_threads
from worker.runtime.score_node import ScoreNode
from shared.bounds import BoundsError
from shared.manifest import Manifest

__all__ = ["BoundsError", "Nodes", "load_nodes"]


@dataclass
class Nodes:
    """Every node of one artifacts folder, sharing one set of weight tensors."""

    manifest: Manifest
    score: ScoreNode | None
    beam: BeamNode | None
    weights: dict[str, torch.Tensor]


def load_nodes(artifacts_dir: str | Path, device: str = "cpu", runners: int = 1) -> Nodes:
    """Load and check an artifacts folder for `device` (cpu or cuda:N); each package can serve
    `runners` threads at once."""
    folder = Path(artifacts_dir)
    manifest = read_manifest(folder)
    check_compatible(manifest.machine, device)
    if device == "cpu":
        check_threads(manifest.cpu_threads, torch.get_num_threads())
    weights = load_weights(folder, manifest, device)
    if manifest.kernels is not None:  # before the packages: they call its operators
        load_kernels(folder, manifest.kernels)
    through_runner = manifest.runner is not None and device == "cpu"
    if through_runner:
        load_runner(folder, manifest.runner)
    packages = {
        workload: load_package(folder / node.package, node.sha256, weights, device, runners, through_runner)
        for workload, node in manifest.node_table().items()
    }
    score = ScoreNode(packages["score"], manifest, device) if "score" in packages else None
    beam = BeamNode.from_package(packages["beam"], manifest, device) if "beam" in packages else None
    return Nodes(manifest=manifest, score=score, beam=beam, weights=weights)
