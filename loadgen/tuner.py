"""Deadline and batching tuning: grid search for the highest goodput whose latency meets the SLO.

A candidate is a dict of setting -> value. An evaluator turns a candidate into per-request results:
the offline one simulates (loadgen/simulator.py), the live one restarts a gateway with the candidate
and replays a window of the trace (loadgen/live.py). Ranking: candidates whose pct-th latency
percentile over successful answers is within the SLO (times `headroom`), by goodput, then by lower
percentile, then by grid order (earlier first). When none meets the SLO there is no recommendation,
only the table. Offline, headroom below 1 leaves room for the simulator's error (`loadgen validate`
measures it): a candidate simulated just under the SLO is as likely to miss it live as to meet it.
"""

from __future__ import annotations

import dataclasses
import itertools
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from loadgen.result import RequestResult
from loadgen.stats import percentile, summarize
from shared.bounds import Bounds
from shared.config import ConfigError, DeploymentConfig

Evaluator = Callable[[dict[str, Any]], list[RequestResult]]
GATEWAY_KEYS = ("max_batch_wait_ms", "max_queue_tokens", "admission_margin_ms", "score_deadline_ms",
                "generate_deadline_ms", "admission", "drop_predicted_late", "queue_order", "shed_by_cost")
BOUNDS_KEYS = tuple(f.name for f in dataclasses.fields(Bounds))
"""Knobs that are [bounds] (shared/bounds.py), under their own names; all are integers."""
INT_KEYS = ("max_queue_tokens", "score_deadline_ms", "generate_deadline_ms", "workers", *BOUNDS_KEYS)
"""Settings shared/config.py declares as integers (TOML must carry them as integers)."""
CONFIG_KNOBS = {**{k: ("gateway", k) for k in GATEWAY_KEYS}, **{k: ("bounds", k) for k in BOUNDS_KEYS},
                "max_inflight_batches": ("gateway", "max_inflight_batches_per_worker"),
                "worker_timeout_ms": ("gateway", "worker_timeout_ms"),
                "min_shared_prefix_tokens": ("score", "min_shared_prefix_tokens")}
"""Knobs that are deployment-config keys, as (section, key): shared/config.py's own rules judge their values."""
WORLD_KNOBS = {"workers": (int, 1), "max_batch_requests": (int, 0), "static_prefix_tokens": (int, 0),
               "prefix_cache_tokens": (int, 0), "default_beam_width": (int, 1), "seed": (int, 0),
               "request_overhead_ms": (float, 0), "batch_overhead_ms": (float, 0), "gateway_ms_per_request": (float, 0)}
"""Knobs of the simulated world (loadgen/simulator.SimSettings) outside the config: (type, least value)."""
TUNABLE = (*CONFIG_KNOBS, *WORLD_KNOBS)


@dataclass(frozen=True)
class CandidateResult:
    """One candidate's numbers (all routes together)."""

    knobs: dict[str, Any]
    goodput_rps: float
    throughput_rps: float
    latency_pct_ms: float | None
    attainment: float
    outcomes: dict[str, int]
    meets_slo: bool

    def row(self) -> dict[str, Any]:
        return {**self.knobs, "goodput_rps": self.goodput_rps, "throughput_rps": self.throughput_rps,
                "latency_pct_ms": self.latency_pct_ms, "attainment": self.attainment,
                "meets_slo": self.meets_slo, "outcomes": self.outcomes}


@dataclass(frozen=True)
class TuneResult:
    """All candidates in grid order, and the index of the best (None if none meets the SLO)."""

    candidates: list[CandidateResult]
    best: int | None
    slo_ms: float
    pct: float

    def best_candidate(self) -> CandidateResult | None:
        return None if self.best is None else self.candidates[self.best]


def grid(axes: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """The cartesian product of the axes, in order (the last axis varies fastest)."""
    names = list(axes)
    return [dict(zip(names, values)) for values in itertools.product(*(axes[n] for n in names))]


def check_knobs(knobs: Mapping[str, Any], base: DeploymentConfig, source: str) -> None:
    """Raise ValueError, starting with `source`, naming the first knob whose value its rules refuse:
    config keys by shared/config.py's (types, ranges and the rules across fields, with `base` for the
    keys not given), world knobs by WORLD_KNOBS. Runs before any candidate is evaluated, so that a
    bad value is refused, not simulated or sent to a gateway."""
    sections: dict[str, dict[str, Any]] = {}
    for name, value in knobs.items():
        if name in CONFIG_KNOBS:
            section, key = CONFIG_KNOBS[name]
            sections.setdefault(section, {})[key] = value
        elif name in WORLD_KNOBS:
            kind, low = WORLD_KNOBS[name]
            if isinstance(value, bool) or not isinstance(value, (int, kind)) or value < low:
                what = "an integer" if kind is int else "a number"
                raise ValueError(f"{source}: {name} = {value!r} must be {what} of at least {low}")
        else:
            raise ValueError(f"{source}: {name!r} is not a setting; known: {', '.join(TUNABLE)}")
    try:
        base.replace(**{name: dataclasses.replace(_section(base, name), **keys) for name, keys in sections.items()})
    except ConfigError as exc:
        raise ValueError(f"{source}: {exc}") from None


def _section(config: DeploymentConfig, name: str) -> Any:
    """A config's section, [bounds] as a build would take it where the config leaves it out."""
    return config.build_bounds if name == "bounds" else getattr(config, name)


def score_candidate(knobs: dict[str, Any], results: list[RequestResult], slo_ms: float,
                    pct: float, window_s: float | None = None, headroom: float = 1.0) -> CandidateResult:
    summary = summarize(results, slo_ms, window_s)["routes"]["all"]
    ok = [r.done_ms - r.scheduled_ms for r in results if r.outcome == "ok"]
    value = percentile(ok, pct)
    return CandidateResult(
        knobs=dict(knobs), goodput_rps=summary["goodput_rps"] or 0.0,
        throughput_rps=summary["throughput_rps"] or 0.0, latency_pct_ms=value,
        attainment=summary["slo_attainment"] or 0.0, outcomes=summary["outcomes"],
        meets_slo=value is not None and value <= headroom * slo_ms,
    )


def tune(candidates: Sequence[dict[str, Any]], evaluate: Evaluator, slo_ms: float, pct: float = 99.0,
         window_s: float | None = None, on_result: Callable[[CandidateResult], None] | None = None,
         headroom: float = 1.0) -> TuneResult:
    """Evaluate every candidate and pick the best (see module docstring)."""
    scored = []
    for knobs in candidates:
        result = score_candidate(knobs, evaluate(dict(knobs)), slo_ms, pct, window_s, headroom)
        scored.append(result)
        if on_result is not None:
            on_result(result)
    return TuneResult(scored, pick_best(scored), slo_ms, pct)


def pick_best(scored: Sequence[CandidateResult]) -> int | None:
    eligible = [i for i, c in enumerate(scored) if c.meets_slo]
    if not eligible:
        return None
    return min(eligible, key=lambda i: (-round(scored[i].goodput_rps, 9), scored[i].latency_pct_ms, i))


def apply_knobs(raw: Mapping[str, Any], knobs: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a config as tomllib reads it, with the knobs written into [gateway] and [bounds]
    (worker counts are hosts, not settings: they are left out)."""
    out = {name: dict(value) if isinstance(value, Mapping) else value for name, value in raw.items()}
    gateway = {k: config_value(k, v) for k, v in knobs.items() if k in GATEWAY_KEYS}
    bounds = {k: int(v) for k, v in knobs.items() if k in BOUNDS_KEYS}
    if gateway:
        out["gateway"] = {**out.get("gateway", {}), **gateway}
    if bounds:
        out["bounds"] = {**out.get("bounds", {}), **bounds}
    return out


def config_toml(raw: Mapping[str, Any]) -> str:
    """TOML text of a deployment config (tomli-w), checked to load as one (names the bad field)."""
    from shared.config import parse_config

    text = tomli_w.dumps(dict(raw))
    parse_config(tomllib.loads(text))
    return text


def recommended_config(base_config: str | Path, knobs: Mapping[str, Any]) -> str:
    """The base deployment config with the recommended settings applied, as TOML."""
    return config_toml(apply_knobs(tomllib.loads(Path(base_config).read_text()), knobs))


def config_snippet(knobs: Mapping[str, Any]) -> str:
    """TOML for the recommended settings: [gateway] keys, and [bounds] caps as a reminder."""
    parts = [tomli_w.dumps({"gateway": {k: config_value(k, v) for k, v in knobs.items() if k in GATEWAY_KEYS}})]
    bounds = {k: int(v) for k, v in knobs.items() if k in BOUNDS_KEYS}
    if bounds:
        parts.append("# [bounds] are compiled into the packages: rebuild the artifacts after changing them\n"
                     + tomli_w.dumps({"bounds": bounds}))
    if "workers" in knobs:
        parts.append(f"# workers: {knobs['workers']} ([worker] endpoints and devices, one entry each)\n")
    return "\n".join(parts).rstrip("\n")


def table(result: TuneResult) -> str:
    """A plain-text table of all candidates, the best marked with '*'."""
    if not result.candidates:
        return "(no candidates)"
    names = list(result.candidates[0].knobs)
    pname = f"p{result.pct:g}_ms"
    header = ["", *names, "goodput/s", "thru/s", pname, "attain", "slo"]
    rows = [header]
    for i, c in enumerate(result.candidates):
        rows.append(["*" if i == result.best else "", *(f"{c.knobs[n]:g}" if isinstance(c.knobs[n], float)
                                                       else str(c.knobs[n]) for n in names),
                     f"{c.goodput_rps:.1f}", f"{c.throughput_rps:.1f}",
                     "-" if c.latency_pct_ms is None else f"{c.latency_pct_ms:.1f}",
                     f"{c.attainment:.3f}", "yes" if c.meets_slo else "no"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in rows)


def config_value(key: str, value: Any) -> Any:
    """The value as shared/config.py types the key (integers stay integers; switches and choices as given)."""
    if isinstance(value, (bool, str)):
        return value
    return int(round(value)) if key in INT_KEYS else float(value)

