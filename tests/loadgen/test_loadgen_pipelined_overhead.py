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
