"""A CPU worker's resident set as beam widths vary: the heap that keeps freed memory, without and with
the worker's resident limit (worker/memory.py, `[worker] resident_limit_mb`).

One beam node (Qwen2.5-0.5B's shapes, bf16 by default, random weights written by transformers), one
8-token prompt a call, S = 4 steps, k = 4, and the widths 4, 5, 6, ... in turn: every call a new
shape, each a little larger than the last, the case in which oneDNN's cached primitives, allocated
during a call, pin the holes its freed buffers leave (worker/runtime/allocator.py). Each side runs in a
process of its own, as a worker does (worker/runtime/allocator.keep_freed_memory, then the node), the
calls on the same prompts: `kept` without a limit, `limited` releasing the heap's free pages after
any call that leaves the resident set above --limit-mb (ResidentLimit, as the worker's compute
thread calls it). The sides run one after the other, not interleaved: their seconds are reported,
not held to a ratio. Parity: both sides return the same beams (the release changes no arithmetic).
Reported per side: the resident set's rise over its start every --every calls, its largest, the
releases and the seconds.

    .venv/bin/python bench/worker_memory.py [--model qwen2.5-0.5b] [--dtype bf16|fp32] [--layers N]
                                            [--calls 150] [--limit-mb 3072] [--every 25] [--quick]

Figures from it (docs/design/compilation.md, "Memory between calls") are full runs; --quick is a smoke test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from bench.harness.common import FLOAT_DTYPES, MODELS, bench_config, build_artifacts, emit, shaped_checkpoint

PROMPT, S, K, FIRST_WIDTH = 8, 4, 4, 4
GIB = 2**30
BEAMS_ABS = 1e-6  # beam scores of the two sides: the same node on the same inputs


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
    parser.add_argument("--dtype", choices=sorted(FLOAT_DTYPES), default="bf16")
    parser.add_argument("--layers", type=int, help="decoder layers (default: the real model's depth; quick 2)")
    parser.add_argument("--calls", type=int, help="calls, widths 4, 5, ... in turn (default 150; quick 20)")
    parser.add_argument("--limit-mb", type=int, help="the limited side's resident limit in MiB (default 3072; "
                        "quick 256, under the process's start, so that its releases run)")
    parser.add_argument("--every", type=int, default=25, help="record the resident set every this many calls")
    parser.add_argument("--quick", action="store_true", help="2 layers, 20 calls: a smoke test, never a headline")
    parser.add_argument("--side", choices=("kept", "limited"), help=argparse.SUPPRESS)  # a side's own process
    parser.add_argument("--artifacts", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.layers = args.layers or (2 if args.quick else MODELS[args.model][2])
    args.calls = args.calls or (20 if args.quick else 150)
    args.limit_mb = args.limit_mb or (256 if args.quick else 3072)
    return args


def run_side(args) -> dict:
    """One side, in this process: the calls, the resident set every `every` calls, the releases."""
    from worker.runtime.allocator import keep_freed_memory, resident_bytes

    keep_freed_memory()  # before anything allocates, as a CPU worker does
    from worker.runtime.loader import load_nodes
    from shared.logs import EventLog
    from worker.memory import MIB, ResidentLimit

    nodes = load_nodes(args.artifacts)
    limit = ResidentLimit(args.limit_mb * MIB, EventLog("worker-memory-bench")) if args.side == "limited" else None
    prompt = torch.randint(0, nodes.manifest.model.vocab_size, (PROMPT,), generator=torch.Generator().manual_seed(0))
    start, releases, marks, scores, tokens = resident_bytes(), 0, [], [], []
    began = time.perf_counter()
    for call, width in enumerate(range(FIRST_WIDTH, FIRST_WIDTH + args.calls), start=1):
        out = nodes.beam(prompt, torch.tensor([PROMPT]), width, S, K)
        scores.append(out.scores.flatten().tolist())
        tokens.append(out.sequences.flatten().tolist())
        if limit is not None and limit.after_batch():
            releases += 1
        if call % args.every == 0 or call == args.calls:
            rise = round((resident_bytes() - start) / GIB, 3)
            marks.append({"calls": call, "width": width, "resident_rise_gib": rise})
    return {"seconds": round(time.perf_counter() - began, 2), "releases": releases, "start_resident_gib":
            round(start / GIB, 3), "resident_rise_by_calls": marks,
            "max_resident_rise_gib": max(m["resident_rise_gib"] for m in marks), "scores": scores, "tokens": tokens}


def side_process(args, side: str, artifacts: Path) -> dict:
    """`side` run in a process of its own; its result (the last line it prints)."""
    argv = [sys.executable, __file__, "--side", side, "--artifacts", str(artifacts), "--calls", str(args.calls),
            "--limit-mb", str(args.limit_mb), "--every", str(args.every), "--layers", str(args.layers)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def parity(kept: dict, limited: dict) -> list[dict]:
    """Both sides' beams: the same tokens, scores within BEAMS_ABS."""
    gap = max((abs(a - b) for x, y in zip(kept["scores"], limited["scores"]) for a, b in zip(x, y)), default=0.0)
    same_tokens = kept["tokens"] == limited["tokens"] and len(kept["scores"]) == len(limited["scores"])
    return [{"check": "beams of kept and limited", "ok": same_tokens and gap <= BEAMS_ABS,
             "same_tokens": same_tokens, "max_abs_score": gap, "bound": BEAMS_ABS}]


def main() -> None:
    args = parse_args()
    if args.side:
        print(json.dumps(run_side(args)))
        return
    family, shape, _ = MODELS[args.model]
    checkpoint = shaped_checkpoint(family, shape, args.layers, torch.float32)
    dtype = str(FLOAT_DTYPES[args.dtype]).removeprefix("torch.")
    widest = FIRST_WIDTH + args.calls - 1
    config = bench_config(checkpoint, dtype, ("beam",), max_beam_width=widest, max_new_tokens=S,
                          max_prompt_tokens=PROMPT, max_beam_requests_per_batch=1)
    artifacts = build_artifacts(config, f"beam-{args.model}-{args.dtype}-{args.layers}l-w{widest}")
    sides = {side: side_process(args, side, artifacts) for side in ("kept", "limited")}
    checks = parity(sides["kept"], sides["limited"])
    for result in sides.values():
        del result["scores"], result["tokens"]
    emit(f"worker_memory-{args.model}-{args.dtype}-{args.layers}l",
         {"bench": "worker_memory", "model": args.model, "dtype": args.dtype, "layers": args.layers,
          "calls": args.calls, "widths": [FIRST_WIDTH, widest], "prompt_tokens": PROMPT, "limit_mb": args.limit_mb,
          "order": "kept, then limited (one process each, not interleaved)", "sides": sides, "parity": checks,
          "quick": args.quick})


if __name__ == "__main__":
    main()
