"""Priorities in the simulator (the gateway's own scheduler): a trace record's priority reaches the
queue, and under overload the higher priority keeps what it gets alone while the lower absorbs the
refusals; a trace line carries it, and a body sends it."""

import dataclasses

import pytest

from loadgen.bodies import BodyFactory, BodyOptions
from loadgen.service import ServiceModel
from loadgen.simulator import SimSettings, Simulator
from loadgen.trace import TraceError, TraceRecord, make_trace, parse_record
from shared.latency_model import LatencyModel

SERVICE = ServiceModel({"score": LatencyModel(0.0, 0.0, 0.5, 4.0)})  # 4 ms a batch + 0.5 ms a sample


def overload(every_ms: float = 2.0, count: int = 400) -> list[TraceRecord]:
    """8-sample requests every 2 ms (a full batch of 16 takes 12 ms: about 1.5x what the worker serves),
    deadlines 40 ms; every fifth at priority 1."""
    return [TraceRecord(t_ms=every_ms * i, route="score", sample_tokens=(30,) * 8, deadline_ms=40.0,
                        priority=1 if i % 5 == 0 else 0) for i in range(count)]


def in_time(records, results) -> list[bool]:
    return [r.outcome == "ok" and r.latency_ms <= rec.deadline_ms for r, rec in zip(results, records)]


def test_under_overload_the_high_priority_keeps_what_it_gets_alone():
    records = overload()
    settings = SimSettings(score_deadline_ms=40.0)
    mixed = in_time(records, Simulator(settings, SERVICE).run(make_trace(records)))
    high = [i for i, rec in enumerate(records) if rec.priority]
    alone_records = [records[i] for i in high]
    alone = in_time(alone_records, Simulator(settings, SERVICE).run(make_trace(alone_records)))
    flat = [dataclasses.replace(rec, priority=0) for rec in records]
    unprioritised = in_time(flat, Simulator(settings, SERVICE).run(make_trace(flat)))
    served_high, served_alone = sum(mixed[i] for i in high), sum(alone)
    assert served_alone == len(high)
    assert served_high >= 0.95 * served_alone
    assert sum(unprioritised[i] for i in high) < served_high  # without priorities they share the refusals
    assert sum(mixed) < len(records)  # it was an overload: the low priority lost what the high kept


def test_a_trace_line_carries_a_priority_and_a_body_sends_it():
    record = parse_record({"t_ms": 0, "route": "score", "sample_tokens": [3, 4], "priority": 2})
    assert record.priority == 2 and record.to_json()["priority"] == 2
    assert BodyFactory(BodyOptions(seed=1)).body(record, 0)["priority"] == 2
    assert "priority" not in BodyFactory(BodyOptions(seed=1)).body(dataclasses.replace(record, priority=0), 0)
    with pytest.raises(TraceError, match="priority must be an integer"):
        parse_record({"t_ms": 0, "route": "score", "sample_tokens": [3], "priority": "high"})
