"""Tuning that is applied as tuned: a deadline tuned offline (the simulator, with the workers'
measured model) is written as a deployment config, and a fresh stack serves exactly that config.

What the test asserts holds on a machine of any speed and load: the simulator's choice, given the
calibration (a pure function of it: the tuned deadline meets the SLO in simulation, the longest
does not, most requests succeed); the config written carries the tuned settings and loads as a
deployment config; the stack started from it answers every request of a replay well-formed (a
success, or a drop the policy names), none lost and none hung. Whether the tuned deadline also
meets its SLO live is a timing on a shared machine (the client, the gateway and its workers on the
same two cores), so it is measured, with its load, by bench/tune_applied.py, not asserted here.
"""

import tomllib
from pathlib import Path

import pytest

from loadgen.calibrate import capacity_rps
from loadgen.commands import OFFLINE_HEADROOM
from loadgen.replayer import ReplayOptions, run_replay
from loadgen.simulator import SimSettings, simulate
from loadgen.stack import LocalStack
from loadgen.sweep import at_rate
from loadgen.synth import SynthSpec, synthesize
from loadgen.tuner import grid, recommended_config, tune
from loadgen.validate import calibrate_stack, stack_bodies, with_overheads
from shared.config import load_config
from shared.policy import DROP_CODES

SLO_MS = 300.0
"""The SLO's room for the gateway's queue and its workers, beyond the overhead the calibration measured
outside them (HTTP, JSON, the client's own loop): a loaded machine measured close to a second of that,
and an absolute SLO would then leave no deadline to choose from."""
QUEUE_S = 2.0
DEADLINES_MS = [80, 150, 400, 800]
pytestmark = pytest.mark.slow  # the compiled demo artifacts, and real worker processes


def _traffic(seed: int, rate_rps: float, seconds: float):
    spec = SynthSpec(arrivals="gamma", cv=2.0, rate_rps=10, duration_s=300, samples=8, tokens_per_sample=64,
                     seed=seed)
    return at_rate(synthesize(spec), rate_rps).window(0.0, seconds * 1000.0)


def _tokens_per_request(trace) -> float:
    return sum(sum(r.sample_tokens) for r in trace.records) / len(trace.records)


def test_an_offline_recommendation_is_written_and_served_as_tuned(heavy_deployment, tmp_path):
    base, artifacts = heavy_deployment
    settings = SimSettings.from_config(load_config(base))
    bodies = stack_bodies(artifacts)
    with LocalStack(base, artifacts, tmp_path / "calibration") as stack:
        profile, calibration, _, _ = calibrate_stack(stack, _traffic(1, 10, 300), settings, bodies, requests=150)
    world = with_overheads(settings, calibration)
    capacity = capacity_rps(_traffic(1, 10, 300), world, calibration.model)
    # A queue that holds QUEUE_S of work at the measured capacity: the 800 ms deadline then really
    # lets answers wait past the SLO, so the tuning has a choice to make whatever the machine's speed.
    queue = {"max_queue_tokens": int(QUEUE_S * capacity * _tokens_per_request(_traffic(1, 10, 300)))}
    world = world.with_knobs(queue)
    tuning = _traffic(1, 1.2 * capacity, 6.0)
    # within the offline headroom, SLO_MS for what the tuned deadline governs, past the measured overhead
    slo_ms = SLO_MS + calibration.request_overhead_ms / OFFLINE_HEADROOM
    result = tune(grid({"score_deadline_ms": DEADLINES_MS}),
                  lambda knobs: simulate(tuning, world.with_knobs(knobs), calibration.model, profile), slo_ms=slo_ms,
                  headroom=OFFLINE_HEADROOM)
    best = result.best_candidate()
    measured = calibration.to_json()
    assert best is not None, (measured, result.candidates)
    assert not result.candidates[-1].meets_slo, (measured, result.candidates)  # answers up to 800 ms late
    assert best.outcomes.get("ok", 0) > 0.5 * sum(best.outcomes.values()), best  # most succeed, simulated

    config = tmp_path / "tuned.toml"
    config.write_text(recommended_config(base, {**best.knobs, **queue}))
    tuned = load_config(config)
    assert tuned.gateway.score_deadline_ms == best.knobs["score_deadline_ms"]
    assert tuned.gateway.max_queue_tokens == queue["max_queue_tokens"]
    assert tomllib.loads(config.read_text())["bounds"] == tomllib.loads(Path(base).read_text())["bounds"]

    with LocalStack(config, artifacts, tmp_path / "applied") as stack:
        served = tomllib.loads(stack.config_path.read_text())["gateway"]
        run = run_replay(_traffic(2, 0.5 * capacity, 4.0), bodies, ReplayOptions(url=stack.url, progress=False))
    assert served["score_deadline_ms"] == best.knobs["score_deadline_ms"]
    outcomes = {r.outcome for r in run.results}
    assert outcomes <= {"ok", *DROP_CODES.values()}, outcomes  # no lost, hung or malformed answer
    assert "ok" in outcomes, outcomes
