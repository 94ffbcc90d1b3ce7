"""One package called through the worker's package runner against torch's own loader, in one run.

A CPU worker runs its packages through worker/runtime/package_runner.py, whose calls release the GIL so
that the worker reads the next batch while one computes. What that costs a call is measured here: the
same compiled scoring package, loaded once through the runner (as the worker loads it) and once through
torch's loader (torch._inductor's load_package), both on the same weights, scores the same requests of
bench/score_node.py's mix one at a time from the same thread, the two sides alternating request by
request and their order swapped every round. Parity: every request's label log-probabilities are
identical on both sides. Reported: each side's median seconds per request and the runner's over
torch's (above 1: the runner is slower by that factor).

    .venv/bin/python bench/runner_call.py [--model qwen2.5-0.5b] [--dtype fp32|bf16] [--layers N]
                                          [--requests R] [--rounds K]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.harness import parity
from bench.harness.common import MODELS, SCORE_BOUNDS, bench_config, build_artifacts, emit, load_built
from bench.harness.common import shaped_checkpoint, timed_part
from bench.harness.common import FLOAT_DTYPES as DTYPES
from bench.score_node import LABELS, SAMPLES, make_requests
from worker.runtime.artifacts import load_package, read_manifest
from worker.runtime.package_runner import RunnerPackage
from worker.runtime.score_node import ScoreNode


def score(node: ScoreNode, samples) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = node(torch.cat(samples), torch.tensor([len(s) for s in samples]), LABELS, 2)
    return time.perf_counter() - start, out.label_logprobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    family, shape, depth = MODELS[args.model]
    layers = args.layers or depth
    dtype_name = str(DTYPES[args.dtype]).removeprefix("torch.")
    config = bench_config(shaped_checkpoint(family, shape, layers, DTYPES[args.dtype]), dtype_name, **SCORE_BOUNDS)
    folder = build_artifacts(config, f"runner-{args.model}-{args.dtype}-{layers}l")
    nodes = load_built(folder, config)
    manifest = read_manifest(folder)
    entry = manifest.node_table().score
    through_torch = load_package(folder / entry.package, entry.sha256, nodes.weights, "cpu")
    sides = {"runner": nodes.score, "torch": ScoreNode(through_torch, manifest, "cpu")}
    assert isinstance(sides["runner"].package, RunnerPackage), "the build did not load through the runner"
    requests = make_requests(args.requests, SAMPLES, 32, 480, shape["vocab_size"])
    for node in sides.values():  # warm-up
        score(node, requests[0])
    seconds, outputs = {k: [] for k in sides}, {k: [] for k in sides}
    with timed_part():
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for samples in requests:
                for side in order:
                    took, out = score(sides[side], samples)
                    seconds[side].append(took)
                    outputs[side].append(out)
    check = parity.close_check("label_logprobs_runner_vs_torch", torch.cat(outputs["runner"]),
                               torch.cat(outputs["torch"]), 0.0)  # the same package on the same weights
    median = {k: statistics.median(v) for k, v in seconds.items()}
    result = {
        "bench": "runner_call", "model": args.model, "dtype": args.dtype, "layers": layers,
        "requests_per_round": len(requests), "rounds": args.rounds,
        "median_request_s": {k: round(v, 4) for k, v in median.items()},
        "runner_over_torch_time": round(median["runner"] / median["torch"], 4),
        "parity": [check], "quick": layers != depth,
    }
    emit(f"runner_call-{args.model}-{args.dtype}-{layers}l", result)


if __name__ == "__main__":
    main()
