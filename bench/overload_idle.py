"""Why the worker idles in a replayed window: the trace's gaps, the scheduler, or work in transit.

Each instant of a window's span (0 to the last arrival, ms on the problem's clock) at which the one
worker computes nothing falls in exactly one of:
  gap        no request is alive (arrived at the gateway, deadline not passed): nothing any
             scheduler, clairvoyant or not, could run then;
  scheduler  some request could still be served and has not been sent: it has arrived, no batch
             holds it yet, and a batch of it alone started now would still end in time (at the
             machine's pace); the scheduler's share, split into `queued` (an admitted request
             waits: a batch wait, a hold) and `refused` (only requests refused or dropped before
             being sent could be served: what an earlier or a later batch could have absorbed);
  nothing_servable  requests are alive but none that is unsent could still be served: each is
             answered, in flight (a batch on its way to the worker, batch_overhead_ms / 2), or
             `too_late` (unsent, and a batch of it alone would now end past its deadline: time
             lost earlier, while the worker computed others, or a window no batch ever fitted).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from loadgen.bound_problem import Problem
from shared.policy.scheduler import DecisionLog

Span = tuple[float, float]


@dataclass(frozen=True)
class IdleSplit:
    """Shares of a window's span (each in [0, 1]; gap + scheduler + nothing_servable = idle)."""

    idle: float
    gap: float
    scheduler: float
    queued: float
    """Of `scheduler`: while an admitted request waited in the queue."""
    refused: float
    """Of `scheduler`: while only refused or dropped-before-sent requests could be served."""
    nothing_servable: float
    too_late: float
    """Of `nothing_servable`: while an unsent request was alive but too late to serve."""


def idle_split(problem: Problem, computing_ms: Sequence[Span], log: DecisionLog, span_ms: float) -> IdleSplit:
    """The split (module docstring) of [0, span_ms] given the worker's compute intervals (ms) and the
    scheduler's decision log (requests named by their position in the trace, as the simulator names them)."""
    if problem.workers != 1:
        raise ValueError(f"idle_split splits one worker's time; the problem has {problem.workers} workers")
    if span_ms <= 0:
        raise ValueError(f"idle_split needs a span > 0 ms, got {span_ms}")
    sent, refused = _sent_and_refused(log)
    idle = _minus([(0.0, span_ms)], _union(computing_ms))
    alive = _union((r.release_ms, r.due_ms) for r in problem.requests)
    waiting, refused_waiting, late = [], [], []
    for request in problem.requests:
        latest = max(latest_start_ms(problem, request), request.release_ms)
        unsent_until = min(request.due_ms, sent.get(str(request.index), math.inf))
        (refused_waiting if str(request.index) in refused else waiting).append((request.release_ms,
                                                                                  min(latest, unsent_until)))
        late.append((latest, unsent_until))
    servable = _union(waiting + refused_waiting)
    idle_servable = _intersect(idle, servable)
    queued = _intersect(idle, _union(waiting))
    unservable = _minus(_intersect(idle, alive), servable)
    return IdleSplit(_measure(idle, span_ms), _measure(_minus(idle, alive), span_ms),
                     _measure(idle_servable, span_ms), _measure(queued, span_ms),
                     _measure(idle_servable, span_ms) - _measure(queued, span_ms), _measure(unservable, span_ms),
                     _measure(_intersect(unservable, _union(late)), span_ms))


def _measure(spans: list[Span], span_ms: float) -> float:
    return sum(b - a for a, b in spans) / span_ms


def latest_start_ms(problem: Problem, request) -> float:
    """The latest a batch of the request alone can start and still end by its due time (-inf: never)."""
    alone = problem.alone_ms(request)
    if problem.finish_ms(request.release_ms, alone) > request.due_ms:
        return -math.inf
    low, high = request.release_ms, request.due_ms
    for _ in range(50):  # finish_ms grows with the start: bisect to well under a microsecond
        middle = (low + high) / 2.0
        low, high = (middle, high) if problem.finish_ms(middle, alone) <= request.due_ms else (low, middle)
    return low


def _sent_and_refused(log: DecisionLog) -> tuple[dict[str, float], set[str]]:
    """When each request's first batch was sent (ms), and the requests refused or dropped unsent."""
    sent: dict[str, float] = {}
    refused: set[str] = set()
    for kind, t_us, *what in log.entries:
        if kind == "batch":
            for request in what[1]:
                sent.setdefault(str(request), t_us / 1000.0)
        elif kind in ("refuse", "drop") and str(what[0]) not in sent:
            refused.add(str(what[0]))
    return sent, refused


def _union(spans: Iterable[Span]) -> list[Span]:
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _intersect(xs: list[Span], ys: list[Span]) -> list[Span]:
    """Of two sorted disjoint lists."""
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def _minus(xs: list[Span], ys: list[Span]) -> list[Span]:
    """xs less ys, both sorted and disjoint."""
    out = []
    for a, b in xs:
        at = a
        for c, d in ys:
            if d <= at or c >= b:
                continue
            if c > at:
                out.append((at, c))
            at = max(at, d)
        if at < b:
            out.append((at, b))
    return out
