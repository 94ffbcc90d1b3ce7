"""CPU lanes: two lanes of 1 thread against one lane of 2 threads, on the scoring mix, in one run.

The packages call no Python, so two threads may call one package (each with a runner) without the
deadlock the Python attention operator caused; whether a CPU worker gains from running two batches at
once on 1 intra-op thread each, instead of one at a time on 2, is what this measures (the packages run
through the worker's package runner, whose calls release the GIL, so the two lanes compute at once). A
package's thread count is fixed at compile time (compile/build.py), so each setting has its own
build: cpu_threads = 2 (one lane) and cpu_threads = 1 (two lanes, runners = 2).
Rounds alternate the two settings (the process's thread count switched between them); each round
scores the same `--requests` requests of bench/score_node.py's mix: one lane calls them one after
another from one thread, two lanes split them between two threads started together. Reported: requests per second
and per-request latency of each setting, their ratio, and parity of the outputs (float32).

    .venv/bin/python bench/cpu_lanes.py [--model qwen2.5-0.5b] [--dtype fp32|bf16] [--layers N]
                                        [--requests R] [--rounds K]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import threading
import time

import torch

from bench.harness import parity
from bench.harness.common import MODELS, SCORE_BOUNDS, bench_config, build_nodes, emit, run_together, shaped_checkpoint, timed_part
from bench.harness.common import FLOAT_DTYPES as DTYPES
from bench.score_node import LABELS, SAMPLES, make_requests


def build_node(checkpoint, dtype_name: str, threads: int, runners: int, name: str):
    torch.set_num_threads(threads)  # build_nodes compiles for this process's threads
    return build_nodes(bench_config(checkpoint, dtype_name, **SCORE_BOUNDS), name, runners=runners).score


def score(node, samples) -> tuple[float, torch.Tensor]:
    start = time.perf_counter()
    out = node(torch.cat(samples), torch.tensor([len(s) for s in samples]), LABELS, 2)
    return time.perf_counter() - start, out.label_logprobs


def one_lane(node, requests) -> tuple[float, list[float], list]:
    """All requests one after another on 2 intra-op threads, called from a thread of its own like a
    worker's compute thread (a call from the main thread ran 3x slower on this busy machine):
    (wall seconds, per-request seconds, outputs)."""
    torch.set_num_threads(2)  # before the thread starts: it takes the process's count
    done: list[tuple[float, torch.Tensor]] = []
    wall = run_together([lambda: done.extend(score(node, r) for r in requests)])
    return wall, [s for s, _ in done], [o for _, o in done]


def two_lanes(node, requests) -> tuple[float, list[float], list]:
    """The requests split between two threads of 1 intra-op thread each, started together."""
    torch.set_num_threads(1)  # before the threads start: they take the process's count
    done: dict[int, tuple[float, torch.Tensor]] = {}
    start_together = threading.Barrier(2)

    def lane(indices):
        start_together.wait()
        for i in indices:
            done[i] = score(node, requests[i])

    wall = run_together([functools.partial(lane, range(k, len(requests), 2)) for k in range(2)])
    return wall, [done[i][0] for i in range(len(requests))], [done[i][1] for i in range(len(requests))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--requests", type=int, default=4, help="requests per round (split over two lanes)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    family, shape, depth = MODELS[args.model]
    layers = args.layers or depth
    dtype_name = str(DTYPES[args.dtype]).removeprefix("torch.")
    checkpoint = shaped_checkpoint(family, shape, layers, DTYPES[args.dtype])
    name = f"lanes-{args.model}-{args.dtype}-{layers}l"
    nodes = {"one_lane_2_threads": build_node(checkpoint, dtype_name, 2, 1, f"{name}-t2"),
             "two_lanes_1_thread": build_node(checkpoint, dtype_name, 1, 2, f"{name}-t1")}
    runs = {"one_lane_2_threads": one_lane, "two_lanes_1_thread": two_lanes}
    requests = make_requests(args.requests, SAMPLES, 32, 480, shape["vocab_size"])
    for setting, run in runs.items():  # warm-up
        run(nodes[setting], requests[:2])
    walls, latencies, outputs = {k: [] for k in runs}, {k: [] for k in runs}, {}
    with timed_part():
        for round_ in range(args.rounds):
            order = list(runs) if round_ % 2 == 0 else list(reversed(runs))
            for setting in order:
                wall, each, outs = runs[setting](nodes[setting], requests)
                walls[setting].append(wall)
                latencies[setting] += each
                outputs.setdefault(setting, outs)
    check = parity.close_check("label_logprobs_two_lanes_vs_one", torch.cat(outputs["two_lanes_1_thread"]),
                               torch.cat(outputs["one_lane_2_threads"]),
                               parity.FP32_ABS if args.dtype == "fp32" else parity.BF16_ABS)  # summation order only
    rate = {k: len(requests) / statistics.median(v) for k, v in walls.items()}
    result = {
        "bench": "cpu_lanes", "model": args.model, "dtype": args.dtype, "layers": layers,
        "requests_per_round": len(requests), "rounds": args.rounds,
        "requests_per_s": {k: round(v, 4) for k, v in rate.items()},
        "throughput_two_lanes_over_one": round(rate["two_lanes_1_thread"] / rate["one_lane_2_threads"], 3),
        "median_latency_s": {k: round(statistics.median(v), 3) for k, v in latencies.items()},
        "wall_s": walls, "parity": [check], "quick": layers != depth,
    }
    emit(f"cpu_lanes-{args.model}-{args.dtype}-{layers}l", result, threads={"one_lane": 2, "two_lanes": 1})


if __name__ == "__main__":
    main()
