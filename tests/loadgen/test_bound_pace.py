"""The clairvoyant bound in a world whose machine jitters by time (loadgen/machine_pace.py): it
knows the realised service times, bounds the exact optimum, which bounds every policy run
through the simulator in that same world; on problems small enough to search, it is the optimum."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from loadgen.bound import clairvoyant_bound, fluid_served
from loadgen.bound_exact import edf_schedule, exact_optimum, served_by
from loadgen.bound_problem import problem_of
from loadgen.machine_pace import MachinePace
from loadgen.service import ServiceModel
from loadgen.simulator import SimSettings, Simulator
from loadgen.trace import Trace, TraceRecord, make_trace
from shared.bounds import Bounds
from shared.latency_model import LatencyModel

POLICIES = {
    "admission": {},
    "edf_late_drop": {"admission": False, "shed_by_cost": False},
    "fcfs_late_drop": {"admission": False, "shed_by_cost": False, "queue_order": "arrival"},
}
SLOW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def paced_world(factors: tuple[float, ...], slot_ms: float, max_samples: int = 8, **knobs) -> SimSettings:
    """No overheads; compute at the model's time x the machine's factor of each slot it spans."""
    bounds = Bounds(max_samples_per_batch=max_samples, max_tokens_per_sample=64, max_tokens_per_batch=4096)
    return dataclasses.replace(SimSettings(max_queue_tokens=10**8, bounds=bounds, compute_jitter=factors,
                                           jitter_slot_ms=slot_ms), **knobs)


def in_time(trace: Trace, settings: SimSettings, service: ServiceModel) -> int:
    results = Simulator(settings, service).run(trace)
    return sum(r.outcome == "ok" and r.latency_ms <= rec.deadline_ms for r, rec in zip(results, trace.records))


models = st.builds(LatencyModel, alpha=st.floats(0, 0.01), beta=st.floats(0, 0.05), gamma=st.floats(0, 0.5),
                   delta=st.floats(0.5, 10))
records = st.builds(TraceRecord, t_ms=st.floats(0, 60), route=st.just("score"),
                    sample_tokens=st.lists(st.integers(1, 64), min_size=1, max_size=8).map(tuple),
                    deadline_ms=st.sampled_from([5.0, 10.0, 20.0, 40.0, 80.0]))
factor_sets = st.lists(st.floats(0.5, 2.0), min_size=1, max_size=6).map(tuple)
slots = st.sampled_from([0.5, 3.0, 10.0, 40.0])


def test_a_batch_runs_at_the_speed_of_each_slot_it_spans():
    """Slots of 10 ms, slot 0 twice the model's speed, slot 1 half: a batch of 15 model-ms from
    5 ms does 10 of them by 10 ms, the last 5 in 10 ms more: it ends at 20 ms."""
    seed = next(k for k in range(1000)
                if tuple(MachinePace((0.5, 2.0), k, 10.0).factor(n) for n in (0, 1)) == (0.5, 2.0))
    pace = MachinePace((0.5, 2.0), seed, 10.0)
    assert pace.finish_ms(5.0, 15.0) == pytest.approx(20.0)
    assert pace.finish_ms(5.0, 4.0) == pytest.approx(7.0)
    assert pace.work_ms(np.array([0.0, 5.0]), np.array([20.0]))[:, 0] == pytest.approx([25.0, 15.0])
    pace.finish_ms(500.0, 100.0)  # later slots drawn first change nothing before them
    assert MachinePace((0.5, 2.0), seed, 10.0).factor(1) == pace.factor(1) == 2.0


@given(factors=factor_sets, slot_ms=slots, seed=st.integers(0, 5), start_ms=st.floats(-30, 200),
       model_ms=st.floats(0.01, 100))
def test_finish_and_work_agree(factors, slot_ms, seed, start_ms, model_ms):
    """The work a worker can do from a start to a batch's finish is exactly the batch's model time."""
    pace = MachinePace(factors, seed, slot_ms)
    end = pace.finish_ms(start_ms, model_ms)
    assert end >= start_ms + model_ms * min(factors) - 1e-9
    assert pace.work_ms(np.array([start_ms]), np.array([end]))[0, 0] == pytest.approx(model_ms, rel=1e-9, abs=1e-9)


def test_simulator_batches_take_the_paced_time():
    """The simulator's workers compute at the pace the bound knows: each batch ends where the pace says."""
    factors = (0.6, 1.0, 1.7)
    trace = make_trace(TraceRecord(t_ms=7.0 * i, route="score", sample_tokens=(40,) * 4, deadline_ms=300.0)
                       for i in range(30))
    service = ServiceModel({"score": LatencyModel(0.0015, 0.004, 0.0, 6.0)})
    sim = Simulator(paced_world(factors, 5.0), service)
    sim.run(trace)
    pace = MachinePace(factors, 0, 5.0)
    assert len({round(end - start, 6) for _, start, end in sim.computing}) > 1  # the pace varies
    for _, start_s, end_s in sim.computing:
        model_ms = pace.work_ms(np.array([start_s * 1000.0]), np.array([end_s * 1000.0]))[0, 0]
        assert model_ms == pytest.approx(service("score", 4, 40), rel=1e-6)


@settings(SLOW, max_examples=120)
@given(model=models, recs=st.lists(records, min_size=1, max_size=7), factors=factor_sets, slot_ms=slots,
       max_samples=st.sampled_from([2, 8]))
def test_paced_bound_at_least_exact_at_least_every_policy_and_equal_where_searched(model, recs, factors, slot_ms,
                                                                                    max_samples):
    assume(all(len(r.sample_tokens) <= max_samples for r in recs))  # one job each: what the search counts
    trace, service = make_trace(recs), ServiceModel({"score": model})
    sim = paced_world(factors, slot_ms, max_samples)
    problem = problem_of(trace, sim, service)
    optimum, schedule = exact_optimum(problem)
    assert len(served_by(problem, schedule)) == optimum  # the optimum is a real schedule at the pace
    assert optimum >= len(served_by(problem, edf_schedule(problem)))
    for share in (0.0, 0.5, 1.0):
        assert fluid_served(problem, share).sum() >= optimum - 1e-6  # the relaxation bounds it
    bound = clairvoyant_bound(problem)
    assert bound.served == bound.exact == optimum
    for name, knobs in POLICIES.items():
        assert optimum >= in_time(trace, dataclasses.replace(sim, **knobs), service), name


@SLOW
@given(model=models, recs=st.lists(records, min_size=13, max_size=40), factors=factor_sets, slot_ms=slots,
       workers=st.sampled_from([1, 2]))
def test_paced_relaxation_bounds_every_policy_beyond_the_search(model, recs, factors, slot_ms, workers):
    """Requests cut into chunks (8 samples against 4 a batch), one or two workers, too many to search."""
    trace, service = make_trace(recs), ServiceModel({"score": model})
    sim = paced_world(factors, slot_ms, 4, workers=workers)
    bound = clairvoyant_bound(problem_of(trace, sim, service))
    assert bound.exact is None
    for name, knobs in POLICIES.items():
        assert bound.served >= in_time(trace, dataclasses.replace(sim, **knobs), service), (name, workers)


def test_knowing_the_pace_tightens_the_bound_over_the_fastest_factor():
    """The same factors drawn per batch force the bound to take every batch at the fastest one."""
    trace = make_trace(TraceRecord(t_ms=2.0 * i, route="score", sample_tokens=(60,) * 8,
                                   deadline_ms=(50.0, 100.0, 300.0)[i % 3]) for i in range(300))
    service = ServiceModel({"score": LatencyModel(0.0015, 0.004, 0.0, 12.0)})
    factors = (0.7, 1.0, 1.0, 1.0, 1.3)
    paced = clairvoyant_bound(problem_of(trace, paced_world(factors, 20.0, 16), service))
    per_batch = clairvoyant_bound(problem_of(trace, paced_world(factors, 0.0, 16), service))
    assert paced.served < per_batch.served


def test_pace_refuses_what_cannot_run():
    with pytest.raises(ValueError, match="slot_ms > 0"):
        MachinePace((1.0,), 0, 0.0)
    with pytest.raises(ValueError, match="every one > 0"):
        MachinePace((1.0, 0.0), 0, 5.0)
