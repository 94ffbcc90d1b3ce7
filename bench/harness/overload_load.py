"""The offered load of the overload benchmark: what is sent, when, and with which deadline.

Two workloads, both open loop through loadgen's trace format (loadgen/trace.py) and bodies of
token ids of exactly the recorded lengths (loadgen/bodies.py):
  uniform  Poisson arrivals of one request shape (8 samples of ~60 tokens, Gamma CV 0.25, at most
           128), every request due `slo_ms` after it is sent; each window a fresh seeded draw.
  trace    the Azure code trace (bench/data/, loadgen's importer: 8 samples of <= 128 tokens per
           request, sizes as recorded); each window replays its own slice of `requests_per_window`
           consecutive requests, arrivals as recorded, compressed so that the slice's mean rate is
           the offered one; every request gets a deadline class drawn at random (seeded), a third
           each by default (50, 100 and 300 ms), the same in every window, policy and load.
Capacity is found with Poisson arrivals of the workload's own request mix (loadgen.synth's
arrival times; for the trace, its requests in order with their classes), so that "load" means the
offered rate over what the deployment sustains on these requests, and the trace's burstiness is
part of what each window tests.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loadgen.importers import ImportOptions, import_trace
from loadgen.synth import SynthSpec, arrival_times_ms, synthesize
from loadgen.trace import Trace, make_trace

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "bench" / "data" / "azure_code_2023_slice.csv"
UNIFORM_SHAPE = dict(samples=8, tokens_per_sample=60, tokens_cv=0.25, max_tokens_per_sample=128)
TRACE_IMPORT = ImportOptions(route="score", samples_per_request=8, max_tokens_per_sample=128)


@dataclass(frozen=True)
class Workload:
    """One workload: its windows and its request mix, each request with its own deadline."""

    name: str
    classes_ms: tuple[float, ...]
    """The deadlines requests carry (one for uniform)."""
    slices: tuple[Trace, ...] = ()
    """trace: one slice per window, as recorded (send times from 0)."""
    clipped_rows: int = 0
    """trace: rows whose input was clipped to the bounds (loadgen's importer counts them)."""

    @property
    def budget_deadline_ms(self) -> float:
        """The deadline a single token budget is sized for: the median class."""
        return float(np.median(self.classes_ms))

    def window(self, index: int, rate_rps: float, seconds: float, seed: int) -> Trace:
        """Window `index` at `rate_rps` (uniform: `seconds` long; trace: its slice at that mean rate)."""
        if self.name == "uniform":
            spec = SynthSpec(rate_rps=rate_rps, duration_s=seconds, deadline_ms=self.classes_ms[0], seed=seed,
                             **UNIFORM_SHAPE)
            return synthesize(spec)
        part = self.slices[index % len(self.slices)]
        return part.scaled(rate_rps / part.rate_rps())

    def poisson(self, rate_rps: float, seconds: float, seed: int) -> Trace:
        """The workload's request mix with Poisson arrivals (the capacity sweep's load)."""
        if self.name == "uniform":
            return self.window(0, rate_rps, seconds, seed)
        spec = SynthSpec(rate_rps=rate_rps, duration_s=seconds, seed=seed)
        times, _ = arrival_times_ms(spec, np.random.default_rng(seed))
        mix = [r for part in self.slices for r in part.records]
        start = random.Random(seed).randrange(len(mix))
        return make_trace(dataclasses.replace(mix[(start + i) % len(mix)], t_ms=t) for i, t in enumerate(times))

    def mean_tokens(self) -> float:
        """Mean tokens a request queues (what a token budget is sized with)."""
        if self.name == "uniform":
            return UNIFORM_SHAPE["samples"] * UNIFORM_SHAPE["tokens_per_sample"]
        records = [r for part in self.slices for r in part.records]
        return sum(sum(r.sample_tokens) for r in records) / len(records)


def uniform(slo_ms: float) -> Workload:
    return Workload("uniform", (slo_ms,))


def trace(path: Path, windows: int, requests_per_window: int, classes_ms: tuple[float, ...], seed: int = 0) -> Workload:
    """The trace cut into `windows` slices of consecutive requests, each with a deadline class."""
    imported = import_trace(path, "azure", TRACE_IMPORT)
    if len(imported.records) < windows * requests_per_window:
        raise ValueError(f"{path} has {len(imported.records)} requests; {windows} windows of "
                         f"{requests_per_window} need {windows * requests_per_window} (use --requests-per-window)")
    rng = random.Random(seed)
    records = [dataclasses.replace(r, deadline_ms=rng.choice(classes_ms)) for r in imported.records]
    slices = []
    for k in range(windows):
        part = records[k * requests_per_window:(k + 1) * requests_per_window]
        slices.append(make_trace(dataclasses.replace(r, t_ms=r.t_ms - part[0].t_ms) for r in part))
    return Workload("trace", tuple(classes_ms), tuple(slices), int(imported.meta["clipped_rows"]))


def window_seed(index: int, load: float) -> int:
    """The seed of measured window `index` at `load` (the live run and its replay draw the same windows)."""
    return 1000 * index + int(10 * load)
