"""Offline simulator, tuner, sweep and capacity estimate on servers whose answers are known."""

import statistics

import msgspec
import pytest

from loadgen.capacity import capacity_report, kingman_latency_ms, kingman_wait_ms, workload_facts
from loadgen.service import load_service_model
from shared.events import Profiled, ProfileRefitted
from loadgen.sim_world import Jitter, Speed
from loadgen.simulator import SimSettings, Simulator, simulate
from loadgen.sweep import sweep
from loadgen.synth import SynthSpec, synthesize
from loadgen.trace import TraceRecord, make_trace
from loadgen.tuner import config_snippet, grid, tune

SIMPLE = dict(max_batch_wait_ms=0.0, admission_margin_ms=0.0, max_inflight_batches=1)


def _batch_cost(route, batch_size, tokens):
    """6 ms per call plus 1 ms per sample: batching pays."""
    return 6.0 + 1.0 * batch_size


def test_simulator_matches_pollaczek_khinchine_for_md1():
    # Poisson arrivals, deterministic 5 ms service, one request per batch: M/D/1, whose mean wait
    # is exactly rho/(1-rho) * tau/2 (Kingman with c_a = 1, c_s = 0 is exact here).
    trace = synthesize(SynthSpec(arrivals="poisson", rate_rps=160, duration_s=200, samples=1, seed=3))
    settings = SimSettings(**SIMPLE, score_deadline_ms=1e12, max_queue_tokens=2**62).with_knobs(
        {"max_samples_per_batch": 1})
    results = simulate(trace, settings, lambda route, b, l: 5.0 * b)
    waits = [r.latency_ms - 5.0 for r in results]
    assert all(r.outcome == "ok" for r in results)
    assert statistics.fmean(waits) == pytest.approx(kingman_wait_ms(0.8, 1.0, 0.0, 5.0), rel=0.1)


def test_simulator_policy_invariants():
    trace = synthesize(SynthSpec(arrivals="bursts", rate_rps=1500, burst_size=10, duration_s=2,
                                 samples=3, tokens_per_sample=20, seed=1))
    settings = SimSettings(score_deadline_ms=30.0, admission_margin_ms=0.0, max_inflight_batches=1).with_knobs(
        {"max_samples_per_batch": 16, "max_tokens_per_batch": 4096})
    results = simulate(trace, settings, _batch_cost)
    outcomes = {r.outcome for r in results}
    assert outcomes <= {"ok", "deadline_unmeetable", "deadline_exceeded", "queue_full"}
    assert {"ok", "deadline_unmeetable"} <= outcomes
    assert all(r.latency_ms <= 30.0 + 1e-6 for r in results)    # one batch in flight: exact predictions
    tight = simulate(trace, settings.with_knobs({"max_queue_tokens": 200}), _batch_cost)
    assert any(r.outcome == "queue_full" for r in tight)


def test_simulator_counts_each_requests_share_of_compute_and_each_batchs_fill():
    """The first request of 4 samples goes alone (10 ms); the two that come while it computes go
    together (8 samples, 14 ms): each took half of that batch's compute, and it was half full."""
    records = [TraceRecord(t_ms=t, route="score", sample_tokens=(10,) * 4) for t in (0.0, 1.0, 2.0)]
    settings = SimSettings(**SIMPLE, score_deadline_ms=1000.0).with_knobs({"max_samples_per_batch": 16})
    sim = Simulator(settings, _batch_cost)
    results = sim.run(make_trace(records))
    assert all(r.outcome == "ok" for r in results)
    assert sim.batch_fill == [0.25, 0.5]
    assert sim.compute_ms == {0: 10.0, 1: 7.0, 2: 7.0}


def test_tuner_finds_the_known_best_default_deadline():
    # Periodic arrivals at 800/s of one-sample requests; a batch of B costs 6 + B ms, so a worker
    # serves at most 16/22 ms = 727/s and only with full batches. The SLO is p99 <= 40 ms.
    #   deadline 5:   even one request alone (7 ms) cannot finish -> only the gateway's start-up
    #                 probes are served (admitted while no measured batch confirmed the profile)
    #   deadline 20:  queues stay short, batches small -> lower throughput
    #   deadline 35:  full batches, every answer within 35 ms <= SLO -> the best
    #   deadline 80+: answers up to 80 ms -> p99 over the SLO
    trace = synthesize(SynthSpec(arrivals="uniform", rate_rps=800, duration_s=3, samples=1, tokens_per_sample=10))
    base = SimSettings(**SIMPLE)
    candidates = grid({"score_deadline_ms": [5, 20, 35, 80, 300], "admission_margin_ms": [0.0, 4.0]})
    result = tune(candidates, lambda knobs: simulate(trace, base.with_knobs(knobs), _batch_cost), slo_ms=40.0)
    best = result.best_candidate()
    assert best.knobs == {"score_deadline_ms": 35, "admission_margin_ms": 0.0}
    by_knobs = {tuple(c.knobs.values()): c for c in result.candidates}
    assert by_knobs[(5, 0.0)].outcomes == {"deadline_unmeetable": 2397, "ok": 3}
    assert not by_knobs[(80, 0.0)].meets_slo and not by_knobs[(300, 0.0)].meets_slo
    assert by_knobs[(20, 0.0)].goodput_rps < best.goodput_rps
    assert best.goodput_rps > 600.0
    snippet = config_snippet(best.knobs)
    assert "[gateway]\nscore_deadline_ms = 35\nadmission_margin_ms = 0.0" in snippet


def test_tuner_reports_no_recommendation_when_nothing_meets_the_slo():
    trace = synthesize(SynthSpec(arrivals="uniform", rate_rps=100, duration_s=1, samples=1))
    result = tune([{"score_deadline_ms": 100}], lambda k: simulate(trace, SimSettings(**k), _batch_cost), slo_ms=1.0)
    assert result.best is None and result.best_candidate() is None


def test_offline_sweep_finds_the_capacity_of_a_known_server():
    # One request per batch at 10 ms each: the server sustains 100/s; with deterministic arrivals
    # every rate below 100/s is served within 10 ms, every rate above it piles up or is shed.
    trace = synthesize(SynthSpec(arrivals="uniform", rate_rps=10, duration_s=5, samples=1))
    settings = SimSettings(**SIMPLE, max_batch_requests=1, score_deadline_ms=1000.0)
    evaluate = lambda t: simulate(t, settings, lambda route, b, l: 10.0)  # noqa: E731
    result = sweep(trace, [50, 90, 150, 200], evaluate, slo_ms=15.0, pct=99.0, refine_steps=4)
    assert result.best_rps is not None and 90.0 <= result.best_rps < 110.0
    assert [r["meets_slo"] for r in result.rows][:2] == [True, True]
    assert not result.rows[-1]["meets_slo"]


def test_kingman_numbers_and_capacity_cross_check():
    assert kingman_wait_ms(0.5, 1.0, 1.0, 10.0) == pytest.approx(10.0)   # M/M/1: rho/(1-rho) * tau
    assert kingman_wait_ms(1.0, 1.0, 0.0, 10.0) == float("inf")
    # 6 s: one unbatched worker at rho 1.5 lets the queue grow without bound, and each arrival's admission
    # walks it, so the search's first simulation costs the square of the trace (30 s took 95 s of the suite)
    trace = synthesize(SynthSpec(arrivals="poisson", rate_rps=300, duration_s=6, samples=1, seed=4))
    service = load_service_model("0,0,0,5")                                  # 5 ms per request
    facts = workload_facts(trace, service)
    assert facts.tau_ms == 5.0 and facts.cs == 0.0 and facts.ca == pytest.approx(1.0, abs=0.05)
    assert kingman_latency_ms(facts, 1)["rho"] == pytest.approx(1.5, rel=0.05)
    report = capacity_report(trace, service, SimSettings(max_inflight_batches=1, score_deadline_ms=50.0),
                             slo_ms=30.0, max_workers=8)
    # 300/s at 5 ms needs 1.5 workers of pure work: 2 at least, Kingman within one of the simulator
    assert report["kingman_workers"] >= 2 and report["simulated_unbatched_workers"] >= 2
    assert abs(report["kingman_workers"] - report["simulated_unbatched_workers"]) <= 1
    assert report["simulated_batched_workers"] <= report["simulated_unbatched_workers"]


def test_large_requests_run_alone_split_into_batches():
    record = TraceRecord(t_ms=0.0, route="score", sample_tokens=(10,) * 40)
    results = simulate(make_trace([record]), SimSettings(**SIMPLE).with_knobs({"max_samples_per_batch": 16}),
                       _batch_cost)
    # 40 samples -> 3 batches of 40/3 samples: 3 * (6 + 13.33) ms
    assert results[0].outcome == "ok" and results[0].latency_ms == pytest.approx(58.0)


def test_service_model_loads_worker_style_json(tmp_path):
    path = tmp_path / "lm.json"
    path.write_text('{"latency_models": {"score": {"alpha": 0, "beta": 0.1, "gamma": 1, "delta": 2},'
                    ' "beam": {"alpha": 0.001, "beta": 0, "gamma": 0, "delta": 5}}}')
    model = load_service_model(str(path))
    assert model("score", 4, 10) == pytest.approx(0.1 * 10 + 4 + 2)
    assert model("generate", 100, 50) == pytest.approx(0.001 * 100 * 50 + 5)
    with pytest.raises(ValueError, match="4 numbers"):
        load_service_model("1,2,3")


def test_service_model_from_a_worker_log(tmp_path):
    log = tmp_path / "gateway.log"
    first = Profiled(workload="score", points=6, rmse_ms=0.1, alpha=0.1, beta=0, gamma=0, delta=1)
    last = ProfileRefitted(workload="score", points=6, rmse_ms=0.1, alpha=0.0, beta=0, gamma=2, delta=1)
    log.write_bytes(b"boundserve gateway listening\n" + msgspec.json.encode(first) + b"\n"
                    + b'{"level":"info","event":"loaded","workload":"score","alpha":5}\n'  # not a profile event
                    + b"[worker 0] " + msgspec.json.encode(last) + b"\n")
    model = load_service_model(str(log))
    assert model("score", 3, 100) == pytest.approx(7.0)            # the last profile wins
    with pytest.raises(ValueError, match="no latency model for route 'generate'"):
        model("generate", 1, 1)


def test_without_predictions_requests_wait_in_deadline_order_and_expire_in_the_queue():
    # Twice what one worker serves, 30 ms deadlines, no early refusal and no predicted-late drops:
    # nothing is refused, what waits past its deadline is answered 504, and what was sent just in
    # time is answered late.
    trace = synthesize(SynthSpec(arrivals="uniform", rate_rps=1000, duration_s=1, samples=1, tokens_per_sample=10))
    settings = SimSettings(**SIMPLE, admission=False, drop_predicted_late=False,
                           score_deadline_ms=30.0).with_knobs({"max_samples_per_batch": 4})
    simulator = Simulator(settings, _batch_cost)
    results = simulator.run(trace)
    assert {r.outcome for r in results} == {"ok", "deadline_exceeded"}
    assert set(simulator.drops) <= {"expired_in_queue", "expired_in_worker"} and simulator.drops["expired_in_queue"]
    assert max(r.latency_ms for r in results if r.outcome == "ok") > 30.0


def test_a_partial_batch_waits_while_its_worker_is_busy_longer_than_max_batch_wait():
    # Request 0 keeps the worker busy for 7 ms; 1 arrives at 1 ms and 2 at 5 ms. With no lead time
    # request 1 waits in the gateway for companions and goes with 2; with 20 ms it goes at once.
    records = [TraceRecord(t_ms=t, route="score", sample_tokens=(10,)) for t in (0.0, 1.0, 5.0)]
    base = SimSettings(admission_margin_ms=0.0, max_inflight_batches=2)
    held = simulate(make_trace(records), base.with_knobs({"max_batch_wait_ms": 0.0}), _batch_cost)
    assert held[1].done_ms == held[2].done_ms == pytest.approx(7.0 + 8.0)
    eager = simulate(make_trace(records), base.with_knobs({"max_batch_wait_ms": 20.0}), _batch_cost)
    assert eager[1].done_ms == pytest.approx(14.0) and eager[2].done_ms == pytest.approx(21.0)


def test_the_workers_compute_at_the_speed_of_the_period_a_batch_is_sent_in():
    # The same one-sample request at 0 ms and at 2,000 ms; from 1 s on the workers take three times
    # as long (a segment measured slower live), while the gateway's predictions start from one profile.
    records = [TraceRecord(t_ms=t, route="score", sample_tokens=(10,)) for t in (0.0, 2000.0)]

    def slow(route, batch, tokens):
        return 3.0 * _batch_cost(route, batch, tokens)

    speeds = [Speed(0.0, _batch_cost, Jitter((), 0)), Speed(1.0, slow, Jitter((), 0))]
    results = Simulator(SimSettings(score_deadline_ms=1000.0), _batch_cost, speeds=speeds).run(make_trace(records))
    assert [r.outcome for r in results] == ["ok", "ok"]
    assert results[1].latency_ms == pytest.approx(3.0 * results[0].latency_ms)


def test_jitter_in_order_replays_the_measured_factors_one_batch_after_another():
    # Measured: 1x, then a slow spell of two batches at 3x, then 1x; the fifth batch starts over.
    jitter = Jitter((1.0, 3.0, 3.0, 1.0), seed=0, in_order=True)
    assert [jitter.draw() for _ in range(5)] == [1.0, 3.0, 3.0, 1.0, 1.0]
    assert Jitter((1.0, 3.0), seed=0).draw() in (1.0, 3.0)  # not in order: a seeded random draw
