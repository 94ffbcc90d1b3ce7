"""Does an offline recommendation meet its SLO live? The deadline tuned by the simulator, applied.

On the tiny demo model compiled with 1024-token batches (configs/test.toml, `HEAVY_BOUNDS`): a local
stack (`python -m gateway --spawn-workers`) is calibrated (loadgen validate's calibration: the
workers' compute model as measured now, its jitter, the overheads); the simulator tunes
`score_deadline_ms` over DEADLINES_MS at 1.2x the capacity it predicts, with a queue holding
QUEUE_S of work (so the longest deadline really lets answers wait past the SLO); the recommendation
is written as a deployment config (loadgen.tuner.recommended_config), served by a fresh stack and
replayed open loop with fresh traffic of the same kind. Reported: the live p99 of successes against
the SLO and the simulator's, the share of requests answered with success, and the client's lag (a
replay whose client fell behind by more than half the SLO is taken again, with new traffic).

tests/loadgen/test_loadgen_tune_applied.py asserts what holds on a machine of any load (the
recommendation is written and served as tuned, every request answered well-formed); this is the
timing, which needs a quiet machine to mean anything.

    .venv/bin/python bench/tune_applied.py [--artifacts DIR --config TOML] [--quick]

Prints one JSON object as its last line and writes it to bench/results/tune_applied.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from bench.harness.provenance import ROOT, timed_part, write_result
from loadgen.calibrate import capacity_rps
from loadgen.commands import OFFLINE_HEADROOM
from loadgen.replayer import ReplayOptions, run_replay
from loadgen.simulator import SimSettings, simulate
from loadgen.stack import LocalStack
from loadgen.stats import percentile, sender_summary
from loadgen.sweep import at_rate
from loadgen.synth import SynthSpec, synthesize
from loadgen.tuner import config_toml, grid, recommended_config, tune
from loadgen.validate import calibrate_stack, stack_bodies, with_overheads
from shared.config import load_config

SLO_MS = 300.0
QUEUE_S = 2.0
LOAD = 1.2
DEADLINES_MS = [80, 150, 400, 800]
HEAVY_BOUNDS = {"max_samples_per_batch": 16, "max_tokens_per_sample": 128, "max_tokens_per_batch": 1024}
"""Batches of up to 1024 tokens: a few tens of requests per second fill the tiny model, so the client
keeps up with the load on a small machine."""


def traffic(seed: int, rate_rps: float, seconds: float):
    spec = SynthSpec(arrivals="gamma", cv=2.0, rate_rps=10, duration_s=300, samples=8, tokens_per_sample=64,
                     seed=seed)
    return at_rate(synthesize(spec), rate_rps).window(0.0, seconds * 1000.0)


def heavy_config(checkpoint: Path, folder: Path) -> Path:
    """folder/heavy.toml: configs/test.toml with HEAVY_BOUNDS, its model `checkpoint` (also the
    live checks' deployment in tests/loadgen)."""
    raw = tomllib.loads((ROOT / "configs" / "test.toml").read_text())
    raw["bounds"] = {**raw["bounds"], **HEAVY_BOUNDS}
    raw["model"] = {**raw["model"], "path": str(checkpoint)}
    config = folder / "heavy.toml"
    config.write_text(config_toml(raw))
    return config


def heavy_deployment(folder: Path) -> tuple[Path, Path]:
    """(config, artifacts): heavy_config for the demo model (`make demo-model`), compiled for it (the
    build is skipped when up to date)."""
    from compile.build import build

    checkpoint = ROOT / "models" / "demo"
    if not (checkpoint / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "compile.demo", "--out", str(checkpoint)], cwd=ROOT, check=True)
    config = heavy_config(checkpoint, folder)
    artifacts = ROOT / "bench" / ".cache" / "artifacts" / "tune-applied-heavy"
    build(load_config(config), artifacts)
    return config, artifacts


def live_replay(stack: LocalStack, bodies, rate_rps: float, seconds: float, attempts: int = 3):
    """A replay whose client kept within half the SLO of its schedule (else again, with new traffic):
    the run, how many were taken again, and whether the last one's client kept up."""
    for retaken in range(attempts):
        run = run_replay(traffic(2 + retaken, rate_rps, seconds), bodies, ReplayOptions(url=stack.url, progress=False))
        if sender_summary(run.results)["lag_ms"]["p99"] <= 0.5 * SLO_MS:
            return run, retaken, True
    return run, attempts - 1, False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="deployment config (default: configs/test.toml with HEAVY_BOUNDS)")
    parser.add_argument("--artifacts", help="artifacts compiled for --config (default: built here, cached)")
    parser.add_argument("--seconds", type=float, help="live replay length (default 6, quick 3)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    seconds = args.seconds or (3.0 if args.quick else 6.0)
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as scratch:
        folder = Path(scratch)
        base, artifacts = ((Path(args.config), Path(args.artifacts)) if args.config else heavy_deployment(folder))
        settings = SimSettings.from_config(load_config(base))
        worker_threads = load_config(base).worker.cpu_threads
        bodies = stack_bodies(artifacts)
        with LocalStack(base, artifacts, folder / "calibration") as stack:
            profile, calibration, _, _ = calibrate_stack(stack, traffic(1, 10, 300), settings, bodies, requests=150)
        world = with_overheads(settings, calibration)
        capacity = capacity_rps(traffic(1, 10, 300), world, calibration.model)
        sample = traffic(1, 10, 300)
        tokens = sum(sum(r.sample_tokens) for r in sample.records) / len(sample.records)
        queue = {"max_queue_tokens": int(QUEUE_S * capacity * tokens)}
        world = world.with_knobs(queue)
        tuned = tune(grid({"score_deadline_ms": DEADLINES_MS}),
                     lambda knobs: simulate(traffic(1, LOAD * capacity, seconds), world.with_knobs(knobs),
                                            calibration.model, profile), slo_ms=SLO_MS, headroom=OFFLINE_HEADROOM)
        best = tuned.best_candidate()
        if best is None:
            raise SystemExit(f"no deadline met the SLO in simulation: {[c.row() for c in tuned.candidates]}")
        config = folder / "tuned.toml"
        config.write_text(recommended_config(base, {**best.knobs, **queue}))
        with LocalStack(config, artifacts, folder / "applied") as stack, timed_part():
            run, retaken, kept_up = live_replay(stack, bodies, LOAD * capacity, seconds)
    ok = [r.done_ms - r.sent_ms for r in run.results if r.outcome == "ok"]  # from the actual send
    p99 = percentile(ok, 99.0)
    result = {
        "bench": "tune_applied", "slo_ms": SLO_MS, "load_x_capacity": LOAD, "capacity_rps": round(capacity, 1),
        "tuned": {**best.knobs, **queue}, "candidates": [c.row() for c in tuned.candidates],
        "live_p99_ms": p99, "sim_p99_ms": best.latency_pct_ms,
        "live_meets_slo": p99 is not None and p99 <= SLO_MS,
        "live_ok_share": round(len(ok) / len(run.results), 3),
        "sim_ok_share": round(best.outcomes.get("ok", 0) / max(1, sum(best.outcomes.values())), 3),
        "live_outcomes": {o: sum(r.outcome == o for r in run.results) for o in {r.outcome for r in run.results}},
        "sender": sender_summary(run.results), "replays_retaken": retaken, "client_kept_up": kept_up,
        "seconds": seconds,
        "bounds": HEAVY_BOUNDS if not args.config else None,
    }
    write_result("tune_applied" + ("-quick" if args.quick else ""), result, quick=args.quick,
                 threads={"worker": worker_threads, "gateway_event_loop": 1})


if __name__ == "__main__":
    main()
