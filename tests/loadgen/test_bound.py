"""The clairvoyant bound (loadgen/bound.py): it bounds the true optimum (loadgen/bound_exact.py),
which bounds every schedule the project's own policy produces through the simulator."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections import Counter

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from loadgen.__main__ import main
from loadgen.bound import class_bounds, clairvoyant_bound, fluid_served
from loadgen.bound_exact import Batch, edf_schedule, exact_optimum, served_by
from loadgen.bound_problem import BatchLimits, problem_of
from loadgen.service import ServiceModel
from loadgen.simulator import SimSettings, Simulator
from loadgen.trace import Trace, TraceRecord, make_trace, write_trace
from shared.bounds import Bounds
from shared.latency_model import LatencyModel

POLICIES = {
    "admission": {},
    "edf_late_drop": {"admission": False, "shed_by_cost": False},
    "fcfs_late_drop": {"admission": False, "shed_by_cost": False, "queue_order": "arrival"},
}
"""bench/overload.py's policies, as the simulator runs them (admission: the product's defaults)."""


def world(max_samples: int = 16, max_tokens: int = 4096, **knobs) -> SimSettings:
    """The simulator's settings with no overheads and no jitter: service times are the model's."""
    bounds = Bounds(max_samples_per_batch=max_samples, max_tokens_per_sample=64, max_tokens_per_batch=max_tokens)
    return dataclasses.replace(SimSettings(max_queue_tokens=10**8, bounds=bounds), **knobs)


def served_in_time(trace: Trace, settings: SimSettings, service: ServiceModel) -> int:
    """Requests the simulator answers within their deadline (bench/overload_sim.py's goodput count)."""
    return sum(in_time_by_class(trace, settings, service).values())


def in_time_by_class(trace: Trace, settings: SimSettings, service: ServiceModel) -> Counter[str]:
    """Per deadline class (the bound's class names), requests the simulator answers within their deadline."""
    results = Simulator(settings, service).run(trace)
    return Counter(f"{rec.deadline_ms:g}" for r, rec in zip(results, trace.records)
                   if r.outcome == "ok" and r.latency_ms <= rec.deadline_ms)


models = st.builds(LatencyModel, alpha=st.floats(0, 0.01), beta=st.floats(0, 0.05), gamma=st.floats(0, 0.5),
                   delta=st.floats(0.5, 10))
records = st.builds(TraceRecord, t_ms=st.floats(0, 60), route=st.just("score"),
                    sample_tokens=st.lists(st.integers(1, 64), min_size=1, max_size=8).map(tuple),
                    deadline_ms=st.sampled_from([5.0, 10.0, 20.0, 40.0, 80.0]))
SLOW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(SLOW, max_examples=150)
@given(model=models, recs=st.lists(records, min_size=1, max_size=7), max_samples=st.sampled_from([2, 8, 16]),
       max_tokens=st.sampled_from([512, 4096]))
def test_bound_at_least_exact_optimum_at_least_every_schedule(model, recs, max_samples, max_tokens):
    assume(all(len(r.sample_tokens) <= max_samples for r in recs))  # one job each: what the exact search counts
    trace, service = make_trace(recs), ServiceModel({"score": model})
    sim = world(max_samples, max_tokens)
    problem = problem_of(trace, sim, service)
    optimum, schedule = exact_optimum(problem)
    edf = edf_schedule(problem)

    assert len(served_by(problem, schedule)) == optimum  # the optimum is a real schedule
    for share in (0.0, 0.5, 1.0):
        assert fluid_served(problem, share).sum() >= optimum - 1e-6
    assert clairvoyant_bound(problem).served >= optimum
    assert optimum >= len(served_by(problem, edf))
    per_class = class_bounds(problem)
    optimum_by_class = Counter(problem.requests[i].klass for i in served_by(problem, schedule))
    for name, knobs in POLICIES.items():
        policy = in_time_by_class(trace, dataclasses.replace(sim, **knobs), service)
        assert optimum >= sum(policy.values()), name
        assert all(per_class[c] >= policy[c] and per_class[c] >= optimum_by_class[c] for c in per_class), name


def brute_force_optimum(problem) -> int:
    """Every sequence of disjoint batches, each started as soon as it can be: the most served."""
    members = [(r, 0) for r in range(len(problem.requests))]

    def best(left: frozenset, free_ms: float, batches: tuple) -> int:
        served = len(served_by(problem, list(batches)))
        for size in range(1, len(left) + 1):
            for chosen in itertools.combinations(sorted(left), size):
                jobs = [problem.requests[r].jobs[j] for r, j in chosen]
                if not problem.limits["score"].fits(jobs):
                    continue
                start = max(free_ms, *(problem.requests[r].release_ms for r, _ in chosen))
                batch = Batch(start, chosen)
                end = problem.finish_ms(start, problem.limits["score"].batch_ms(jobs))
                served = max(served, best(left - set(chosen), end, batches + (batch,)))
        return served

    return best(frozenset(members), float("-inf"), ())


@SLOW
@given(model=models, recs=st.lists(records, min_size=1, max_size=4), max_samples=st.sampled_from([2, 8, 16]))
def test_exact_optimum_equals_a_search_of_every_schedule(model, recs, max_samples):
    assume(all(len(r.sample_tokens) <= max_samples for r in recs))
    problem = problem_of(make_trace(recs), world(max_samples), ServiceModel({"score": model}))
    assert exact_optimum(problem)[0] == brute_force_optimum(problem)


@SLOW
@given(model=models, recs=st.lists(records, min_size=5, max_size=40))
def test_bound_holds_for_requests_cut_into_chunks_and_two_workers(model, recs):
    """Up to 8 samples a request against 4 per batch: requests cut into chunks, every chunk counted."""
    trace, service = make_trace(recs), ServiceModel({"score": model})
    for workers in (1, 2):
        sim = world(4, 4096, workers=workers)
        bound = clairvoyant_bound(problem_of(trace, sim, service)).served
        for name, knobs in POLICIES.items():
            assert bound >= served_in_time(trace, dataclasses.replace(sim, **knobs), service), (name, workers)


beam_records = st.builds(TraceRecord, t_ms=st.floats(0, 60), route=st.just("generate"),
                         prompt_tokens=st.integers(1, 64), beam_width=st.integers(1, 16), max_new_tokens=st.just(4),
                         deadline_ms=st.sampled_from([10.0, 40.0, 80.0]))


@SLOW
@given(score=models, beam=models, recs=st.lists(st.one_of(records, beam_records), min_size=2, max_size=30),
       max_beam_width=st.sampled_from([4, 16]))
def test_bound_holds_for_beam_search_mixed_with_scoring(score, beam, recs, max_beam_width):
    """Both workloads share the one worker; a request wider than max_beam_width (which the simulator
    does not refuse) widens the bound's batch instead of breaking it."""
    trace, service = make_trace(recs), ServiceModel({"score": score, "beam": beam})
    sim = world(8, 4096)
    sim = dataclasses.replace(sim, bounds=dataclasses.replace(sim.bounds, max_beam_width=max_beam_width,
                                                              max_beam_requests_per_batch=2))
    bound = clairvoyant_bound(problem_of(trace, sim, service)).served
    for name, knobs in POLICIES.items():
        assert bound >= served_in_time(trace, dataclasses.replace(sim, **knobs), service), name


def test_beam_requests_wider_than_the_bound_widen_the_bounds_batch():
    """max_beam_width 4, two requests a batch, delta 10 ms a batch: 8 beams at 0 ms (due 12), then
    16 and 16 beams at 1 and 2 ms (due 21, 21.5), which the simulator runs as one batch from 10 to
    20 ms. Counted against a batch of 2 x 4 beams, the two wide requests would each cost a whole
    batch and the bound would be 2."""
    trace = make_trace([
        TraceRecord(t_ms=0.0, route="generate", prompt_tokens=8, beam_width=8, max_new_tokens=4, deadline_ms=12.0),
        TraceRecord(t_ms=1.0, route="generate", prompt_tokens=8, beam_width=16, max_new_tokens=4, deadline_ms=20.0),
        TraceRecord(t_ms=2.0, route="generate", prompt_tokens=8, beam_width=16, max_new_tokens=4, deadline_ms=19.5)])
    service = ServiceModel({"beam": LatencyModel(0.0, 0.0, 0.0, 10.0)})
    sim = world(**POLICIES["edf_late_drop"])
    sim = dataclasses.replace(sim, bounds=dataclasses.replace(sim.bounds, max_beam_width=4,
                                                              max_beam_requests_per_batch=2))
    assert served_in_time(trace, sim, service) == 3
    assert clairvoyant_bound(problem_of(trace, sim, service)).served == 3


@SLOW
@given(model=models, recs=st.lists(records, min_size=1, max_size=30))
def test_bound_grows_with_capacity(model, recs):
    trace = make_trace(recs)
    one = clairvoyant_bound(problem_of(trace, world(8), ServiceModel({"score": model})))
    two = clairvoyant_bound(problem_of(trace, world(8, workers=2), ServiceModel({"score": model})))
    larger_batches = clairvoyant_bound(problem_of(trace, world(16), ServiceModel({"score": model})))
    faster = LatencyModel(*(0.5 * v for v in (model.alpha, model.beta, model.gamma, model.delta)))
    twice_as_fast = clairvoyant_bound(problem_of(trace, world(8), ServiceModel({"score": faster})))
    assert two.fluid_served >= one.fluid_served - 1e-9
    assert larger_batches.fluid_served >= one.fluid_served - 1e-9
    assert twice_as_fast.fluid_served >= one.fluid_served - 1e-9


@SLOW
@given(model=models, sizes=st.lists(st.lists(st.integers(1, 64), min_size=1, max_size=8), min_size=1, max_size=12))
def test_underloaded_trace_bound_is_every_request_and_the_policy_serves_them(model, sizes):
    """Requests a deadline apart, each deadline room for three times its batch alone: nothing can be
    lost, and the bound, the optimum and the policy all serve every one."""
    service = ServiceModel({"score": model})
    alone = [model.predict_ms(len(s), sum(s) / len(s)) for s in sizes]
    deadline = 3.0 * max(alone) + 1.0
    trace = make_trace(TraceRecord(t_ms=i * deadline, route="score", sample_tokens=tuple(s), deadline_ms=deadline)
                       for i, s in enumerate(sizes))
    problem = problem_of(trace, world(), service)
    assert clairvoyant_bound(problem).served == len(sizes)
    assert len(served_by(problem, edf_schedule(problem))) == len(sizes)
    assert served_in_time(trace, world(), service) == len(sizes)


def test_bound_counts_the_fixed_cost_shared_by_a_full_batch_and_shows_the_gap():
    """delta = 10 ms per batch, 2 samples a batch: four 1-sample requests due at 15 ms. Perfect
    batching costs each 5 ms, so the relaxation fits three in 15 ms; really a first batch of two
    ends at 10 ms and a second at 20 ms: two in time."""
    trace = make_trace(TraceRecord(t_ms=0.0, route="score", sample_tokens=(8,), deadline_ms=15.0) for _ in range(4))
    problem = problem_of(trace, world(2), ServiceModel({"score": LatencyModel(0.0, 0.0, 0.0, 10.0)}))
    bound = clairvoyant_bound(problem)
    assert (math.floor(bound.fluid_served + 1e-6), bound.shares) == (3, (1.0,))
    assert bound.by_class == {"15": pytest.approx(3.0)} and bound.offered_by_class == {"15": 4}
    assert exact_optimum(problem)[0] == 2
    assert bound.served == bound.exact == 2  # small enough to search: the bound is the optimum itself


def test_bound_refuses_a_request_no_batch_can_finish_in_its_window():
    """A 20 ms batch alone cannot meet a 15 ms deadline, however the fixed cost is shared."""
    trace = make_trace([TraceRecord(t_ms=0.0, route="score", sample_tokens=(8,), deadline_ms=15.0)])
    problem = problem_of(trace, world(16), ServiceModel({"score": LatencyModel(0.0, 0.0, 0.0, 20.0)}))
    assert clairvoyant_bound(problem).served == 0


def test_bound_per_class_sums_to_the_relaxation():
    trace = make_trace(TraceRecord(t_ms=float(i), route="score", sample_tokens=(30,) * 8,
                                   deadline_ms=(50.0, 100.0, 300.0)[i % 3]) for i in range(60))
    bound = clairvoyant_bound(problem_of(trace, world(), ServiceModel({"score": LatencyModel(0.0015, 0.004, 0, 12)})))
    assert sum(bound.by_class.values()) == pytest.approx(bound.fluid_served)
    assert set(bound.by_class) == {"50", "100", "300"} and bound.offered_by_class == {"50": 20, "100": 20, "300": 20}
    assert bound.served < 60  # overloaded: 60 requests of 8 samples in 60 ms need ~30 batches of 12 ms


@SLOW
@given(model=models, recs=st.lists(records, min_size=2, max_size=30), block=st.integers(1, 10),
       share=st.sampled_from([0.0, 0.5, 1.0]))
def test_bound_in_blocks_is_still_a_bound_and_never_below_the_whole(model, recs, block, share):
    """At one delta share, blocks bounded apart can only loosen the bound (each relaxes the whole)."""
    trace, service = make_trace(recs), ServiceModel({"score": model})
    problem = problem_of(trace, world(8), service)
    blocks = clairvoyant_bound(problem, (share,), block=block)
    assert blocks.fluid_served >= clairvoyant_bound(problem, (share,)).fluid_served - 1e-6
    assert clairvoyant_bound(problem, block=block).served >= served_in_time(trace, world(8), service)


def test_classes_named_by_the_caller_each_bounded_alone():
    """A caller's classes (here by size, as a priority would be): each class's bound is what it alone
    could get, at least what the policy serves of it."""
    trace = make_trace(TraceRecord(t_ms=float(i), route="score", sample_tokens=(30,) * (8 if i % 4 else 2),
                                   deadline_ms=40.0) for i in range(40))
    service = ServiceModel({"score": LatencyModel(0.0015, 0.004, 0, 12)})
    problem = problem_of(trace, world(), service, klass=lambda record, _: f"{len(record.sample_tokens)}-samples")
    alone = class_bounds(problem)
    policy = Counter(f"{len(rec.sample_tokens)}-samples" for r, rec in zip(Simulator(world(), service).run(trace),
                                                                             trace.records)
                     if r.outcome == "ok" and r.latency_ms <= rec.deadline_ms)
    assert set(alone) == {"2-samples", "8-samples"}
    assert all(alone[c] >= policy[c] for c in alone)
    assert sum(alone.values()) >= clairvoyant_bound(problem).served


def test_negative_coefficient_refused_by_name():
    with pytest.raises(ValueError, match="beta"):
        BatchLimits(LatencyModel(0.0, -1.0, 0.0, 1.0), 16, max_tokens=4096)


def test_exact_optimum_refuses_what_it_cannot_count():
    service = ServiceModel({"score": LatencyModel(0.0, 0.0, 0.0, 1.0)})
    split = make_trace([TraceRecord(t_ms=0.0, route="score", sample_tokens=(8,) * 4, deadline_ms=15.0)])
    with pytest.raises(ValueError, match="one job each"):
        exact_optimum(problem_of(split, world(2), service))
    many = make_trace(TraceRecord(t_ms=0.0, route="score", sample_tokens=(8,), deadline_ms=15.0) for _ in range(13))
    with pytest.raises(ValueError, match="at most 12 jobs"):
        exact_optimum(problem_of(many, world(), service))


def test_served_by_refuses_a_batch_before_its_member_arrives():
    trace = make_trace([TraceRecord(t_ms=5.0, route="score", sample_tokens=(8,), deadline_ms=15.0)])
    problem = problem_of(trace, world(), ServiceModel({"score": LatencyModel(0.0, 0.0, 0.0, 1.0)}))
    with pytest.raises(ValueError, match="before request 0 arrives"):
        served_by(problem, [Batch(0.0, ((0, 0),))])
    assert served_by(problem, [Batch(5.0, ((0, 0),))]) == {0}


def test_cli_prints_one_json_line_per_load_and_class(tmp_path, capsys):
    path = tmp_path / "trace.jsonl"
    write_trace(make_trace(TraceRecord(t_ms=2.0 * i, route="score", sample_tokens=(60,) * 8,
                                       deadline_ms=(50.0, 300.0)[i % 2]) for i in range(40)), path)
    assert main(["bound", "--trace", str(path), "--latency-model", "0.0015,0.004,0,12", "--loads", "1,2"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(line["loads"]) == {"1x", "2x"}
    for load in line["loads"].values():
        assert set(load["by_class"]) == {"50", "300"}
        assert all(0 <= c["bound_alone"] <= c["offered"] for c in load["by_class"].values())
        assert load["bound_served"] <= load["offered"] == 40
        assert sum(c["served"] for c in load["by_class"].values()) == pytest.approx(load["fluid_served"], abs=0.01)


def test_cli_names_a_negative_latency_model_coefficient(tmp_path, capsys):
    path = tmp_path / "trace.jsonl"
    write_trace(make_trace([TraceRecord(t_ms=0.0, route="score", sample_tokens=(8,)),
                            TraceRecord(t_ms=1.0, route="score", sample_tokens=(8,))]), path)
    assert main(["bound", "--trace", str(path), "--latency-model", "0,-1,0,1"]) == 2
    assert "beta" in capsys.readouterr().err


def test_cli_refuses_a_trace_that_cannot_be_sent_at_a_load(tmp_path, capsys):
    path = tmp_path / "trace.jsonl"
    write_trace(make_trace([TraceRecord(t_ms=0.0, route="score", sample_tokens=(8,))]), path)
    assert main(["bound", "--trace", str(path), "--latency-model", "0,0,0,1"]) == 2
    assert "at least two requests at different times" in capsys.readouterr().err
