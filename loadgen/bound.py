"""The clairvoyant bound: an upper bound on the goodput any scheduler could reach on a trace.

Definition. For a trace, latency model and bounds (loadgen/bound_problem.py: each request i has a
window [r_i, d_i], a least cost c_i(lam) = the sum of its jobs' cheapest cost under perfect
batching, and a least batch time a_i), with k workers whose speed at time t is s(t) (1, or the
machine's realised pace by time: bound_problem.Problem.pace; W(a, b) = the integral of s over
[a, b], so b - a at constant speed), the bound is the optimum of the fluid (preemptive) relaxation

    maximise  sum_i x_i   over 0 <= x_i <= 1, x_i = 0 where no batch of time a_i fits [r_i, d_i],
    such that sum_{i: a <= r_i, d_i <= b} c_i x_i <= k W(a, b)   for every release a and deadline b,

floored, and minimised over the delta shares lam in SHARES (each is a bound); a long trace is
bounded in blocks of BLOCK_REQUESTS requests by arrival, each floored, summed. On a problem small
enough for loadgen/bound_exact.py (one worker, one job a request, at most EXACT_MAX_JOBS jobs) the
bound is the smaller of that and the exact optimum, itself the tightest bound there is. Per class, the
bound's own schedule serves sum x_i over the class's requests (one optimum's split, not a bound
per class); `class_bounds` bounds each class alone (what any schedule serves of it).

Why it is an upper bound. Take any schedule of non-preemptive batches within the bounds (what the
gateway or the simulator produces, whatever it knew), and a request i it serves in time: each of
its jobs is in a batch that starts at or after r_i and ends by d_i, so a_i <= d_i - r_i. A batch
S takes T(S) >= sum_{j in S} c_j (bound_problem.py: delta shared by the bounds, beta's mean by the
largest batch, T's other terms additive). Cut each batch's run into consecutive pieces of c_j, one
per member, and give each served request its pieces: every served request gets c_i of work inside
[r_i, d_i], and at any instant at most k pieces run (one per worker), each at the speed s(t) of
that instant. That is a preemptive schedule of the served set on a machine of speed k s(t), so by
Horn's condition (1974: a preemptive single machine meets every window iff every interval [a, b]
holds the work of the windows inside it; with a speed that varies in time, the work it can do in
[a, b] is k W(a, b): the same transport argument with each stretch's capacity its integral)
x_i = 1 for the served requests, 0 else, is feasible above: served <= the optimum, an integer.
The pace is the realised one of the same world the policies ran in (the same seed, by time, so
every schedule meets the same speeds): a bound that knows the service times is still a bound.

How it is computed. The vectors y_i = c_i x_i the constraints allow are the supplies a
transport network can carry (requests to the stretches between consecutive releases and
deadlines, a stretch [u, v] carrying k W(u, v)), capped by c_i: a polymatroid. Maximising
sum y_i / c_i, positive weights, over a polymatroid is solved by Edmonds' greedy (1970): cheapest
request first (ties: earliest deadline), each taking all the room the interval constraints leave
it. The room is kept as a dense matrix over (release, deadline) pairs: O(n^2) memory, O(n^3)
time at worst (0.1 s a share for a 900-request window of bench/overload_bound.py here).

What it leaves out, so how far it can sit above the true optimum: preemption (a request's work
split across batches and the waits in between), that a request runs at most at one worker's speed
(with k > 1), fractional requests, and batches less full than the bounds. loadgen/bound_exact.py
computes the true optimum on small instances to measure that gap.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from loadgen.bound_exact import EXACT_MAX_JOBS, exact_optimum
from loadgen.bound_problem import Problem, problem_of
from loadgen.service import ServiceModel
from loadgen.simulator import SimSettings
from loadgen.trace import Trace

SHARES = (0.0, 0.5, 1.0)
"""The delta shares tried (lam: its weight on the items bound, the rest on tokens or requests)."""
BLOCK_REQUESTS = 2000
"""Requests bounded together: the room matrix of a block is BLOCK_REQUESTS^2 floats (32 MB). Blocks
are bounded apart and summed, a bound still (each block's served requests get their pieces of
any schedule, the other blocks' dropped), looser only by what a block's last windows would have
shared with the next block's first."""
EPS_MS = 1e-9
"""Slack on comparisons of times, so that rounding never refuses work that fits exactly."""


@dataclass(frozen=True)
class BoundResult:
    """The bound on one problem: its optimum, floored, and the schedule it comes from."""

    served: int
    """The bound: at most this many requests can be answered in time."""
    fluid_served: float
    """The relaxation's optimum before flooring (summed over blocks)."""
    offered: int
    shares: tuple[float, ...]
    """Per block, the delta share lam that gave its least bound."""
    x: tuple[float, ...] = field(repr=False)
    """Per request (the problem's order): the share of it the relaxation serves."""
    by_class: dict[str, float] = field(default_factory=dict)
    """Class -> requests the relaxation serves (sum of x)."""
    offered_by_class: dict[str, int] = field(default_factory=dict)
    exact: int | None = None
    """The exact optimum where the problem is small enough to search (None: not searched); `served`
    is then the smaller of it and the floored relaxation."""


def fluid_served(problem: Problem, share: float) -> np.ndarray:
    """x of the relaxation at delta share `share` (module docstring), by Edmonds' greedy."""
    requests = problem.requests
    if not requests:
        return np.zeros(0)
    cost = np.array([problem.least_ms(r, share) for r in requests])
    release = np.array([r.release_ms for r in requests])
    due = np.array([r.due_ms for r in requests])
    alone = np.array([problem.alone_ms(r) for r in requests])
    earliest_end = np.array([problem.finish_ms(r, a) for r, a in zip(release, alone)])
    possible = (earliest_end <= due + EPS_MS) & (due >= release)
    x = np.zeros(len(requests))
    if not possible.any():
        return x
    starts, ends = np.unique(release[possible]), np.unique(due[possible])
    room = problem.work_ms(starts, ends)  # [starts, ends]: ms of work an interval holds
    row = np.searchsorted(starts, release)  # intervals [starts[a], ends[b]] holding request i: a <= row, b >= col
    col = np.searchsorted(ends, due)
    for i in np.lexsort((due, cost)):  # cheapest first, then earliest deadline
        if not possible[i]:
            continue
        if cost[i] <= EPS_MS:
            x[i] = 1.0
            continue
        block = room[: row[i] + 1, col[i]:]
        work = min(cost[i], float(block.min()))
        if work > EPS_MS:
            block -= work
            x[i] = work / cost[i]
    return x


def clairvoyant_bound(problem: Problem, shares: Sequence[float] = SHARES,
                      block: int = BLOCK_REQUESTS) -> BoundResult:
    """The bound (module docstring) with its schedule's served requests per class: the requests in
    blocks of at most `block` by arrival, each block's relaxation at its least share, floored, summed."""
    order = sorted(range(len(problem.requests)), key=lambda i: problem.requests[i].release_ms)
    x, served, fluid, chosen = np.zeros(len(order)), 0, 0.0, []
    for start in range(0, len(order), block):
        part = order[start:start + block]
        sub = dataclasses.replace(problem, requests=tuple(problem.requests[i] for i in part))
        total, share, part_x = min(((float(v.sum()), s, v) for s in shares for v in [fluid_served(sub, s)]),
                                   key=lambda t: t[0])
        x[part], served, fluid = part_x, served + math.floor(total + 1e-6), fluid + total
        chosen.append(share)
    by_class: dict[str, float] = defaultdict(float)
    offered: dict[str, int] = defaultdict(int)
    for request, value in zip(problem.requests, x):
        by_class[request.klass] += float(value)
        offered[request.klass] += 1
    exact = exact_optimum(problem)[0] if searchable(problem) else None
    return BoundResult(served if exact is None else min(served, exact), fluid, len(problem.requests), tuple(chosen),
                       tuple(float(v) for v in x), dict(by_class), dict(offered), exact)


def searchable(problem: Problem) -> bool:
    """Whether loadgen/bound_exact.exact_optimum can solve `problem` (what it refuses otherwise)."""
    return (problem.workers == 1 and all(len(r.jobs) == 1 for r in problem.requests)
            and 0 < len(problem.requests) <= EXACT_MAX_JOBS)


def class_bounds(problem: Problem, shares: Sequence[float] = SHARES) -> dict[str, int]:
    """Per class, the bound on that class's requests alone: what any schedule can serve of the class
    (its served set, the others dropped, is a schedule too). Unlike the bound's own schedule's split
    (BoundResult.by_class, one optimum among many), each is an upper bound on its own."""
    classes = sorted({r.klass for r in problem.requests})
    return {c: clairvoyant_bound(dataclasses.replace(problem, requests=tuple(r for r in problem.requests
                                                                              if r.klass == c)), shares).served
            for c in classes}


def bound_by_load(trace: Trace, settings: SimSettings, service: ServiceModel, loads: Sequence[float],
                  base_rps: float | None = None) -> dict[str, dict]:
    """The bound of `trace` sent at each load (x `base_rps`, default the trace's own mean rate):
    load -> served, goodput per second of the scaled trace's span (as bench/overload_sim.py counts
    it: in-time answers over the last send time), and per class: what the bound's schedule serves
    of it (`served`) and the bound on the class alone (`bound_alone`)."""
    rate = trace.rate_rps()
    if rate <= 0:
        raise ValueError("the trace needs at least two requests at different times to be sent at a load")
    out = {}
    for load in loads:
        scaled = trace.scaled(load * (base_rps or rate) / rate)
        problem = problem_of(scaled, settings, service)
        result = clairvoyant_bound(problem)
        alone = class_bounds(problem) if len(result.by_class) > 1 else {k: result.served for k in result.by_class}
        span_s = max(r.t_ms for r in scaled.records) / 1000.0 or 1.0
        out[f"{load:g}x"] = {
            "offered_rps": round(scaled.rate_rps(), 3), "offered": result.offered, "bound_served": result.served,
            "fluid_served": round(result.fluid_served, 3), "bound_goodput_rps": round(result.served / span_s, 3),
            "delta_shares": list(result.shares),
            "by_class": {k: {"offered": result.offered_by_class[k], "served": round(v, 3),
                             "goodput_rps": round(v / span_s, 3), "bound_alone": alone[k]}
                         for k, v in sorted(result.by_class.items())},
        }
    return out
