"""Schedules on one worker: the true clairvoyant optimum of a small problem, a greedy EDF, and a check.

A schedule is a list of batches (`Batch`: when it starts, which jobs it holds), run one after
another on one worker; a batch holds jobs of one workload within the bounds (BatchLimits.fits),
starts once every member has arrived and takes the latency model's time of all its members
(BatchLimits.batch_ms: the simulator's service time; with Problem.pace, at the machine's speed of
the moments it runs). A request is served when every one of its
jobs is in a batch that ends by its deadline. `served_by` checks a schedule and counts.

`exact_optimum` finds the most requests any such schedule serves, by dynamic programming over the
sets of jobs already run: for each set, the Pareto front of (when the worker is free, requests
served); each step runs one more batch, any subset of the jobs left that fits, started as soon as
the worker is free and its members have arrived (starting later never helps: it only delays the
finish). Members that end late are allowed (a short one can lower the batch's mean tokens, and
so its time). With the machine's speed by time (Problem.pace), a batch ends at
Problem.finish_ms(start, its time): still never earlier for starting later, so the same search
holds. 3^n steps: up to EXACT_MAX_JOBS jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loadgen.bound_problem import JobWork, Problem

EXACT_MAX_JOBS = 12
EPS_MS = 1e-9


@dataclass(frozen=True)
class Batch:
    """A batch of a schedule: its start (ms, the problem's clock) and its jobs, each as (request
    position in the problem, job position in the request)."""

    start_ms: float
    members: tuple[tuple[int, int], ...]


def _jobs(problem: Problem, batch: Batch) -> list[JobWork]:
    return [problem.requests[r].jobs[j] for r, j in batch.members]


def served_by(problem: Problem, batches: Sequence[Batch]) -> set[int]:
    """The requests (positions) a one-worker schedule serves in time; ValueError naming the first
    rule it breaks (a job run twice, a batch over the bounds or of two workloads, a batch started
    before a member arrived or before the one before it ended)."""
    if problem.workers != 1:
        raise ValueError(f"served_by checks one worker's schedule; the problem has {problem.workers} workers")
    free_ms, done, on_time = float("-inf"), set(), set()
    for number, batch in enumerate(sorted(batches, key=lambda b: b.start_ms)):
        jobs = _jobs(problem, batch)
        workloads = {j.workload for j in jobs}
        if not jobs or len(workloads) != 1:
            raise ValueError(f"batch {number} must hold jobs of exactly one workload, holds {sorted(workloads)}")
        limits = problem.limits[workloads.pop()]
        if not limits.fits(jobs):
            raise ValueError(f"batch {number} ({batch.members}) does not fit the bounds")
        if batch.start_ms < free_ms - EPS_MS:
            raise ValueError(f"batch {number} starts at {batch.start_ms} ms, before the one before ends ({free_ms})")
        late_arrival = [r for r, _ in batch.members if problem.requests[r].release_ms > batch.start_ms + EPS_MS]
        if late_arrival:
            raise ValueError(f"batch {number} starts at {batch.start_ms} ms, before request {late_arrival[0]} arrives")
        again = done.intersection(batch.members)
        if again or len(set(batch.members)) != len(batch.members):
            raise ValueError(f"batch {number} runs job {sorted(again)[0] if again else batch.members} a second time")
        done.update(batch.members)
        free_ms = problem.finish_ms(batch.start_ms, limits.batch_ms(jobs))
        on_time.update(m for m in batch.members if free_ms <= problem.requests[m[0]].due_ms + EPS_MS)
    return {r for r, request in enumerate(problem.requests)
            if all((r, j) in on_time for j in range(len(request.jobs)))}


def exact_optimum(problem: Problem) -> tuple[int, list[Batch]]:
    """The most requests any one-worker schedule serves, and one schedule that does (module docstring)."""
    members = [(r, j) for r, request in enumerate(problem.requests) for j in range(len(request.jobs))]
    if problem.workers != 1:
        raise ValueError(f"exact_optimum solves one worker; the problem has {problem.workers}")
    if len(members) > EXACT_MAX_JOBS:
        raise ValueError(f"exact_optimum takes at most {EXACT_MAX_JOBS} jobs (3^n steps); the problem has "
                         f"{len(members)}")
    if any(len(request.jobs) != 1 for request in problem.requests):
        raise ValueError("exact_optimum counts requests of one job each; cut the problem so that no request "
                         "is split into several batches' worth")
    n = len(members)
    due = [problem.requests[r].due_ms for r, _ in members]
    batch_ms, ready_ms = _batches(problem, members)
    fronts: dict[int, list[tuple[float, int, tuple[Batch, ...]]]] = {0: [(float("-inf"), 0, ())]}
    best: tuple[int, tuple[Batch, ...]] = (0, ())
    for mask in range(1 << n):
        front = _pareto(fronts.pop(mask, []))
        left = ((1 << n) - 1) ^ mask
        for free_ms, served, plan in front:
            if served > best[0]:
                best = (served, plan)
            sub = left
            while sub:
                if sub in batch_ms:
                    start = max(free_ms, ready_ms[sub])
                    end = problem.finish_ms(start, batch_ms[sub])
                    gained = sum(1 for i in range(n) if sub >> i & 1 and end <= due[i] + EPS_MS)
                    batch = Batch(start, tuple(members[i] for i in range(n) if sub >> i & 1))
                    fronts.setdefault(mask | sub, []).append((end, served + gained, plan + (batch,)))
                sub = (sub - 1) & left
    return best[0], list(best[1])


def _batches(problem: Problem, members: list[tuple[int, int]]) -> tuple[dict[int, float], dict[int, float]]:
    """For every set of jobs (bit mask) that fits one batch: its time, and when its last member arrives."""
    batch_ms, ready_ms = {}, {}
    for sub in range(1, 1 << len(members)):
        chosen = [members[i] for i in range(len(members)) if sub >> i & 1]
        jobs = [problem.requests[r].jobs[j] for r, j in chosen]
        if len({j.workload for j in jobs}) != 1:
            continue
        limits = problem.limits[jobs[0].workload]
        if limits.fits(jobs):
            batch_ms[sub] = limits.batch_ms(jobs)
            ready_ms[sub] = max(problem.requests[r].release_ms for r, _ in chosen)
    return batch_ms, ready_ms


def _pareto(states: list[tuple[float, int, tuple[Batch, ...]]]) -> list[tuple[float, int, tuple[Batch, ...]]]:
    """The states no other beats: free no later and serving no fewer."""
    kept = []
    for state in sorted(states, key=lambda s: (s[0], -s[1])):
        if not kept or state[1] > kept[-1][1]:
            kept.append(state)
    return kept


def edf_schedule(problem: Problem) -> list[Batch]:
    """A greedy clairvoyant-free schedule on one worker: whenever it is free, the arrived jobs that
    can still finish alone, in deadline order, packed into one batch while every member stays in
    time (a reference any optimum must match or beat)."""
    members = sorted(((r, j) for r, request in enumerate(problem.requests) for j in range(len(request.jobs))),
                     key=lambda m: problem.requests[m[0]].release_ms)
    now, waiting, batches, arrived = float("-inf"), [], [], 0
    while arrived < len(members) or waiting:
        if not waiting:
            now = max(now, problem.requests[members[arrived][0]].release_ms)
        while arrived < len(members) and problem.requests[members[arrived][0]].release_ms <= now:
            waiting.append(members[arrived])
            arrived += 1
        waiting = [m for m in waiting
                   if problem.finish_ms(now, _alone_ms(problem, m)) <= problem.requests[m[0]].due_ms + EPS_MS]
        waiting.sort(key=lambda m: problem.requests[m[0]].due_ms)
        taken: list[tuple[int, int]] = []
        for member in waiting:
            trial = taken + [member]
            jobs = [problem.requests[r].jobs[j] for r, j in trial]
            if len({j.workload for j in jobs}) != 1:
                continue
            limits = problem.limits[jobs[0].workload]
            due = min(problem.requests[r].due_ms for r, _ in trial)
            if limits.fits(jobs) and problem.finish_ms(now, limits.batch_ms(jobs)) <= due + EPS_MS:
                taken = trial
        if taken:
            batches.append(Batch(now, tuple(taken)))
            now = problem.finish_ms(now, problem.limits[problem.requests[taken[0][0]].jobs[taken[0][1]].workload]
                                    .batch_ms([problem.requests[r].jobs[j] for r, j in taken]))
            waiting = [m for m in waiting if m not in taken]
    return batches


def _alone_ms(problem: Problem, member: tuple[int, int]) -> float:
    job = problem.requests[member[0]].jobs[member[1]]
    return problem.limits[job.workload].batch_ms([job])
