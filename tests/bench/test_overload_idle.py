"""Why the worker idles (bench/overload_idle.py): each idle instant in exactly one of the trace's gaps,
the scheduler's share (queued or only refused) and alive requests none of which could still be sent."""

from __future__ import annotations

import dataclasses

import pytest

from bench.overload_idle import idle_split
from loadgen.bound_problem import problem_of
from loadgen.service import ServiceModel
from loadgen.simulator import SimSettings, Simulator
from loadgen.trace import TraceRecord, make_trace
from shared.bounds import Bounds
from shared.latency_model import LatencyModel
from shared.policy.scheduler import DecisionLog

FIVE_MS = ServiceModel({"score": LatencyModel(0.0, 0.0, 0.0, 5.0)})
"""Every batch 5 ms, whatever it holds."""
WORLD = SimSettings(max_queue_tokens=10**8, bounds=Bounds(max_samples_per_batch=16, max_tokens_per_sample=64,
                                                          max_tokens_per_batch=4096))


def problem(*records: tuple[float, float]):
    """(arrival ms, deadline ms) per request, one sample each, no overheads."""
    trace = make_trace(TraceRecord(t_ms=t, route="score", sample_tokens=(8,), deadline_ms=d) for t, d in records)
    return problem_of(trace, WORLD, FIVE_MS)


def log_of(*entries: tuple) -> DecisionLog:
    """Entries as (kind, ms, *what): the simulator's log names requests by their trace position."""
    log = DecisionLog()
    for kind, ms, *what in entries:
        log.add(kind, ms / 1000.0, *what)
    return log


def test_a_held_batch_is_the_schedulers_share_and_an_answered_request_is_not():
    """Due at 50 ms, sent at 10 (held), computed 10-15; the span is 30 ms: idle 0-10 while it waits
    (the scheduler's, queued), 15-30 while it is alive but answered."""
    split = idle_split(problem((0.0, 50.0)), [(10.0, 15.0)], log_of(("admit", 0, "0"), ("batch", 10, "0", ("0",))),
                       30.0)
    assert split.idle == pytest.approx(25 / 30)
    assert (split.gap, split.scheduler, split.queued, split.refused) == (0.0, pytest.approx(10 / 30),
                                                                        pytest.approx(10 / 30), 0.0)
    assert (split.nothing_servable, split.too_late) == (pytest.approx(15 / 30), 0.0)


def test_a_refused_request_the_idle_worker_could_serve_is_the_schedulers_refused_share():
    """Refused at 0, due at 50, alone 5 ms: servable until 45; the worker idles throughout."""
    split = idle_split(problem((0.0, 50.0)), [], log_of(("refuse", 0, "0", "deadline_unmeetable")), 60.0)
    assert (split.scheduler, split.queued, split.refused) == (pytest.approx(45 / 60), 0.0, pytest.approx(45 / 60))
    assert split.too_late == pytest.approx(5 / 60)  # 45-50: alive, unsent, a batch of it would end late
    assert split.gap == pytest.approx(10 / 60)  # 50-60: nothing alive


def test_time_with_no_request_alive_is_the_trace_gap():
    """Requests at 0 and 100 ms, due 20 ms later, each sent at once: idle 5-100, no request alive 20-100."""
    split = idle_split(problem((0.0, 20.0), (100.0, 20.0)), [(0.0, 5.0)],
                       log_of(("admit", 0, "0"), ("batch", 0, "0", ("0",))), 100.0)
    assert (split.idle, split.gap, split.scheduler) == (pytest.approx(0.95), pytest.approx(0.80), 0.0)
    assert split.nothing_servable == pytest.approx(0.15)


def test_a_replayed_burst_splits_every_idle_instant_once():
    """The simulator's own run of bursts 600 ms apart (the loosest deadline 300 ms): the parts add up to
    the idle share, each in [0, 1]."""
    records = [(600.0 * burst + 0.5 * k, (50.0, 100.0, 300.0)[k % 3]) for burst in range(4) for k in range(30)]
    trace = make_trace(TraceRecord(t_ms=t, route="score", sample_tokens=(40,) * 8, deadline_ms=d) for t, d in records)
    service = ServiceModel({"score": LatencyModel(0.0015, 0.004, 0.0, 12.0)})
    world = dataclasses.replace(WORLD, batch_overhead_ms=1.0, compute_jitter=(0.8, 1.0, 1.25), jitter_slot_ms=20.0)
    log = DecisionLog()
    sim = Simulator(world, service, log=log)
    sim.run(trace)
    split = idle_split(problem_of(trace, world, service), [(1e3 * a, 1e3 * b) for _, a, b in sim.computing], log,
                       max(t for t, _ in records))
    assert split.idle == pytest.approx(split.gap + split.scheduler + split.nothing_servable)
    assert split.scheduler == pytest.approx(split.queued + split.refused)
    assert all(0.0 <= v <= 1.0 for v in dataclasses.astuple(split))
    assert split.gap > 0.3 and split.idle < 1.0  # the gaps between bursts; the bursts computed


def test_idle_split_refuses_what_it_cannot_split():
    with pytest.raises(ValueError, match="one worker"):
        idle_split(dataclasses.replace(problem((0.0, 50.0)), workers=2), [], DecisionLog(), 10.0)
    with pytest.raises(ValueError, match="span > 0"):
        idle_split(problem((0.0, 50.0)), [], DecisionLog(), 0.0)
