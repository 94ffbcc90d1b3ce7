"""Warm-up and latency profile: time the real compute path over a grid, fit one model per workload.

Each grid point is a synthetic batch run through the same runner and lane as served batches, so
the profile includes packing and result splitting. Corner points come first, so a short budget
still spans the grid. B and L follow shared/latency_model.py:
  score: B = samples, L = tokens per sample;  beam: B = requests * num_beams, L = prompt tokens.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from shared.bounds import Bounds
from shared.config import WorkerConfig
from shared.latency_model import LatencyModel
from shared.protocol import BeamBatch, BeamRequest, ScoreBatch, ScoreRequest, pack_ids
from worker.workloads import Runner, Workloads

FAR_DEADLINE_MS = 3.6e6
MIN_POINTS = 4  # the model has four coefficients: fewer points leave it undetermined


@dataclass(frozen=True)
class Profile:
    """A fitted workload: the model, its error and the (B, L, ms) points it was fitted on."""

    model: LatencyModel
    rmse_ms: float
    samples: tuple[tuple[float, float, float], ...]


def _levels(maximum: int, smallest: int = 1) -> list[int]:
    return sorted({max(smallest, min(maximum, v)) for v in (smallest, maximum // 4, maximum // 2, maximum)})


def _corners_first(points: list[tuple]) -> list[tuple]:
    """Extremes of every axis and the largest batch (most tokens) first, then the rest, each once."""
    lows = [min(axis) for axis in zip(*points)]
    highs = [max(axis) for axis in zip(*points)]
    largest = max(points, key=lambda p: (int(np.prod(p)), p))
    corners = [p for p in points if p != largest and all(v in (lo, hi) for v, lo, hi in zip(p, lows, highs))]
    corners.insert(1, largest)
    return corners + [p for p in points if p not in corners]


def score_grid(bounds: Bounds) -> list[tuple[int, int]]:
    """(samples, tokens per sample) points within bounds."""
    points = []
    for b, length in itertools.product(_levels(bounds.max_samples_per_batch), _levels(bounds.max_tokens_per_sample, 4)):
        length = min(length, bounds.max_tokens_per_batch // b)
        if length >= 1 and (b, length) not in points:
            points.append((b, length))
    return _corners_first(points)


def beam_grid(bounds: Bounds) -> list[tuple[int, int, int]]:
    """(requests, num_beams, prompt tokens) points within bounds."""
    requests = sorted({1, bounds.max_beam_requests_per_batch})
    beams = sorted({min(2, bounds.max_beam_width), bounds.max_beam_width})
    lengths = sorted({min(8, bounds.max_prompt_tokens), bounds.max_prompt_tokens})
    return _corners_first(list(itertools.product(requests, beams, lengths)))


def score_batch(samples: int, length: int, bounds: Bounds, vocab_size: int, rng) -> ScoreBatch:
    ids = rng.integers(0, vocab_size, size=samples * length)
    labels = tuple(range(min(2, bounds.max_labels, vocab_size)))
    request = ScoreRequest("profile", FAR_DEADLINE_MS, pack_ids(ids, "int32"), (length,) * samples, labels,
                           min(5, bounds.max_top_k))
    return ScoreBatch(batch_id=0, token_dtype="int32", requests=(request,))


def beam_batch(requests: int, beams: int, length: int, bounds: Bounds, vocab_size: int, rng) -> BeamBatch:
    reqs = tuple(BeamRequest(f"profile-{i}", FAR_DEADLINE_MS, pack_ids(rng.integers(0, vocab_size, size=length)))
                 for i in range(requests))
    return BeamBatch(batch_id=0, token_dtype="int32", num_beams=beams, max_new_tokens=bounds.max_new_tokens,
                     num_return_sequences=1, requests=reqs)


def profile_workload(run: Callable, batches: list[tuple[float, float, object]], config: WorkerConfig,
                     deadline: float) -> Profile:
    """Warm up, then time each (B, L, batch) until `deadline` (monotonic s), but never fewer than
    MIN_POINTS points (or the whole grid when it is smaller): a fit to one point would predict
    nonsense, and the gateway would refuse or admit on it.

    Warm-up: warmup_runs calls of the first (smallest) batch and one of the largest (the second),
    so first-call costs and the largest allocations never land in a timed call.
    """
    for _ in range(config.warmup_runs):
        run(batches[0][2])
    if config.warmup_runs and len(batches) > 1:
        run(batches[1][2])
    samples = []
    for b, length, batch in batches:
        times = []
        for _ in range(config.profile_repeats):
            started = time.perf_counter()
            run(batch)
            times.append((time.perf_counter() - started) * 1000.0)
        samples.append((b, length, statistics.median(times)))
        if time.monotonic() > deadline and len(samples) >= MIN_POINTS:
            break
    model = LatencyModel.fit(samples)
    return Profile(model=model, rmse_ms=model.rmse_ms(samples), samples=tuple(samples))


Plan = tuple[Runner, list[tuple[float, float, ScoreBatch | BeamBatch]]]
"""A workload's runner and its grid: (B, L, batch) in the order they are timed."""


def plan_batches(workloads: Workloads, bounds: Bounds, vocab_size: int, seed: int = 0) -> dict[str, Plan]:
    """The synthetic batches of every workload this worker serves, corners first."""
    rng = np.random.default_rng(seed)
    plans = {}
    if (score := workloads.get("score")) is not None:
        plans["score"] = (score.runner, [(b, l, score_batch(b, l, bounds, vocab_size, rng))
                                         for b, l in score_grid(bounds)])
    if (beam := workloads.get("beam")) is not None:
        plans["beam"] = (beam.runner, [(r * w, l, beam_batch(r, w, l, bounds, vocab_size, rng))
                                       for r, w, l in beam_grid(bounds)])
    return plans


def runs_on(runner, lane) -> Callable[[object], object]:
    """run(batch): the whole synthetic batch through `runner` on `lane`, as a served batch runs."""
    return lambda batch: runner.run(batch, list(range(len(batch.requests))), lane)


def warm_up_smallest(plans: Mapping[str, Plan], lane, runs: int) -> None:
    """First-call costs only (the smallest batch of each workload): what a restart must pay before
    serving. The largest batch's first call is left to the background refit."""
    for runner, batches in plans.values():
        run = runs_on(runner, lane)
        for _ in range(runs):
            run(batches[0][2])


def profile_all(workloads: Workloads, lane, bounds: Bounds, vocab_size: int, config: WorkerConfig,
                seed: int = 0) -> dict[str, Profile]:
    """Profiles of every workload this worker serves, sharing config.profile_budget_s."""
    return profile_plans(plan_batches(workloads, bounds, vocab_size, seed), lane, config)


def profile_plans(plans: Mapping[str, Plan], lane, config: WorkerConfig) -> dict[str, Profile]:
    """Warm up and time each workload's grid, the workloads sharing config.profile_budget_s."""
    profiles, start = {}, time.monotonic()
    for i, (workload, (runner, batches)) in enumerate(plans.items()):
        deadline = start + config.profile_budget_s / len(plans) * (i + 1)
        profiles[workload] = profile_workload(runs_on(runner, lane), batches, config, deadline)
    return profiles
