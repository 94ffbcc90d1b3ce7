"""The gateway's CPU time to decode one request body (JSON bytes -> the route's spec: msgspec's parse, the
deployment's limits, the rules across fields, the repeated-field check), this tree against git refs.

Each route's typical bodies (below) are decoded by a process per side (bench/request_decode_side.py): a
ref's gateway/, shared/ and configs/ exported with git archive, and this working tree. The sides take turns
in interleaved rounds (the order rotated each round); each round every side times every body for
--cpu-ms of its thread's CPU time. Parity first: every side must make the same spec (or the same
refusal) of every body, else nothing is written. Reported per body: each side's median microseconds per
decode over the rounds, and per ref this tree's change against it (ours / ref - 1) per round, its spread
and verdict (bench/harness/rounds.change: "within noise" unless every round agrees).

    .venv/bin/python bench/request_decode.py [--ref main] [--ref REF2 ...] [--rounds 7] [--cpu-ms 40] [--quick]
                                             [--name request_decode]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from bench.harness.provenance import ROOT, timed_part, write_result
from bench.harness.side_process import SideProcess
from bench.harness.rounds import change

SIDE = Path(__file__).resolve().parent / "request_decode_side.py"
VOCAB = 151_936
WORDS = ("wireless noise cancelling headphones over ear bluetooth long battery black travel case kids "
         "running shoes waterproof trail size ten stainless steel water bottle insulated").split()


def bodies() -> list[dict]:
    """Each route's typical bodies: search texts of ~15 words, token ids drawn from the whole vocabulary."""
    rng = random.Random(0)
    text = lambda: " ".join(rng.choice(WORDS) for _ in range(15))  # noqa: E731
    ids = lambda n: [rng.randrange(VOCAB) for _ in range(n)]  # noqa: E731
    cases = {
        "score_15_texts": ("score", {"samples": [text() for _ in range(15)], "labels": ["yes", "no"],
                                     "query": "query: red shoes\n", "deadline_ms": 200}),
        "score_15x500_ids": ("score", {"samples": [{"input_ids": ids(500)} for _ in range(15)],
                                       "label_token_ids": [9454, 2152]}),
        "score_sglang_15_texts": ("score", {"query": "query: red shoes\n", "items": [text() for _ in range(15)],
                                            "label_token_ids": [9454, 2152], "apply_softmax": True}),
        "generate_prompt": ("generate", {"prompt": text(), "beam_width": 4, "num_return_sequences": 4,
                                         "deadline_ms": 500}),
        "generate_256_ids": ("generate", {"input_ids": ids(256), "beam_width": 8, "max_new_tokens": 4}),
        "embeddings_8_texts": ("embeddings", {"input": [text() for _ in range(8)], "model": "default"}),
        "embeddings_8x200_ids": ("embeddings", {"input": [ids(200) for _ in range(8)]}),
        "rerank_cohere_20_docs": ("rerank-cohere-v1", {"query": "red shoes", "documents": [text() for _ in range(20)],
                                                       "top_n": 5, "return_documents": True}),
        "rerank_tei_20_texts": ("rerank-tei", {"query": "red shoes", "texts": [text() for _ in range(20)]}),
        "completions_echo": ("completions", {"prompt": text(), "max_tokens": 0, "echo": True, "logprobs": 1}),
    }
    return [{"name": name, "route": route, "body": json.dumps(body)} for name, (route, body) in cases.items()]


def tree_of(ref: str) -> tuple[str, Path]:
    """(commit, its gateway/, shared/ and configs/ exported once per commit into the temporary directory)."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.strip()
    folder = Path(tempfile.gettempdir()) / "boundserve-request-decode" / commit
    if not (folder / "gateway").is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile() as archive:
            subprocess.run(["git", "archive", commit, "gateway", "shared", "configs"], cwd=ROOT, stdout=archive,
                           check=True)
            archive.seek(0)
            with tarfile.open(fileobj=archive) as tar:
                tar.extractall(folder, filter="data")
    return commit, folder


class Side(SideProcess):
    """One tree's decoding process: its outputs at start, then a timing of every body per `time()`."""

    def __init__(self, name: str, tree: Path, bodies_file: Path, cpu_ms: float) -> None:
        # -P: the side imports the tree's packages only, never this bench/ folder's modules
        super().__init__(name, tree, [sys.executable, "-P", str(SIDE), str(bodies_file), str(cpu_ms)])
        self.outputs: dict[str, str] = self.ready["outputs"]

    def time(self) -> dict[str, float]:
        return self.ask("time")


def parity(sides: list[Side], names: list[str]) -> list[dict]:
    """Per body: this tree accepts it, and every side's spec has the same value in every field both trees'
    specs have (a field one tree's spec lacks, e.g. one added since a ref, is named, not compared)."""
    ours, checks = sides[-1], []
    for side in sides[:-1]:
        for name in names:
            mine, theirs = ours.outputs[name], side.outputs[name]
            common = mine.keys() & theirs.keys()
            checks.append({"check": f"{name}: {side.name} decodes it as this tree does",
                           "ok": "refused" not in mine and bool(common) and all(mine[k] == theirs[k] for k in common),
                           "fields_not_compared": sorted(mine.keys() ^ theirs.keys())})
    return checks


def rounds_of(sides: list[Side], count: int) -> dict[str, list[dict[str, float]]]:
    """Every side's timings per round, the order of the sides rotated each round."""
    timings: dict[str, list[dict[str, float]]] = {side.name: [] for side in sides}
    for index in range(count):
        shift = index % len(sides)
        for side in sides[shift:] + sides[:shift]:
            timings[side.name].append(side.time())
    return timings


def summary(timings: dict[str, list[dict[str, float]]], names: list[str], refs: list[str]) -> dict:
    per_body = {}
    for name in names:
        us = {side: [round(t[name], 2) for t in rounds] for side, rounds in timings.items()}
        row = {"median_cpu_us": {side: round(statistics.median(v), 2) for side, v in us.items()},
               "rounds_cpu_us": us}
        row["change_vs"] = {ref: change([o / r - 1 for o, r in zip(us["this tree"], us[ref])]) for ref in refs}
        per_body[name] = row
    return per_body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", action="append", help="git ref to compare with (repeatable; default main)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cpu-ms", type=float, default=40.0, help="CPU time per body per side per round")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 10 ms (a smoke run)")
    parser.add_argument("--name", default="request_decode", help="the result file's name under bench/results")
    args = parser.parse_args()
    rounds, cpu_ms = (3, 10.0) if args.quick else (args.rounds, args.cpu_ms)
    cases = bodies()
    names = [case["name"] for case in cases]
    with tempfile.TemporaryDirectory() as scratch:
        bodies_file = Path(scratch) / "bodies.json"
        bodies_file.write_text(json.dumps(cases))
        refs = {ref: tree_of(ref) for ref in args.ref or ["main"]}
        sides = [Side(ref, tree, bodies_file, cpu_ms) for ref, (_, tree) in refs.items()]
        sides.append(Side("this tree", ROOT, bodies_file, cpu_ms))
        try:
            checks = parity(sides, names)
            with timed_part():
                timings = rounds_of(sides, rounds) if all(c["ok"] for c in checks) else {}
        finally:
            for side in sides:
                side.close()
    result = {"bench": "request_decode", "unit": "CPU microseconds per body decode (one thread)",
              "refs": {ref: commit for ref, (commit, _) in refs.items()}, "vocab_size": VOCAB,
              "config": "configs/compose.toml", "rounds": rounds, "cpu_ms_per_body_per_round": cpu_ms,
              "body_bytes": {case["name"]: len(case["body"]) for case in cases}, "parity": checks,
              "bodies": summary(timings, names, list(refs)) if timings else None}
    write_result(args.name, result, quick=args.quick, threads=1)


if __name__ == "__main__":
    main()
