"""[gateway] shed_by_cost replayed through the simulator (the gateway's own policy code, a simulated
clock and worker): under overload it answers more requests in time than deadline order, under light
load it changes nothing, and no deadline class (nor the largest requests) is starved."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from pathlib import Path

from loadgen.service import ServiceModel
from loadgen.simulator import SimSettings, simulate
from loadgen.trace import TraceRecord, make_trace
from shared.config import load_config
from shared.latency_model import LatencyModel

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "overload.toml"
SERVICE = ServiceModel({"score": LatencyModel(0.005, 0.01, 0.0, 4.0)})
"""A worker whose cost grows with the tokens: 8 samples of 128 tokens alone 10.4 ms, of 16 tokens 4.8 ms."""
CLASSES_MS = (50.0, 100.0, 300.0)
SMALL, LARGE = (16,) * 8, (128,) * 8


def mixed(rate_rps: float, count: int, poisson: bool) -> list[TraceRecord]:
    """Requests of both sizes and every deadline class, in a fixed seeded order."""
    rng, t_ms, records = random.Random(3), 0.0, []
    for k in range(count):
        t_ms += rng.expovariate(rate_rps / 1000.0) if poisson else 1000.0 / rate_rps
        records.append(TraceRecord(t_ms=t_ms, route="score", sample_tokens=rng.choice((SMALL, LARGE)),
                                   deadline_ms=rng.choice(CLASSES_MS)))
    return records


def replay(records: list[TraceRecord], shed_by_cost: bool):
    settings = dataclasses.replace(SimSettings.from_config(load_config(CONFIG)), shed_by_cost=shed_by_cost,
                                   request_overhead_ms=2.0, batch_overhead_ms=1.0)
    return simulate(make_trace(records), settings, SERVICE)


def in_time(records: list[TraceRecord], results) -> Counter:
    """Answers within their deadline, by deadline class and by size."""
    counts: Counter = Counter()
    for record, result in zip(records, results):
        if result.outcome == "ok" and result.latency_ms <= record.deadline_ms:
            counts[record.deadline_ms] += 1
            counts["large" if record.sample_tokens == LARGE else "small"] += 1
    return counts


def test_under_overload_shedding_by_cost_answers_more_in_time_than_deadline_order():
    records = mixed(rate_rps=400.0, count=800, poisson=True)  # about twice what the worker sustains
    on, off = (in_time(records, replay(records, flag)) for flag in (True, False))
    assert sum(on[c] for c in CLASSES_MS) > 1.05 * sum(off[c] for c in CLASSES_MS)
    assert on["small"] > off["small"] and on["large"] < off["large"]  # the cheap ones are kept first


def test_under_light_load_shedding_by_cost_changes_nothing():
    records = mixed(rate_rps=40.0, count=200, poisson=False)
    on, off = replay(records, True), replay(records, False)
    assert [(r.outcome, r.done_ms) for r in on] == [(r.outcome, r.done_ms) for r in off]
    assert all(r.outcome == "ok" for r in on)


def test_under_overload_no_deadline_class_and_not_the_largest_requests_starve():
    records = mixed(rate_rps=400.0, count=800, poisson=True)
    on, off = (in_time(records, replay(records, flag)) for flag in (True, False))
    offered = Counter(r.deadline_ms for r in records)
    for deadline_ms in CLASSES_MS:
        assert on[deadline_ms] >= 0.9 * off[deadline_ms] and on[deadline_ms] >= 0.2 * offered[deadline_ms]
    large = sum(r.sample_tokens == LARGE for r in records)
    assert on["large"] >= 0.1 * large  # shed first, but still served where room opens
