"""The prefix cache across requests through the real gateway: goodput with it against without it,
routing's hit rate against one worker's, the cost at zero reuse, and exactness.

A Qwen2.5-0.5B-shaped checkpoint (random weights, float32, 24 layers; --quick: 2, labelled quick)
compiled once; each stack is `python -m gateway --spawn-workers` (loadgen/stack.py) with its own
config, the workers' CPU threads split between them:
  on    2 workers, [score] prefix_cache_mb 256, cache-aware routing (the product)
  off   2 workers, prefix_cache_mb 0 (within-request sharing on, as on both sides)
  one   1 worker, prefix_cache_mb 256 (the hit rate routing is measured against)
Workloads (token ids, seeded; every item's first token differs, so a request's shared prefix is
its context exactly):
  session    each context (300-500 tokens, e.g. a user's history) scored over 4 requests of 15
             items of 10-30 tokens, one after another; `clients` sessions at once (closed loop)
  zipf       requests over `contexts` contexts drawn by Zipf(1.0), `clients` at once
  unique     every request a new context (0 % reuse)
Every request has a loose deadline, so goodput is the rate of answers (all in time; checked).
"on" and "off" run at once and take turns: `--rounds` rounds (on then off, then off then on, ...),
each on fresh sessions and unique contexts (a new seed), so the machine's drift lands on both sides
and every figure has a spread (bench/harness/rounds.py). Figures: speedup_vs_cache_off (per round:
session seconds off / on; its verdict, and the speedup claimed, never above the FLOP bound and none
within noise); flop_bound (executed FLOPs off / on for the session requests as served,
bench/harness/flops.py: a request whose answer counts its context as cached computed only its
items); zero_reuse_slowdown (per round: unique seconds on / off - 1, "within noise" when the rounds
disagree on its sign); routing_hit_rate_ratio (zipf hit rate, on / one, from the workers' /metrics,
after the rounds); max_abs_diff_vs_uncached (session scores, on vs off, every round). Parity: the
session scores agree within PARITY_ABS, or nothing is written (bench/harness/provenance.py).

    .venv/bin/python bench/prefix_cache.py [--quick] [--rounds N] [--sessions N] [--zipf-requests N] [--clients N] [--build-only]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import time
from pathlib import Path

import aiohttp
import numpy as np
import torch

from bench.harness import rounds as spreads
from bench.harness.common import CACHE, QWEN25_05B, bench_config, build_artifacts, emit, shaped_checkpoint
from bench.harness.flops import shared_score_flops
from bench.harness.parity import FP32_ABS, close_check
from loadgen.prometheus import parse
from loadgen.stack import LocalStack, deployment_toml

ITEMS, PAGES, LABELS = 15, 4, [9454, 2152]
DEADLINE_MS = 600_000
PARITY_ABS = FP32_ABS
"""Session label logits with the cache on against off: the same float32 model, the cached rows computed once
(summation order alone differs; measured ~5e-5 at 24 layers)."""


def make_context(rng: np.random.Generator, vocab: int, low: int = 300, high: int = 500) -> list[int]:
    return rng.integers(1000, vocab, int(rng.integers(low, high + 1))).tolist()


def make_request(rng: np.random.Generator, context: list[int], vocab: int) -> list[list[int]]:
    """15 items of 10-30 tokens after `context`, their first tokens all different."""
    firsts = rng.choice(np.arange(1000, vocab), ITEMS, replace=False)
    return [context + [int(f)] + rng.integers(1000, vocab, int(rng.integers(9, 30))).tolist() for f in firsts]


def workloads(seed: int, vocab: int, sessions: int, contexts: int, zipf_requests: int, unique: int) -> dict:
    rng = np.random.default_rng(seed)
    session = []
    for _ in range(sessions):
        context = make_context(rng, vocab)
        session.append([make_request(rng, context, vocab) for _ in range(PAGES)])
    pool = [make_context(rng, vocab) for _ in range(contexts)]
    weights = 1.0 / np.arange(1, contexts + 1)
    drawn = rng.choice(contexts, zipf_requests, p=weights / weights.sum())
    zipf = [[make_request(rng, pool[c], vocab)] for c in drawn]
    fresh = [[make_request(rng, make_context(rng, vocab), vocab)] for _ in range(unique)]
    return {"session": session, "zipf": zipf, "unique": fresh}


async def drive(url: str, sessions: list[list[list[list[int]]]], clients: int) -> tuple[float, list[list[dict]]]:
    """Closed loop: `clients` tasks each take the next session and send its requests one after
    another. Returns the wall seconds and every answer, by session and page."""
    answers: list[list[dict]] = [[] for _ in sessions]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(sessions)):
        queue.put_nowait(i)

    async def client(http: aiohttp.ClientSession) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            for samples in sessions[i]:
                body = {"samples": [{"input_ids": s} for s in samples], "label_token_ids": LABELS,
                        "output": "logits", "deadline_ms": DEADLINE_MS}
                async with http.post(url + "/v1/score", json=body) as response:
                    answer = await response.json()
                    if response.status != 200:
                        raise RuntimeError(f"a request failed ({response.status}): {answer}")
                    answers[i].append(answer)

    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return time.perf_counter() - start, answers


def cache_counts(url: str) -> dict[str, float]:
    """The workers' prefix-cache counters summed, from the gateway's /metrics."""
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=60) as response:
        samples = parse(response.read().decode())
    return {name: sum(value for metric, _, value in samples if metric == f"boundserve_prefix_cache_{name}_total")
            for name in ("hits", "misses", "insertions", "evictions", "hit_tokens")}


def open_stack(name: str, config, artifacts: Path) -> LocalStack:
    """A stack of its own folder and config, not yet started (a context manager)."""
    folder = CACHE / "prefix_cache" / name
    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / "base.toml"
    config_path.write_text(deployment_toml(config))
    return LocalStack(config_path, artifacts, folder, startup_timeout_s=1800.0)


def run_job(url: str, sessions: list, clients: int) -> dict:
    """One workload on a started stack: its seconds, answers and the cache counters it added."""
    before = cache_counts(url)
    seconds, answers = asyncio.run(drive(url, sessions, clients))
    after = cache_counts(url)
    return {"seconds": seconds, "answers": answers, "cache": {k: after[k] - before[k] for k in after}}


def turns(names: list[str], rounds: int) -> list[list[str]]:
    """The order the stacks run in, round by round: as given in even rounds, reversed in odd ones (A B, B A, ...),
    so neither side always runs first, on a machine warmed (or loaded) by the other."""
    return [names if r % 2 == 0 else names[::-1] for r in range(rounds)]


def interleaved(urls: dict[str, str], work: list[dict], clients: int) -> list[dict[str, dict]]:
    """Per round (its own work), the session then the unique workload on each stack in `turns` order:
    round -> side -> workload -> run_job's result."""
    return [{name: {w: run_job(urls[name], round_work[w], clients) for w in ("session", "unique")} for name in order}
            for order, round_work in zip(turns(list(urls), len(work)), work)]


def hit_rate(cache: dict[str, float]) -> float:
    looked = cache["hits"] + cache["misses"]
    return cache["hits"] / looked if looked else 0.0


def variant(config, workers: int, cache_mb: int, threads: int):
    endpoints = tuple(f"ipc:///tmp/prefix-cache-bench-w{i}" for i in range(workers))  # the stack puts its own
    worker = dataclasses.replace(config.worker, endpoints=endpoints, devices=("cpu",) * workers, cpu_threads=threads,
                                 profile_budget_s=60.0,
                                 profile_repeats=1, warmup_runs=1)
    gateway = dataclasses.replace(config.gateway, access_log=False, worker_timeout_ms=DEADLINE_MS,
                                  max_deadline_ms=DEADLINE_MS, score_deadline_ms=DEADLINE_MS)
    return config.replace(worker=worker, gateway=gateway,
                          score=dataclasses.replace(config.score, prefix_cache_mb=cache_mb))


def session_flops(spec, sessions: list, answers: list[list[dict]] | None = None) -> float:
    """FLOPs the session requests executed: with `answers` (as served), a request whose usage counts
    every sample's context as cached read it from the cache (its context's rows were not computed);
    without, every context computed (within-request sharing only)."""
    total = 0.0
    for k, pages in enumerate(sessions):
        for page, samples in enumerate(pages):
            prefix = _lcp(samples)
            cached = answers[k][page]["usage"]["prompt_tokens_details"]["cached_tokens"] if answers else 0
            static = prefix if cached >= len(samples) * prefix else 0
            total += shared_score_flops(spec, prefix, [len(s) - prefix for s in samples], static_len=static)
    return total


def _lcp(samples: list[list[int]]) -> int:
    n = 0
    while all(len(s) > n and s[n] == samples[0][n] for s in samples):
        n += 1
    return n


def scores(answers: list[list[dict]]) -> np.ndarray:
    return np.concatenate([np.asarray(a["scores"], dtype=np.float64).ravel() for pages in answers for a in pages])


def all_scores(side: list[dict]) -> np.ndarray:
    """Every round's session scores of one side, in round order."""
    return np.concatenate([scores(r["session"]["answers"]) for r in side])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test: 2 layers, few requests (labelled quick)")
    parser.add_argument("--layers", type=int, help="decoder layers (default 24; quick 2)")
    parser.add_argument("--sessions", type=int, help="session contexts (default 32; quick 4)")
    parser.add_argument("--contexts", type=int, help="zipf contexts (default 64; quick 8)")
    parser.add_argument("--zipf-requests", type=int, help="zipf requests (default 192; quick 16)")
    parser.add_argument("--unique", type=int, help="unique-context requests (default 96; quick 4)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (default 4)")
    parser.add_argument("--rounds", type=int, help="interleaved on/off rounds, each on fresh contexts (default 3; "
                                                   "quick 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--build-only", action="store_true", help="compile the artifacts (cached) and stop, so that "
                                                                   "a quiet window times only the stacks")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    from compile.checkpoint import read_spec

    layers = args.layers or (2 if args.quick else 24)
    quick = args.quick or layers != 24
    sessions = args.sessions or (4 if args.quick else 32)
    contexts = args.contexts or (8 if args.quick else 64)
    zipf_requests = args.zipf_requests or (16 if args.quick else 192)
    unique = args.unique or (4 if args.quick else 96)  # 32 left the 2 % goal inside one run's noise
    threads = max(1, (os.cpu_count() or 2) // 2)  # each of two workers gets half the cores
    torch.set_num_threads(threads)  # the packages are compiled for this process's threads (these_threads)
    checkpoint = shaped_checkpoint("qwen2", QWEN25_05B, layers, torch.float32)
    spec = read_spec(checkpoint)
    config = bench_config(checkpoint, "float32", workloads=("score",), max_samples_per_batch=16,
                          max_tokens_per_sample=1024, max_tokens_per_batch=8192, max_prefix_tokens=512)
    artifacts = build_artifacts(config, f"prefix_cache-qwen2.5-0.5b-fp32-{layers}l-{threads}t")
    if args.build_only:
        print(f"artifacts in {artifacts}")
        return
    rounds = args.rounds or (2 if args.quick else 3)
    work = [workloads(args.seed + r, spec.vocab_size, sessions, contexts, zipf_requests, unique) for r in range(rounds)]
    c = args.clients
    with contextlib.ExitStack() as up:
        urls = {name: up.enter_context(open_stack(name, variant(config, 2, mb, threads), artifacts)).url
                for name, mb in (("on", 256), ("off", 0))}
        by_round = interleaved(urls, work, c)
        zipf_on = run_job(urls["on"], work[0]["zipf"], c)
    with open_stack("one", variant(config, 1, 256, threads), artifacts) as one:
        zipf_one = run_job(one.url, work[0]["zipf"], c)
    result = {
        "model": "qwen2.5-0.5b", "layers": layers, "dtype": "float32", "quick": quick, "threads_per_worker": threads,
        "clients": c, "sessions": sessions, "pages": PAGES, "items": ITEMS, "zipf_contexts": contexts,
        "zipf_requests": zipf_requests, "unique_requests": unique, "rounds": rounds,
        **summary(spec, work, by_round, sessions * PAGES),
        "zipf_hit_rate": {"two_workers_routed": hit_rate(zipf_on["cache"]), "one_worker": hit_rate(zipf_one["cache"])},
        "routing_hit_rate_ratio": hit_rate(zipf_on["cache"]) / max(1e-9, hit_rate(zipf_one["cache"])),
        "cache_counters": {"on": [r["on"]["session"]["cache"] for r in by_round], "on_zipf": zipf_on["cache"],
                           "one_zipf": zipf_one["cache"]},
        "load_average_at_end": os.getloadavg(),
    }
    emit(f"prefix_cache-qwen2.5-0.5b-fp32-{layers}l{'-quick' if args.quick else ''}", result,
         threads={"per_worker": threads})


def summary(spec, work: list[dict], by_round: list[dict], session_requests: int) -> dict:
    """The rounds' figures: goodput, speedup against the FLOP bound, zero-reuse change (each with its spread),
    and the parity check (on against off, session scores of every round; a failed one is never written)."""
    on = [r["on"] for r in by_round]
    off = [r["off"] for r in by_round]
    bounds = [session_flops(spec, w["session"]) / session_flops(spec, w["session"], o["session"]["answers"])
              for w, o in zip(work, on)]
    check = close_check("session label logits, cache on vs off", torch.from_numpy(all_scores(on)),
                        torch.from_numpy(all_scores(off)), PARITY_ABS)
    return {
        "session_goodput_rps": {name: spreads.spread([session_requests / r["session"]["seconds"] for r in side])
                                for name, side in (("on", on), ("off", off))},
        "speedup_vs_cache_off": spreads.speedup([b["session"]["seconds"] / a["session"]["seconds"]
                                                 for a, b in zip(on, off)], min(bounds)),
        "flop_bound": spreads.spread(bounds),
        "session_hit_rate": spreads.spread([hit_rate(r["session"]["cache"]) for r in on]),
        "zero_reuse_slowdown": spreads.change([a["unique"]["seconds"] / b["unique"]["seconds"] - 1.0
                                               for a, b in zip(on, off)]),
        "max_abs_diff_vs_uncached": check["max_abs_diff"],
        "parity": [check],
    }


if __name__ == "__main__":
    main()
