"""`python -m loadgen validate`: how closely the simulator predicts the live stack, measured.

One local stack (loadgen/stack.py: gateway + workers, started and stopped here) serves the whole
check: a calibration replay (loadgen/calibrate.py), then the trace live at each load level, one
after another. A level is a fraction of capacity: the first `rate x duration_s` requests of the
trace, its clock scaled to that rate. The simulator then replays the very same sequence -
calibration, then each level, separated by idle gaps - with the latency model the workers reported
and the measured overheads, starting like the gateway from an unconfirmed profile, so the state
learnt from level to level is carried alike; each request reaches the simulated gateway when the
live client really sent it (latency counts from the scheduled time in both). The simulated workers
compute each level at the speed they reported for that level's own batches: the calibration's
model scaled to the level's total compute (the levels' batches are nearly all full, too alike to
fit a model of their own), and the jitter around it in the order it was measured (the k-th
simulated batch of a level takes the k-th live batch's factor: slow spells of the machine lasted
several batches, lag-1 autocorrelation of the factors 0.2-0.7 in our runs); and each request's
overhead around the gateway's queue as measured in the level (HTTP, JSON, tokenizing: it grew
from ~2 ms to ~9 ms at 2x, where the gateway and the client also handle the refused requests). The
gateway's predictions start from their start-up profile and learn as live. The speed is measured
per level because it is a condition of the machine, not of the policy: on a CPU shared with the
gateway, the client and other processes, the same batches took 0.6x-1.3x the calibration's time
from one minute to the next (validate.json's `compute_vs_calibration`). Per level: goodput,
p50/p99 of successes (with a bootstrap interval of the live p99), outcomes and drops by reason,
live and simulated, and the relative errors of goodput and p99; and, for
comparison, the simulator's goodput and p99 at the calibration's speed (held out from the levels)
and at the start-up profile's (what an offline tune without a calibration would see).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.bodies import BodyFactory, BodyOptions
from loadgen.calibrate import Calibration, calibrate, capacity_rps
from loadgen.prometheus import counter_diff
from loadgen.replayer import ReplayOptions, run_replay
from loadgen.result import ReplayRun, RequestResult
from loadgen.service import ServiceModel
from loadgen.sim_world import Jitter, Speed
from loadgen.simulator import SimSettings, Simulator
from loadgen.stack import LocalStack
from loadgen.stats import percentile_interval, summarize
from loadgen.sweep import at_rate
from loadgen.trace import Trace, make_trace, read_trace
from shared.policy import DROP_CODES

IDLE_GAP_MS = 1000.0
"""Idle time between segments of the simulated sequence, past the longest deadline."""


@dataclass(frozen=True)
class ValidateOptions:
    """What to validate and how long to replay each level."""

    trace_path: str
    config_path: str
    artifacts: str
    levels: tuple[float, ...] = (0.5, 1.0, 2.0)
    duration_s: float = 20.0
    slo_ms: float | None = None
    """Goodput counts successes within it; default: the config's deadline for the trace's route."""
    calibration_requests: int = 300
    calibration_load: float = 0.5
    """The calibration replays the trace's first requests at this fraction of the capacity the start-up
    profile predicts (the worker measured under load, as it will serve)."""
    label_token_ids: tuple[int, ...] = (10, 11)


@dataclass
class LiveSide:
    """What the live half produced."""

    profile: ServiceModel
    """What the workers reported at start-up."""
    calibration: Calibration
    capacity_rps: float
    segments: list[Trace]
    """The calibration trace, then one per level."""
    runs: list[ReplayRun]
    log_path: Path
    measured: list[Calibration | None] = dataclasses.field(default_factory=list)
    """Per level, the workers' speed (and overheads) as measured while it was served; None when the
    level got no batch to measure."""


def level_trace(trace: Trace, rate_rps: float, duration_s: float) -> Trace:
    """The first rate x duration requests of the trace, its clock scaled to `rate_rps`."""
    count = max(2, round(rate_rps * duration_s))
    if count > len(trace.records):
        raise ValueError(f"the trace holds {len(trace.records)} requests; {rate_rps:.1f}/s for {duration_s:g} s "
                         f"needs {count} (shorten --duration-s or use a longer trace)")
    start = trace.records[0].t_ms
    piece = make_trace([dataclasses.replace(r, t_ms=r.t_ms - start) for r in trace.records[:count]], trace.meta)
    return at_rate(piece, rate_rps)


def stack_bodies(artifacts: str | Path, label_token_ids: tuple[int, ...] = (10, 11)) -> BodyFactory:
    """Bodies of exact token lengths drawn from the served tokenizer's ordinary vocabulary."""
    return BodyFactory(BodyOptions(tokenizer_path=str(Path(artifacts) / "tokenizer.json"),
                                   label_token_ids=label_token_ids))


def calibrate_stack(stack: LocalStack, trace: Trace, settings: SimSettings, bodies: BodyFactory,
                    requests: int = 300, load: float = 0.5) -> tuple[ServiceModel, Calibration, ReplayRun, Trace]:
    """The workers' start-up profile, and a calibration replay of the trace's first `requests` at
    `load` x the capacity that profile predicts (with the run and the trace it replayed)."""
    profile = stack.reported_model()
    rate = load * capacity_rps(trace, settings, profile)
    warm = level_trace(trace, rate, requests / rate)
    warm_run = run_replay(warm, bodies, ReplayOptions(url=stack.url, progress=False, id_prefix="cal-"))
    return profile, calibrate(warm_run, warm, stack.batch_lines(), profile, settings, "cal-"), warm_run, warm


def run_live(options: ValidateOptions, trace: Trace, settings: SimSettings, scratch: Path) -> LiveSide:
    """Start the stack, calibrate, replay every level; the stack is stopped whatever happens."""
    bodies = stack_bodies(options.artifacts, options.label_token_ids)
    with LocalStack(options.config_path, options.artifacts, scratch) as stack:
        profile, calibration, warm_run, warm = calibrate_stack(stack, trace, settings, bodies,
                                                               options.calibration_requests, options.calibration_load)
        capacity = capacity_rps(trace, with_overheads(settings, calibration), calibration.model)
        segments, runs = [warm], [warm_run]
        for k, load in enumerate(options.levels):
            segments.append(level_trace(trace, load * capacity, options.duration_s))
            runs.append(run_replay(segments[-1], bodies, ReplayOptions(url=stack.url, progress=False,
                                                                      id_prefix=f"level{k}-")))
        measured = [_measure(run, segment, stack.batch_lines(), profile, settings, f"level{k}-", calibration.model)
                    for k, (run, segment) in enumerate(zip(runs[1:], segments[1:]))]
    return LiveSide(profile, calibration, capacity, segments, runs, stack.log_path, measured)


def _measure(run: ReplayRun, segment: Trace, batches: list, profile: ServiceModel, settings: SimSettings,
             id_prefix: str, shape: ServiceModel) -> Calibration | None:
    """What calibrate() measures, from a level's own replay, the model being the calibration's scaled
    to the level's speed (None if it has nothing to measure)."""
    try:
        return calibrate(run, segment, batches, profile, settings, id_prefix, shape)
    except RuntimeError:
        return None


def with_overheads(settings: SimSettings, calibration: Calibration) -> SimSettings:
    """The world the calibration measured: overheads, and the workers' jitter around their model."""
    return settings.with_knobs({"request_overhead_ms": calibration.request_overhead_ms,
                                "batch_overhead_ms": calibration.batch_overhead_ms,
                                "compute_jitter": calibration.jitter})


def simulate_segments(segments: list[Trace], settings: SimSettings, model: ServiceModel, profile: ServiceModel,
                      runs: list[ReplayRun] | None = None, measured: list[Calibration | None] | None = None
                      ) -> list[tuple[list[RequestResult], Counter[str]]]:
    """One simulated run of all segments in sequence; results and drop reasons per segment, with
    each segment's times from its own start (as a live replay has them). With the live `runs`, each
    request reaches the simulated gateway when the live client really sent it (a client that fell
    behind delayed the server's arrivals too); latency still counts from the scheduled time. With
    `measured` (one per segment, None = as `model`), the workers compute each segment at the speed
    and jitter measured while it was served live, and its requests take the overhead measured then."""
    gap_ms = max(settings.score_deadline_ms, settings.generate_deadline_ms) + IDLE_GAP_MS
    records, spans, offset = [], [], 0.0
    speeds = [Speed(0.0, model, Jitter(settings.compute_jitter, settings.seed))]
    for k, segment in enumerate(segments):
        if measured and measured[k] is not None:
            speeds.append(Speed(offset / 1000.0, measured[k].model,
                                Jitter(measured[k].jitter, settings.seed + k, in_order=True),
                                measured[k].request_overhead_ms))
        elif measured:
            speeds.append(dataclasses.replace(speeds[0], start_s=offset / 1000.0))
        spans.append((len(records), len(records) + len(segment.records), offset))
        sent = _send_times(segment, runs[k] if runs else None)
        records += [dataclasses.replace(r, t_ms=t + offset) for r, t in zip(segment.records, sent)]
        offset += max(sent, default=0.0) + gap_ms
    simulator = Simulator(settings, model, profile, speeds)
    results = simulator.run(make_trace(records))
    out = []
    for (start, end, shift), segment in zip(spans, segments):
        part = [dataclasses.replace(r, index=r.index - start, scheduled_ms=record.t_ms, sent_ms=r.sent_ms - shift,
                                    done_ms=r.done_ms - shift)
                for r, record in zip(results[start:end], segment.records)]
        out.append((part, Counter(simulator.reasons[i] for i in range(start, end) if i in simulator.reasons)))
    return out


def _send_times(segment: Trace, run: ReplayRun | None) -> list[float]:
    """Each record's arrival: its scheduled time, or when the live client sent it if later (kept in
    order, so the simulated trace lists the records as the segment does)."""
    times, last = [], 0.0
    for i, record in enumerate(segment.records):
        sent = run.results[i].sent_ms if run is not None else float("nan")
        last = max(last, record.t_ms, record.t_ms if math.isnan(sent) else sent)  # NaN: never sent
        times.append(last)
    return times


def live_drops(run: ReplayRun) -> dict[str, int]:
    """Drops by policy reason from the gateway's /metrics (it counts each dropped request once)."""
    counts = counter_diff(run.metrics_before, run.metrics_after, "boundserve_drops_total", "reason")
    return {reason: int(counts[reason]) for reason in DROP_CODES if counts.get(reason)}


def compare(load: float, live: ReplayRun, sim: tuple[list[RequestResult], Counter[str]],
            others: dict[str, list[RequestResult]], slo_ms: float) -> dict[str, Any]:
    """One level's row: live and simulated figures side by side, and the relative errors; also the
    goodput and p99 of the `others` simulations (name -> results), for comparison."""
    window = live.window_s or None
    a, b = summarize(live.results, slo_ms, window), summarize(sim[0], slo_ms, window)
    la, lb = a["routes"]["all"], b["routes"]["all"]
    row = {"load": load, "offered_rps": la["offered_rps"],
           "live_goodput_rps": la["goodput_rps"], "sim_goodput_rps": lb["goodput_rps"],
           "live_p50_ms": la["latency_ms"]["p50"], "sim_p50_ms": lb["latency_ms"]["p50"],
           "live_p99_ms": la["latency_ms"]["p99"], "sim_p99_ms": lb["latency_ms"]["p99"],
           "live_p99_interval_ms": percentile_interval([r.latency_ms for r in live.results if r.outcome == "ok"], 99.0),
           "live_outcomes": la["outcomes"], "sim_outcomes": lb["outcomes"],
           "live_drops": live_drops(live), "sim_drops": dict(sorted(sim[1].items())),
           "live_sender_saturated": a["sender"]["saturated"], "live_sender_lag_p99_ms": a["sender"]["lag_ms"]["p99"]}
    for name, results in others.items():
        c = summarize(results, slo_ms, window)["routes"]["all"]
        row[f"{name}_sim_goodput_rps"], row[f"{name}_sim_p99_ms"] = c["goodput_rps"], c["latency_ms"]["p99"]
    row["goodput_rel_err"] = rel_err(row["live_goodput_rps"], row["sim_goodput_rps"])
    row["p99_rel_err"] = rel_err(row["live_p99_ms"], row["sim_p99_ms"])
    return row


def _speed_json(speed: Calibration, calibration: Calibration) -> dict[str, Any]:
    """What a level measured, and its compute time relative to the calibration's (both as ratios to
    the start-up profile's prediction for their own batches)."""
    ratio = (speed.profile_ratio / calibration.profile_ratio
             if speed.profile_ratio and calibration.profile_ratio else None)
    return {"model": speed.model.to_dict(), "compute_vs_calibration": ratio, "batches": speed.batches,
            "request_overhead_ms": speed.request_overhead_ms, "batch_overhead_ms": speed.batch_overhead_ms}


def rel_err(live: float | None, sim: float | None) -> float | None:
    """|sim - live| / live; None when either is missing, 0 when both are 0."""
    if live is None or sim is None:
        return None
    if live == 0:
        return 0.0 if sim == 0 else float("inf")
    return abs(sim - live) / abs(live)


def validate(options: ValidateOptions, out_dir: str | Path) -> dict[str, Any]:
    """The whole check (see module docstring); writes the report under out_dir and returns its summary."""
    from shared.config import load_config
    from shared.manifest import read_manifest

    trace = read_trace(options.trace_path)
    config = load_config(options.config_path)
    settings = SimSettings.from_config(config, read_manifest(options.artifacts))
    slo_ms = options.slo_ms or settings.deadline_ms(trace.records[0].route)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="loadgen-validate-") as scratch:
        try:
            live = run_live(options, trace, settings, Path(scratch))
        finally:
            for log in Path(scratch).glob("stack.log"):
                shutil.copy(log, out / "stack.log")
    world = with_overheads(settings, live.calibration)
    measured = [None, *live.measured]  # the calibration segment runs at the calibration's speed
    simulated = simulate_segments(live.segments, world, live.calibration.model, live.profile, live.runs, measured)
    held_out = simulate_segments(live.segments, world, live.calibration.model, live.profile, live.runs)
    profile_only = simulate_segments(live.segments, world, live.profile, live.profile, live.runs)
    levels = [compare(load, run, sim, {"calibration": cal[0], "profile": other[0]}, slo_ms)
              for load, run, sim, cal, other in zip(options.levels, live.runs[1:], simulated[1:], held_out[1:],
                                                    profile_only[1:])]
    for row, speed in zip(levels, live.measured):
        row["measured"] = None if speed is None else _speed_json(speed, live.calibration)
    errors = [e for row in levels for e in (row["goodput_rel_err"], row["p99_rel_err"])]
    summary = {"levels": levels, "max_rel_err": None if None in errors else max(errors, default=0.0),
               "capacity_rps": live.capacity_rps, "slo_ms": slo_ms, "duration_s": options.duration_s,
               "calibration": live.calibration.to_json(), "startup_profile": live.profile.to_dict(),
               "trace": options.trace_path, "config": options.config_path, "artifacts": options.artifacts}
    from loadgen.validate_report import write_validation

    write_validation(out, summary, live.runs[1:], [s for s, _ in simulated[1:]])
    return summary
