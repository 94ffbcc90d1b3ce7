"""A worker with two batches in flight does not idle behind their messages.

Each batch's round trip carries an overhead outside its compute (messages, decoding, wake-ups: the
gateway learns it as the round trip less the worker's own times). With two batches in flight that
overhead overlaps the compute of the batch before, so the scheduler must count it once, not once per
batch: summing whole round trips held every next batch until the worker had gone idle (replayed in
the world the live overload runs measured, about a tenth of each 2x window). Replayed through the
simulator, which runs the gateway's own scheduler on a fake clock."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from loadgen.service import ServiceModel
from loadgen.simulator import SimSettings, Simulator
from loadgen.trace import TraceRecord, make_trace
from shared.config import load_config
from shared.latency_model import LatencyModel

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "overload.toml"
SERVICE = ServiceModel({"score": LatencyModel(0.005, 0.01, 0.0, 4.0)})
"""8 samples of 64 tokens: 6.6 ms of compute."""
OVERHEAD_MS = 4.0


def computing_share(overhead_ms: float) -> float:
    """Of the span from the first batch's start to the last one's end, the share the worker computed,
    under a steady overload (a request every 2 ms, each alone about 6 ms of compute; 400 ms deadlines)."""
    records = [TraceRecord(t_ms=2.0 * k, route="score", sample_tokens=(64,) * 8, deadline_ms=400.0)
               for k in range(600)]
    settings = dataclasses.replace(SimSettings.from_config(load_config(CONFIG)), batch_overhead_ms=overhead_ms,
                                   max_inflight_batches=2)
    simulator = Simulator(settings, SERVICE)
    simulator.run(make_trace(records))
    spans = sorted((start, end) for _, start, end in simulator.computing)
    busy = sum(end - start for start, end in spans)
    return busy / (spans[-1][1] - spans[0][0])


def test_with_two_batches_in_flight_the_worker_computes_back_to_back_whatever_the_overhead():
    assert computing_share(0.0) > 0.99
    assert computing_share(OVERHEAD_MS) > 0.99


def test_the_workers_own_time_per_batch_keeps_it_busy_and_the_compute_factor_scales_every_compute():
    """Each request fills a batch alone (16 samples of 64 tokens), all queued at once: the worker computes each
    for the model's time x compute_factor, and after each stays busy worker_ms_per_batch before the next starts
    (its own receiving and answering, on the core it computes on); the answer does not wait for that time."""
    records = [TraceRecord(t_ms=0.0, route="score", sample_tokens=(64,) * 16, deadline_ms=10_000.0) for _ in range(20)]
    settings = dataclasses.replace(SimSettings.from_config(load_config(CONFIG)), batch_overhead_ms=OVERHEAD_MS,
                                   max_inflight_batches=2, worker_ms_per_batch=1.5, compute_factor=1.25)
    simulator = Simulator(settings, SERVICE)
    results = simulator.run(make_trace(records))
    spans = sorted((start, end) for _, start, end in simulator.computing)
    model_ms = SERVICE("score", 16, 64)
    assert len(spans) == 20 and all(abs((end - start) * 1000.0 - 1.25 * model_ms) < 1e-6 for start, end in spans)
    gaps_ms = [(b[0] - a[1]) * 1000.0 for a, b in zip(spans, spans[1:])]
    assert min(gaps_ms) >= 1.5 - 1e-6 and abs(min(gaps_ms) - 1.5) < 1e-6  # back to back, 1.5 ms apart at least
    first = min(results, key=lambda r: r.done_ms)
    assert abs(first.done_ms - 1000.0 * spans[0][1] - OVERHEAD_MS / 2.0) < 1e-6  # answered when its compute ends
    assert [b for b, _, _ in simulator.computed] == [16] * 20
