"""One side of bench/request_decode.py: decodes request bodies with the gateway of the tree it runs in and
times them, one JSON line per call.

Run as `python <this file> BODIES` with the tree on PYTHONPATH (a git ref's copy, or the working tree), so
it imports only what every tree since the API package has: the route parsers (gateway/api/score.py's
parse_score, generate.py's parse_generate, embeddings.py's parse_embeddings, rerank.py's parser,
completions.py's parse_completions), gateway/limits.Limits.of, shared.config.load_config and
shared.manifest.Manifest. BODIES: a JSON list of {"name", "route", "body"} (body: the JSON text).
stdout: {"outputs": {name: the parsed spec's fields (repr'd), or the refusal}} once, then per line "time" read from
stdin {name: CPU microseconds per decode}; this thread's CPU time (time.thread_time_ns), so another
process taking the core adds no time, and the collector runs as it does in the gateway.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import sys
import time
from pathlib import Path

VOCAB = 151_936
"""Qwen2.5's vocabulary (the token ids' validity limit)."""
CONFIG = "configs/compose.toml"
"""A served deployment's bounds: 512 tokens per sample and prompt, 32 labels, beam width 128."""


def parsers() -> dict:
    from gateway.api.completions import parse_completions
    from gateway.api.embeddings import parse_embeddings
    from gateway.api.generate import parse_generate
    from gateway.api.rerank import parser
    from gateway.api.score import parse_score

    return {"score": parse_score, "generate": parse_generate, "embeddings": parse_embeddings,
            "rerank-cohere-v1": parser("cohere-v1"), "rerank-tei": parser("tei"), "completions": parse_completions}


def limits_of(tree: Path):
    from gateway.limits import Limits
    from shared.config import load_config
    from shared.manifest import Manifest

    config = load_config(tree / CONFIG)
    return Limits.of(config, Manifest(bounds=config.build_bounds), VOCAB)


def outcome(parse, raw: bytes, limits) -> dict[str, str]:
    """What the tree makes of a body: its spec's fields, or its refusal's status and words."""
    try:
        spec = parse(raw, limits)
    except Exception as error:  # noqa: BLE001 - an ApiError is an outcome to compare, like a spec
        return {"refused": f"{type(error).__name__} {getattr(error, 'status', '')} {error}"}
    return {field.name: repr(getattr(spec, field.name)) for field in dataclasses.fields(spec)}


def cpu_us_per_decode(parse, raw: bytes, limits, min_cpu_ns: int) -> float:
    """Decode `raw` until `min_cpu_ns` of this thread's CPU time has passed (at least 5 times)."""
    gc.collect()
    calls, start = 0, time.thread_time_ns()
    while True:
        parse(raw, limits)
        calls += 1
        spent = time.thread_time_ns() - start
        if calls >= 5 and spent >= min_cpu_ns:
            return spent / calls / 1e3


def main() -> None:
    bodies = json.loads(Path(sys.argv[1]).read_text())
    min_cpu_ns = int(float(sys.argv[2]) * 1e6)
    limits, routes = limits_of(Path.cwd()), parsers()
    cases = [(b["name"], routes[b["route"]], b["body"].encode()) for b in bodies]
    print(json.dumps({"outputs": {name: outcome(parse, raw, limits) for name, parse, raw in cases}}), flush=True)
    for line in sys.stdin:
        if line.strip() == "time":
            timed = {name: cpu_us_per_decode(parse, raw, limits, min_cpu_ns) for name, parse, raw in cases}
            print(json.dumps(timed), flush=True)


if __name__ == "__main__":
    main()
