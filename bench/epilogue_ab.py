"""One decoder layer's MLP block with its pointwise work as GEMM epilogues against separate kernels, in one process.

What compile/linear.py's epilogues change, measured where nothing else moves: the SwiGLU MLP and its residual add
at a model's shapes (default Qwen2.5-0.5B: H = 896, I = 4,864) on T tokens (default 4,285, bench/score_node.py's
request), weights prepacked as the worker packs them (worker/runtime/packing.py):
  separate   oneDNN GEMM of the fused gate|up weight, Inductor's fused SiLU·mul kernel, oneDNN down GEMM,
             Inductor's add kernel (the node before epilogues);
  epilogues  oneDNN gate GEMM with a SiLU post-op, up GEMM with a binary multiply post-op by the activated gate,
             down GEMM with a binary add post-op of the residual (compile/model.Mlp.residual on oneDNN).
Timed alternately call by call (ABAB, then BABA), each call's CPU time and wall time; the CPU time of a
one-thread run (the default) is the work done even on a shared machine (other processes add wall time, not
this process's CPU time). Parity: each side against float32 on the same rounded inputs, bounded as bf16 runs
are (bench/harness/parity.bf16_check, the separate side's error standing for transformers' own).

    .venv/bin/python bench/epilogue_ab.py [--model qwen2.5-0.5b] [--dtype bf16|fp32] [--tokens T] [--threads N]
                                          [--calls N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from bench.harness import parity
from bench.harness.common import MODELS, emit, timed_part

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def sides(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> dict:
    """{"separate", "epilogues"} -> a call computing x + down(silu(x gate^T) * (x up^T)), x [T, H]."""
    from worker.runtime.packing import pack

    names = {"gate_up": torch.cat([gate, up]), "gate": gate, "up": up, "down": down}
    packed = pack(names, dict.fromkeys(names, "onednn"))
    linear = torch.ops.mkldnn._linear_pointwise
    intermediate = gate.shape[0]

    @torch.compile(dynamic=False)
    def silu_mul(product: torch.Tensor) -> torch.Tensor:
        g, u = product.split(intermediate, dim=-1)
        return F.silu(g) * u

    @torch.compile(dynamic=False)
    def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b

    def separate() -> torch.Tensor:
        product = linear(x, packed["gate_up"], None, "none", [None], "")
        return add(linear(silu_mul(product), packed["down"], None, "none", [None], ""), x)

    def epilogues() -> torch.Tensor:
        activated = linear(x, packed["gate"], None, "swish", [None], "")
        return linear.binary(linear.binary(x, activated, packed["up"], None, "mul"), x, packed["down"], None, "add")

    return {"separate": separate, "epilogues": epilogues}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--tokens", type=int, default=4285)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=16, help="timed calls per side")
    args = parser.parse_args()
    if args.tokens < 1 or args.calls < 2 or args.threads < 1:
        parser.error("--tokens and --threads must be at least 1, --calls at least 2")
    torch.set_num_threads(args.threads)
    _, shape, _ = MODELS[args.model]
    hidden, intermediate, dtype = shape["hidden_size"], shape["intermediate_size"], DTYPES[args.dtype]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.tokens, hidden, generator=generator).to(dtype)
    gate, up = ((torch.randn(intermediate, hidden, generator=generator) / hidden ** 0.5).to(dtype) for _ in range(2))
    down = (torch.randn(hidden, intermediate, generator=generator) / intermediate ** 0.5).to(dtype)
    calls = sides(x, gate, up, down)
    with torch.inference_mode():
        exact = x.float() + (F.silu(x.float() @ gate.float().T) * (x.float() @ up.float().T)) @ down.float().T
        outputs = {name: call() for name, call in calls.items()}
        if dtype == torch.float32:
            checks = [parity.close_check("epilogues_vs_fp32", outputs["epilogues"], exact, parity.FP32_ABS)]
        else:
            checks = [parity.bf16_check("epilogues_vs_fp32", outputs["epilogues"], outputs["separate"], exact)]
        cpu, wall = {name: [] for name in calls}, {name: [] for name in calls}
        with timed_part():
            for i in range(args.calls):
                for name in (("separate", "epilogues") if i % 2 == 0 else ("epilogues", "separate")):
                    start, cpu_start = time.perf_counter(), time.process_time()
                    calls[name]()
                    cpu[name].append(time.process_time() - cpu_start)
                    wall[name].append(time.perf_counter() - start)
    median_cpu = {name: statistics.median(t) for name, t in cpu.items()}
    median_wall = {name: statistics.median(t) for name, t in wall.items()}
    result = {
        "bench": "epilogue_ab", "model": args.model, "dtype": args.dtype, "tokens": args.tokens,
        "hidden": hidden, "intermediate": intermediate, "calls_per_side": args.calls,
        "median_cpu_ms": {name: round(1e3 * t, 2) for name, t in median_cpu.items()},
        "median_wall_ms": {name: round(1e3 * t, 2) for name, t in median_wall.items()},
        "min_cpu_ms": {name: round(1e3 * min(t), 2) for name, t in cpu.items()},
        "speedup_cpu_time": round(median_cpu["separate"] / median_cpu["epilogues"], 3),
        "speedup_wall": round(median_wall["separate"] / median_wall["epilogues"], 3),
        "parity": checks, "quick": False,
    }
    suffix = "" if args.threads == 1 else f"-t{args.threads}"
    emit(f"epilogue_ab-{args.model}-{args.dtype}{suffix}", result, threads=args.threads)


if __name__ == "__main__":
    main()
