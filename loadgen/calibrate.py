"""What the simulator needs to replay a live stack, measured on it before the replay.

A calibration replay sends the first requests of the trace at half the capacity the workers'
start-up profile predicts (loadgen/validate.py), so the worker computes batches of the sizes the
trace makes, under load, on the machine as it is now. Every request carries an id (X-Request-Id)
that the worker's `batch_done` lines name, so each batch's B and L are known. From it:
  worker model         T = (alpha*B + beta)*L + gamma*B + delta fitted on the compute times the
                       worker reported for those batches (the same measurements the gateway's
                       CorrectedModel refits on), each batch's measured / fitted ratio (the
                       worker's jitter), and how far the start-up profile was off;
  batch_overhead_ms    the gateway's round trip per batch (its `worker` stage on /metrics) less
                       what the worker spent on it (queue_ms + compute_ms): messages, packing;
  request_overhead_ms  the client's latency less the gateway's queue stage and its batch's round
                       trip: HTTP, JSON, tokenizing.
Capacity is the simulator's saturation throughput: the trace offered all at once with no deadline
and no queue budget, served in full batches back to back.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass

from loadgen.prometheus import stage_breakdown
from loadgen.result import ReplayRun
from loadgen.service import ServiceFn, ServiceModel
from loadgen.sim_world import ROUTE_WORKLOAD, jobs_of
from loadgen.simulator import SimSettings, simulate
from loadgen.trace import Trace, make_trace
from shared.latency_model import LatencyModel

UNBOUNDED_MS = 1e12


@dataclass(frozen=True)
class Calibration:
    """Measured on the live stack: the workers' compute model now, and the overheads around it."""

    model: ServiceModel
    """Fitted on the compute times the workers reported for the calibration batches."""
    fit_rmse_ms: dict[str, float]
    profile_ratio: float | None
    """Measured compute / the start-up profile's prediction, over the calibration batches."""
    jitter: tuple[float, ...]
    """Measured compute / the fitted model's prediction, per calibration batch, in the order they ended."""
    request_overhead_ms: float
    batch_overhead_ms: float
    requests: int
    batches: int

    def to_json(self) -> dict:
        return {"model": self.model.to_dict(), "fit_rmse_ms": self.fit_rmse_ms, "profile_ratio": self.profile_ratio,
                "jitter": [round(r, 3) for r in self.jitter],
                "request_overhead_ms": self.request_overhead_ms, "batch_overhead_ms": self.batch_overhead_ms,
                "requests": self.requests, "batches": self.batches}


def calibrate(run: ReplayRun, trace: Trace, batches: list, profile: ServiceModel, settings: SimSettings,
              id_prefix: str, shape: ServiceModel | None = None) -> Calibration:
    """From the calibration replay of `trace` (ids `<id_prefix><index>`) and the workers' batch lines.
    With `shape`, the model is `shape` scaled to these batches' total compute (one factor per
    workload) instead of a free fit: a replay whose batches are nearly all one size cannot tell the
    per-sample cost from the per-batch one, and a free fit of it mispredicts every other size."""
    stages = stage_breakdown(run.metrics_before, run.metrics_after).get("all", {})
    round_trip, queue_stage = stages.get("worker"), stages.get("queue", {})
    ok = [r for r in run.results if r.outcome == "ok"]
    shapes = {f"{id_prefix}{i}": request_shape(r, settings) for i, r in enumerate(trace.records)}
    mine = [b for b in batches if b.request_ids and all(i in shapes for i in b.request_ids)]
    if not ok or not round_trip or not mine:
        raise RuntimeError("the calibration replay got no answers, or the gateway exposed no stage metrics, or the "
                           f"workers logged no batch lines; outcomes: {sorted({r.outcome for r in run.results})}")
    points: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    done_unix: dict[str, list[float]] = defaultdict(list)
    predicted = measured = 0.0
    for batch in mine:
        live = [shapes[i] for i in batch.request_ids if i not in batch.expired]
        if live and batch.compute_ms > 0:
            route, items, tokens = live[0][0], sum(s[1] for s in live), sum(s[2] for s in live)
            points[ROUTE_WORKLOAD[route]].append((items, tokens / items, batch.compute_ms))
            done_unix[ROUTE_WORKLOAD[route]].append(batch.done_unix)
            predicted, measured = predicted + profile(route, items, tokens / items), measured + batch.compute_ms
    models = {w: _scaled(shape.models[w], p) if shape is not None and w in shape.models
              else _fit(p, profile.models.get(w)) for w, p in points.items()}
    jitter = sorted((at, t / m.predict_ms(b, l)) for w, (m, _) in models.items()
                    for (b, l, t), at in zip(points[w], done_unix[w]) if m.predict_ms(b, l) > 0)
    batch_overhead = max(0.0, round_trip["mean_ms"] - sum(b.queue_ms + b.compute_ms for b in mine) / len(mine))
    # every answered request waited for its whole batch: sum the round trips per request
    per_request_rt = sum((b.queue_ms + b.compute_ms + batch_overhead) * len(b.request_ids) for b in mine)
    queued = queue_stage.get("mean_ms", 0.0) * queue_stage.get("count", 0)
    request_overhead = (sum(r.latency_ms for r in ok) - queued - per_request_rt) / len(ok)
    return Calibration(ServiceModel({w: m for w, (m, _) in models.items()}),
                       {w: rmse for w, (_, rmse) in models.items()}, measured / predicted if predicted else None,
                       tuple(r for _, r in jitter), max(0.0, request_overhead), batch_overhead, len(run.results),
                       len(mine))


def request_shape(record, settings: SimSettings) -> tuple[str, int, int]:
    """(route, B, B*L) of a request sent alone: what the latency model sees of it."""
    workload = ROUTE_WORKLOAD[record.route]
    jobs = jobs_of(0, record, 0.0, settings.batch_bounds(workload), settings.default_beam_width, settings.sharing(),
                   settings.static_prefix_tokens)
    return record.route, sum(j.batch_items for j in jobs), sum(j.latency_tokens for j in jobs)


def _fit(points: list[tuple[float, float, float]], fallback: LatencyModel | None) -> tuple[LatencyModel, float]:
    """The least-squares model of the points (the start-up profile when they cannot determine one)."""
    try:
        model = LatencyModel.fit(points) if len({(b, l) for b, l, _ in points}) >= 4 else None
    except ValueError:
        model = None
    model = model or fallback
    if model is None:
        raise RuntimeError("too few distinct calibration batches to fit a latency model")
    return model, model.rmse_ms(points)


def _scaled(model: LatencyModel, points: list[tuple[float, float, float]]) -> tuple[LatencyModel, float]:
    """`model` times the ratio of the points' measured to predicted total (T is linear in its coefficients)."""
    factor = sum(t for _, _, t in points) / sum(model.predict_ms(b, l) for b, l, _ in points)
    scaled = LatencyModel(model.alpha * factor, model.beta * factor, model.gamma * factor, model.delta * factor)
    return scaled, scaled.rmse_ms(points)


def capacity_rps(trace: Trace, settings: SimSettings, service: ServiceFn, requests: int = 2000) -> float:
    """Requests/s the simulated deployment serves at saturation (see module docstring)."""
    records = [dataclasses.replace(r, t_ms=0.0, deadline_ms=None) for r in trace.records[:requests]]
    unbounded = settings.with_knobs({"score_deadline_ms": UNBOUNDED_MS, "generate_deadline_ms": UNBOUNDED_MS,
                                     "max_queue_tokens": 2**62, "admission": False, "request_overhead_ms": 0.0})
    results = simulate(make_trace(records), unbounded, service)
    done = [r.done_ms for r in results if r.outcome == "ok"]
    if not done or max(done) <= 0:
        raise RuntimeError("the simulator served nothing at saturation; check the latency model")
    return len(done) / (max(done) / 1000.0)
