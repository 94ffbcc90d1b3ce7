"""Synthetic traces: Poisson, Gamma (chosen coefficient of variation) and batched-burst arrivals.

Bursts model seed 000 §1.3: an upstream splits one query into `burst_size` requests sent together
(within `burst_spread_ms`), so queries arrive as a Poisson stream at rate/burst_size and the request
stream's inter-arrival coefficient of variation is far above 1. Lengths are Gamma-distributed
around their means with their own coefficient of variation (0 = fixed), clipped to [1, max].
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from loadgen.trace import Trace, TraceRecord, make_trace

ARRIVALS = ("poisson", "gamma", "bursts", "uniform")


@dataclass(frozen=True)
class SynthSpec:
    """Parameters of a synthetic trace; stored in the trace's meta."""

    arrivals: str = "poisson"
    rate_rps: float = 50.0
    """Mean requests per second (all routes)."""
    duration_s: float = 10.0
    cv: float = 1.0
    """Gamma arrivals: coefficient of variation of inter-arrival times (1 = Poisson)."""
    burst_size: int = 8
    burst_spread_ms: float = 1.0
    score_fraction: float = 1.0
    """Share of requests on the score route; the rest are generate."""
    samples: int = 15
    samples_cv: float = 0.0
    tokens_per_sample: int = 100
    tokens_cv: float = 0.0
    max_tokens_per_sample: int = 512
    max_samples: int = 64
    prompt_tokens: int = 64
    prompt_cv: float = 0.0
    max_prompt_tokens: int = 512
    beam_width: int = 16
    max_new_tokens: int = 4
    deadline_ms: float | None = None
    seed: int = 0

    def validate(self) -> None:
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"arrivals must be one of {ARRIVALS}, got {self.arrivals!r}")
        if self.rate_rps <= 0 or self.duration_s <= 0:
            raise ValueError("rate_rps and duration_s must be > 0")
        if self.cv <= 0 and self.arrivals == "gamma":
            raise ValueError("gamma arrivals need cv > 0")
        if self.burst_size < 1 or not 0.0 <= self.score_fraction <= 1.0:
            raise ValueError("burst_size must be >= 1 and score_fraction in [0, 1]")
        for mean, high in (("samples", "max_samples"), ("tokens_per_sample", "max_tokens_per_sample"),
                           ("prompt_tokens", "max_prompt_tokens")):
            if not 1 <= getattr(self, mean) <= getattr(self, high):
                raise ValueError(f"{mean} = {getattr(self, mean)} must be between 1 and {high} "
                                 f"({getattr(self, high)}; --{high.replace('_', '-')}): every length is drawn in "
                                 "that range")
        for name in ("beam_width", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("samples_cv", "tokens_cv", "prompt_cv", "burst_spread_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.deadline_ms is not None and self.deadline_ms < 1:
            raise ValueError(f"deadline_ms must be at least 1 (ms, the gateway's shortest deadline), got "
                             f"{self.deadline_ms}")


def synthesize(spec: SynthSpec) -> Trace:
    """A trace following `spec`, identical for the same spec (seeded)."""
    spec.validate()
    rng = np.random.default_rng(spec.seed)
    times, groups = arrival_times_ms(spec, rng)
    records = [_record(spec, rng, t, g) for t, g in zip(times, groups)]
    return make_trace(records, {"synth": asdict(spec)})


def arrival_times_ms(spec: SynthSpec, rng: np.random.Generator) -> tuple[list[float], list[int | None]]:
    """Send times in [0, duration) and the burst id of each (None outside bursts)."""
    horizon_ms = spec.duration_s * 1000.0
    if spec.arrivals == "bursts":
        starts = _renewal_ms(rng, spec.rate_rps / spec.burst_size, 1.0, horizon_ms)
        times, groups = [], []
        for group, start in enumerate(starts):
            offsets = np.sort(rng.uniform(0.0, spec.burst_spread_ms, spec.burst_size))
            times += [start + float(o) for o in offsets if start + o < horizon_ms]
            groups += [group] * int(np.sum(start + offsets < horizon_ms))
        return times, groups
    if spec.arrivals == "uniform":
        gap = 1000.0 / spec.rate_rps
        times = [i * gap for i in range(int(math.ceil(horizon_ms / gap)))]
        return [t for t in times if t < horizon_ms], [None] * len(times)
    cv = 1.0 if spec.arrivals == "poisson" else spec.cv
    times = _renewal_ms(rng, spec.rate_rps, cv, horizon_ms)
    return times, [None] * len(times)


def gamma_draw(rng: np.random.Generator, mean: float, cv: float, size: int | None = None):
    """Gamma variates with the given mean and coefficient of variation (cv 0 gives the mean)."""
    if cv <= 0:
        return np.full(size, float(mean)) if size is not None else float(mean)
    shape = 1.0 / (cv * cv)
    return rng.gamma(shape, mean / shape, size)


def _renewal_ms(rng: np.random.Generator, rate_rps: float, cv: float, horizon_ms: float) -> list[float]:
    mean_gap = 1000.0 / rate_rps
    expected = int(horizon_ms / mean_gap * 1.2) + 16
    times: list[float] = []
    now = 0.0
    while True:
        gaps = gamma_draw(rng, mean_gap, cv, expected)
        for gap in gaps:
            now += float(gap)
            if now >= horizon_ms:
                return times
            times.append(now)


def _length(rng: np.random.Generator, mean: int, cv: float, high: int) -> int:
    return int(min(high, max(1, round(float(gamma_draw(rng, mean, cv))))))


def _record(spec: SynthSpec, rng: np.random.Generator, t_ms: float, group: int | None) -> TraceRecord:
    if rng.random() < spec.score_fraction:
        count = _length(rng, spec.samples, spec.samples_cv, spec.max_samples)
        lengths = tuple(_length(rng, spec.tokens_per_sample, spec.tokens_cv, spec.max_tokens_per_sample)
                        for _ in range(count))
        return TraceRecord(t_ms=t_ms, route="score", sample_tokens=lengths,
                           deadline_ms=spec.deadline_ms, group=group)
    return TraceRecord(
        t_ms=t_ms, route="generate", prompt_tokens=_length(rng, spec.prompt_tokens, spec.prompt_cv,
                                                           spec.max_prompt_tokens),
        beam_width=spec.beam_width, max_new_tokens=spec.max_new_tokens,
        deadline_ms=spec.deadline_ms, group=group,
    )
