"""Today's node against this tree's, in one run: A is the node built from a git ref (default main),
B the node built from the working tree, each in a process of its own holding its own loaded package
(bench/ab_side.py), timed alternately request by request (A B, then B A, ...) on the same
requests and threads. Reports each side's median seconds per call, speedup = A / B, the median of
the per-pair ratios, and parity between them (a failed check writes nothing: bench/harness/provenance.py).
Each call's CPU time is reported too: with --threads 1 it measures the work done even on a busy
machine (another process taking the core adds wall time, not CPU time); with more threads it also
counts OpenMP threads spinning at barriers, which contention inflates.

Workloads (the headline benches' requests and bounds): score (bench/score_node.py: 15 samples of
32-480 tokens per request), shared (bench/shared_prefix.py: a 200-400-token context + 15 items of
16-64 tokens, one group), beam (bench/beam_node.py: one 256-token prompt, W = 100, S = 4, k = 4).
Parity: float32 label log-probs of A and B within bench/harness/parity.FP32_ABS; bfloat16 each side's label
log-probs against transformers float32 on the same weights within transformers' own bf16 error
(bench/harness/parity.bf16_check); beam candidates identical up to near-ties. A failed check exits non-zero
and writes nothing. Builds are cached under bench/.cache/node_ab/ (A by commit, B by build key).

    .venv/bin/python bench/node_ab.py --workload score|shared|beam [--ref main] [--model qwen2.5-0.5b]
                                      [--dtype fp32|bf16] [--layers N] [--requests R] [--rounds K] [--build-only]
                                      [--b-gemm auto|aten|onednn] [--tag NAME]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

from bench.harness import parity
from bench.harness.common import CACHE, MODELS, ROOT, emit, shaped_checkpoint, timed_part
from bench.harness.side_process import SideProcess

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SIDE = Path(__file__).resolve().parent / "ab_side.py"


def tree_of(ref: str) -> tuple[str, Path]:
    """(commit, a copy of what a side imports from it: compile/, worker/, shared/, configs/), exported once per
    commit with git archive into the temporary directory (outside bench/: the copy's sources must not
    count as this package's)."""
    commit = subprocess.run(["git", "rev-parse", ref], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    folder = Path(tempfile.gettempdir()) / "boundserve-node-ab" / commit
    if not (folder / "compile").is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile() as archive:
            subprocess.run(["git", "archive", commit, "compile", "worker", "shared", "configs"], cwd=ROOT, stdout=archive,
                           check=True)
            archive.seek(0)
            with tarfile.open(fileobj=archive) as tar:
                tar.extractall(folder, filter="data")
    return commit, folder


def make_requests(workload: str, count: int, vocab: int) -> list:
    if workload == "score":
        from bench.score_node import SAMPLES, make_requests as score_requests

        return score_requests(count, SAMPLES, 32, 480, vocab)
    if workload == "shared":
        from bench.shared_prefix import make_requests as shared_requests

        return shared_requests(count, vocab, (200, 400), (16, 64))
    generator = torch.Generator().manual_seed(0)
    return [[torch.randint(0, vocab, (256,), generator=generator)] for _ in range(count)]


class Side(SideProcess):
    """One side's process: started on a tree, asked to run request i, answering seconds and outputs."""

    def __init__(self, name: str, tree: Path, args, checkpoint: Path, requests_file: Path, out: Path,
                 gemm: str | None = None) -> None:
        dtype = {"fp32": "float32", "bf16": "bfloat16"}[args.dtype]
        # the side imports compile/ and shared/ from its tree
        super().__init__(name, tree, [sys.executable, str(SIDE), "--tree", str(tree), "--workload", args.workload,
                                      "--checkpoint", str(checkpoint), "--dtype", dtype, "--out", str(out),
                                      "--requests", str(requests_file), "--threads", str(args.threads)]
                         + (["--gemm", gemm] if gemm else []))

    def run(self, index: int) -> dict:
        return self.ask(str(index))


def reference_checks(args, checkpoint: Path, requests: list, outputs: dict) -> list[dict]:
    """bf16: each side's label log-probs on the first request against transformers in float32 on the
    same weights, bounded by transformers' own bf16 error. fp32: A against B."""
    if args.dtype == "fp32" or args.workload == "beam":
        tolerance = parity.FP32_ABS
        a, b = torch.tensor(outputs["A"][0]), torch.tensor(outputs["B"][0])
        if args.workload == "beam":
            return [{"check": "beam_scores_and_tokens_A_vs_B", "max_abs_diff": float((a - b).abs().max()),
                     "tolerance": tolerance, "ok": bool((a - b).abs().max() <= tolerance)}]
        return [parity.close_check("label_logprobs_A_vs_B", b, a, tolerance)]
    from transformers import AutoModelForCausalLM

    from bench.harness import hf_baselines as hf_side

    samples = requests[0] if args.workload == "score" else [torch.cat([requests[0][0], i]) for i in requests[0][1]]
    labels = torch.tensor([9454, 2152])
    refs = {}
    for dtype in (torch.float32, torch.bfloat16):
        hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=dtype).eval()
        with torch.inference_mode():
            refs[dtype] = torch.log_softmax(hf_side.careful(hf, samples, 0).float(), -1)[:, labels]
    return [parity.bf16_check(f"label_logprobs_{side}_vs_fp32", torch.tensor(outputs[side][0]).view(-1, 2),
                              refs[torch.bfloat16], refs[torch.float32]) for side in ("A", "B")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("score", "shared", "beam"), required=True)
    parser.add_argument("--ref", default="main", help="git ref whose node is A (default main)")
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2.5-0.5b")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--layers", type=int, help="default: the real model's depth")
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="passes over the requests")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="intra-op threads of both sides")
    parser.add_argument("--build-only", action="store_true", help="build (and cache) both nodes, time nothing")
    parser.add_argument("--tag", help="appended to the result's name (`_<tag>`): the question this A/B asks, e.g. "
                        "epilogues, so that it does not replace another A/B of the same workload")
    parser.add_argument("--b-gemm", choices=("auto", "aten", "onednn"),
                        help="model.gemm of B's build (default: the tree's), e.g. aten to leave out prepacked oneDNN weights")
    args = parser.parse_args()
    family, shape, depth = MODELS[args.model]
    layers = args.layers or depth
    dtype = torch.float32 if args.workload == "beam" else DTYPES[args.dtype]  # the beam bench is float32
    args.dtype = "fp32" if args.workload == "beam" else args.dtype
    commit, tree = tree_of(args.ref)
    checkpoint = shaped_checkpoint(family, shape, layers, dtype)
    requests = make_requests(args.workload, args.requests, shape["vocab_size"])
    folder = CACHE / "node_ab" / f"{args.workload}-{args.model}-{layers}l-{args.dtype}-t{args.threads}"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(requests, folder / "requests.pt")
    sides = {"A": Side("A", tree, args, checkpoint, folder / "requests.pt", folder / f"A-{commit[:12]}"),
             "B": Side("B", ROOT, args, checkpoint, folder / "requests.pt",
                       folder / ("B-tree" + (f"-gemm-{args.b_gemm}" if args.b_gemm else "")), args.b_gemm)}
    if args.build_only:
        for side in sides.values():
            side.close()
        return
    times, cpu, faults = {"A": [], "B": []}, {"A": [], "B": []}, {"A": [], "B": []}
    outputs, pair_ratios, calls = {"A": {}, "B": {}}, [], 0
    with timed_part():  # the result's load figures cover this part
        for _ in range(args.rounds):
            for i in range(len(requests)):
                order = ("A", "B") if calls % 2 == 0 else ("B", "A")
                got = {name: sides[name].run(i) for name in order}
                calls += 1
                for name, answer in got.items():
                    times[name].append(answer["seconds"])
                    cpu[name].append(answer["cpu_seconds"])
                    faults[name].append(answer["minor_faults"])
                    outputs[name].setdefault(i, answer["outputs"])
                pair_ratios.append(got["A"]["seconds"] / got["B"]["seconds"])
    for side in sides.values():
        side.close()
    checks = reference_checks(args, checkpoint, requests, outputs)
    median = {name: statistics.median(t) for name, t in times.items()}
    median_cpu = {name: statistics.median(t) for name, t in cpu.items()}
    result = {
        "bench": "node_ab", "workload": args.workload, "model": args.model, "layers": layers, "dtype": args.dtype,
        "ref": args.ref, "ref_commit": commit, "b_gemm": args.b_gemm or "default", "a_code": sides["A"].ready["code"], "b_code": sides["B"].ready["code"],
        "requests": len(requests), "calls_per_side": calls, "a_median_s": round(median["A"], 4),
        "b_median_s": round(median["B"], 4), "speedup": round(median["A"] / median["B"], 3),
        "median_pair_ratio": round(statistics.median(pair_ratios), 3),
        "pair_ratios": [round(r, 3) for r in pair_ratios], "threads": args.threads,
        "a_median_cpu_s": round(median_cpu["A"], 4), "b_median_cpu_s": round(median_cpu["B"], 4),
        "speedup_cpu_time": round(median_cpu["A"] / median_cpu["B"], 3),
        "a_median_minor_faults": statistics.median(faults["A"]), "b_median_minor_faults": statistics.median(faults["B"]),
        "parity": checks, "quick": layers != depth,
    }
    name = f"node_ab_{args.workload}_{args.model}_{args.dtype}" + ("" if layers == depth else f"_{layers}l")
    name += f"_b_{args.b_gemm}" if args.b_gemm else ""
    name += f"_{args.tag}" if args.tag else ""
    emit(name + ("" if args.threads == 2 else f"_t{args.threads}"), result, threads=args.threads)


if __name__ == "__main__":
    main()
