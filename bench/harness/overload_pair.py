"""The overload benchmark's two replicas: what early refusal is worth to an upstream that can go elsewhere.

Two replicas, each one `python -m worker` of its own (its own scratch folder and ipc endpoint) and,
per policy, one `python -m gateway` on that worker alone (loadgen/stack.py). The client spreads a
window's requests round-robin over the policy's two gateways and retries a refused (429, 503), 504 or
timed-out try once on the other within what is left of its deadline, honouring Retry-After
(loadgen/replayer.py, loadgen/retry.py): what a real upstream does. The pair's goodput counts the
answers within each request's own deadline from its first scheduled send, retried or not.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from pathlib import Path
from typing import Any

from bench.harness.overload_load import Workload, window_seed
from bench.harness.overload_policies import knobs
from bench.harness.overload_window import idle
from loadgen.bodies import BodyFactory
from loadgen.replayer import ReplayOptions, replay
from loadgen.result import RequestResult
from loadgen.retry import RetryOptions
from loadgen.stack import GatewayProcess, Pinning, SharedWorkers
from loadgen.stats import window_of
from loadgen.trace import Trace


class Pair:
    """Two single-worker replicas and, per policy, a gateway on each; `window` replays with retries."""

    def __init__(self, config: Path, artifacts: Path, scratch: Path, pinning: Pinning | None,
                 bodies: BodyFactory, retry: RetryOptions) -> None:
        self.replicas = [SharedWorkers(config, artifacts, scratch / f"replica-{k}", pinning) for k in range(2)]
        self.bodies, self.retry = bodies, retry
        self.gateways: dict[str, list[GatewayProcess]] = {}
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Pair:
        for replica in self.replicas:
            self._stack.enter_context(replica)
        return self

    def __exit__(self, *exc: object) -> None:
        for pair in self.gateways.values():
            for gateway in pair:
                gateway.stop()
        self._stack.close()

    @property
    def worker_pids(self) -> list[int]:
        return [pid for replica in self.replicas for pid in replica.pids]

    async def start(self, name: str, knobs: dict[str, Any]) -> None:
        pair = [GatewayProcess(replica, f"{name}-{k}", knobs).start() for k, replica in enumerate(self.replicas)]
        self.gateways[name] = pair
        for gateway in pair:
            await gateway.ready()

    async def window(self, name: str, trace: Trace) -> dict[str, Any]:
        first, second = self.gateways[name]
        options = ReplayOptions(url=first.url, replicas=(second.url,), retry=self.retry, progress=False,
                                scrape_metrics=False)
        run = await replay(trace, self.bodies, options)
        return summarize(trace, run.results)


def summarize(trace: Trace, results: list[RequestResult]) -> dict[str, Any]:
    """The pair's in-time answers (all and by deadline class) per second of the window, and what the
    retries did: how many were sent, how many of those were in time, and why others were not sent."""
    deadlines = [r.deadline_ms for r in trace.records]
    good = [r.outcome == "ok" and r.latency_ms <= d for r, d in zip(results, deadlines)]
    window_s = window_of(results)
    by_class: Counter[str] = Counter()
    for ok, deadline in zip(good, deadlines):
        by_class[f"{deadline:g}"] += ok
    retried = [ok for ok, r in zip(good, results) if r.tries == 2]
    return {
        "offered": len(results), "window_s": round(window_s, 3), "in_time": sum(good),
        "goodput_rps": round(sum(good) / window_s, 2) if window_s else None,
        "in_time_by_class": dict(sorted(by_class.items(), key=lambda kv: float(kv[0]))),
        "outcomes": dict(sorted(Counter(r.outcome for r in results).items())),
        "first_try_outcomes": dict(sorted(Counter(r.first_outcome or r.outcome for r in results).items())),
        "retried": len(retried), "retried_in_time": sum(retried),
        "not_retried": dict(sorted(Counter(r.not_retried for r in results if r.not_retried).items())),
    }


async def pair_windows(workload: Workload, args, measured: dict, pair: Pair) -> dict[str, list[dict]]:
    """Two replicas with retries at `args.pair_load` x the pair's capacity (twice the one worker's), per
    policy, the order rotated from window to window as in the one-replica run."""
    cap, names = measured["capacity_rps"], list(args.pair_policies)
    for name in names:
        extra = {"max_queue_tokens": max(1, measured["token_budget"])} if name == "edf_bounded" else {}
        await pair.start(name, knobs(name, workload.classes_ms, args.shed_by_cost, **extra))
        await pair.window(name, workload.poisson(cap, args.sweep_s, seed=998))  # warm, at half the pair's capacity
        await pair_idle(pair, name)
    out: dict[str, list[dict]] = {name: [] for name in names}
    for index in range(args.windows):
        for name in names[index % len(names):] + names[:index % len(names)]:
            trace = workload.window(index, args.pair_load * 2.0 * cap, args.window_s, window_seed(index, 2.0))
            out[name].append(await pair.window(name, trace))
            await pair_idle(pair, name)
    return out


async def pair_idle(pair: Pair, name: str) -> None:
    for gateway in pair.gateways[name]:
        await idle(gateway.url)


def pair_cpus() -> Pinning:
    """The two replicas' CPUs: their workers on the last two and the gateways on the rest where there are
    three or more, else every process on every CPU (named: a child would inherit the client's pinning)."""
    every = frozenset(os.sched_getaffinity(0))
    return Pinning.split(workers=2) or Pinning(every, every)
