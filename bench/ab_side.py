"""One side of bench/node_ab.py: builds and loads the node of the source tree it runs in, then times
the requests it is asked for, one JSON line per call.

Run by node_ab.py as `python <this file> ...` with the tree to build on PYTHONPATH (a git ref's
tree or this one), so it imports only what every tree has: compile.build.build,
worker.runtime.loader.load_nodes, shared.config.load_config and the nodes' call signatures.
stdin: one request index per line; stdout: {"ready": ...}, then {"seconds": wall s, "cpu_seconds": this
process's CPU time, "minor_faults": page faults served without I/O (fresh pages the allocator mapped),
"outputs": [...]} per call.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import sys
import time
from pathlib import Path

import torch

LABELS = torch.tensor([9454, 2152])  # as bench/score_node.py


def keep_freed_memory() -> bool:
    """worker/runtime/allocator.py of the tree this file is in, loaded by path: the side's own tree (an older
    commit's) may not have it, and its `compile` package is the one on the import path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_allocator", Path(__file__).parents[1] / "worker/runtime/allocator.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.keep_freed_memory()


def build_config(tree: Path, workload: str, checkpoint: str, dtype: str, threads: int, gemm: str | None = None):
    """configs/test.toml with the headline benches' bounds (bench/score_node.py, bench/beam_node.py);
    `gemm` sets model.gemm (a tree that has the setting), None keeps the tree's default."""
    from shared.config import BeamConfig, ScoreConfig, load_config

    config = load_config(tree / "configs" / "test.toml")
    worker = dataclasses.replace(config.worker, cpu_threads=threads)
    model = dataclasses.replace(config.model, path=checkpoint, dtype=dtype, **({"gemm": gemm} if gemm else {}))
    if workload == "beam":
        bounds = dataclasses.replace(config.build_bounds, max_beam_width=100, max_new_tokens=4, max_prompt_tokens=512,
                                     max_beam_requests_per_batch=4)
        return config.replace(model=model, bounds=bounds, worker=worker, score=ScoreConfig(enabled=False),
                              beam=BeamConfig(enabled=True))
    bounds = dataclasses.replace(config.build_bounds, max_samples_per_batch=16, max_tokens_per_sample=512,
                                 max_tokens_per_batch=8192)
    return config.replace(model=model, bounds=bounds, worker=worker)


def caller(nodes, workload: str):
    """request -> list of floats to compare (label log-probs; beam scores then tokens)."""
    def score(samples):
        out = nodes.score(torch.cat(samples), torch.tensor([len(s) for s in samples]), LABELS, 2)
        return out.label_logprobs.flatten().tolist()

    def shared(request):
        context, items = request
        out = nodes.score(torch.cat([context, *items]), torch.tensor([len(i) for i in items]), LABELS, 1,
                          torch.tensor([len(context)]), torch.tensor([len(items)]))
        return out.label_logprobs.flatten().tolist()

    def beam(prompts):
        out = nodes.beam(torch.cat(prompts), torch.tensor([len(p) for p in prompts]), 100, 4, 4)
        return out.scores.flatten().tolist() + out.sequences.flatten().float().tolist()

    return {"score": score, "shared": shared, "beam": beam}[workload]


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--tree", "--workload", "--checkpoint", "--dtype", "--out", "--requests"):
        parser.add_argument(name, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--gemm", help="model.gemm of this side's build (default: the tree's)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    keep_freed_memory()  # both sides run as a CPU worker does (worker/runtime/allocator.py of this bench's tree)
    from compile import build as build_module
    from compile.build import build
    from worker.runtime.loader import load_nodes

    start = time.perf_counter()
    build(build_config(Path(args.tree), args.workload, args.checkpoint, args.dtype, args.threads, args.gemm), args.out)
    built_s = time.perf_counter() - start
    call = caller(load_nodes(args.out), args.workload)
    requests = torch.load(args.requests)
    call(requests[0])  # warm-up
    print(json.dumps({"ready": True, "code": build_module.__file__, "build_s": round(built_s, 1)}), flush=True)
    for line in sys.stdin:
        request = requests[int(line)]
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start, cpu_start = time.perf_counter(), time.process_time()
        outputs = call(request)
        print(json.dumps({"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu_start,
                          "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults,
                          "outputs": outputs}), flush=True)


if __name__ == "__main__":
    main()
