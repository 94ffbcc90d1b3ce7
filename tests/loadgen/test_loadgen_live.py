"""Live tuning (a gateway process per candidate, here the stub) and the command line end to end."""

import json
import socket
import sys
import tomllib
from pathlib import Path

from loadgen.__main__ import main
from loadgen.bodies import BodyFactory
from loadgen.live import LiveEvaluator, LiveOptions, candidate_config
from loadgen.replayer import ReplayOptions
from loadgen.synth import SynthSpec, synthesize
from loadgen.trace import write_trace
from loadgen.tuner import grid, tune
from shared.config import parse_config

ROOT = Path(__file__).resolve().parents[2]
STUB = Path(__file__).resolve().parent / "stub_gateway.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_candidate_config_is_a_valid_deployment_config():
    text = candidate_config(str(ROOT / "configs" / "demo.toml"), "http://127.0.0.1:8123",
                            {"max_batch_wait_ms": 3, "score_deadline_ms": 70.4, "max_queue_tokens": 1000.0})
    config = parse_config(tomllib.loads(text))
    assert config.gateway.port == 8123 and config.gateway.max_batch_wait_ms == 3.0
    assert config.gateway.score_deadline_ms == 70 and config.gateway.max_queue_tokens == 1000
    assert config.bounds.max_beam_width == 128                      # the rest of the base is kept


def test_live_tuning_restarts_the_gateway_per_candidate_and_picks_the_best(tmp_path):
    # The stub adds max_batch_wait_ms to every answer: with an SLO of 100 ms only wait 0 meets it.
    url = f"http://127.0.0.1:{_free_port()}"
    trace = synthesize(SynthSpec(arrivals="uniform", rate_rps=40, duration_s=0.5, samples=1, tokens_per_sample=4))
    live = LiveOptions(command_template=f"{sys.executable} {STUB} --config {{config}} --service-ms 2",
                       base_config=str(ROOT / "configs" / "demo.toml"), url=url, startup_timeout_s=30, warmup_s=0.1,
                       log_dir=str(tmp_path))
    evaluate = LiveEvaluator(trace, BodyFactory(), live, ReplayOptions(url=url, progress=False))
    result = tune(grid({"max_batch_wait_ms": [150.0, 0.0]}), evaluate, slo_ms=100.0)
    assert evaluate.runs == 2
    slow, fast = result.candidates
    assert fast.outcomes == {"ok": 20}
    # slow answers queue in the one-at-a-time stub; past the default deadline (200 ms) it answers 504
    assert slow.outcomes["ok"] >= 1 and set(slow.outcomes) <= {"ok", "deadline_exceeded"}
    assert slow.latency_pct_ms >= 150.0 and not slow.meets_slo
    assert result.best_candidate().knobs == {"max_batch_wait_ms": 0.0}


def test_cli_synth_replay_sweep_and_tune_offline(tmp_path, capsys):
    trace_path = tmp_path / "t.jsonl"
    assert main(["synth", "--out", str(trace_path), "--arrivals", "gamma", "--cv", "2", "--rate", "300",
                 "--duration-s", "5", "--samples", "4", "--tokens-per-sample", "50", "--score-fraction", "0.8",
                 "--prompt-tokens", "30", "--beam-width", "8"]) == 0
    model = tmp_path / "lm.json"
    model.write_text(json.dumps({"score": {"alpha": 0.0, "beta": 0.01, "gamma": 0.2, "delta": 2.0},
                                 "beam": {"alpha": 0.0002, "beta": 0.0, "gamma": 0.05, "delta": 3.0}}))
    out = tmp_path / "tune.json"
    code = main(["tune", "--trace", str(trace_path), "--slo-ms", "40", "--offline", "--latency-model", str(model),
                 "--config", str(ROOT / "configs" / "demo.toml"), "--grid", "max_batch_wait_ms=0,2",
                 "--grid", "score_deadline_ms=20,40", "--capacity", "--max-workers", "4", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "[gateway]" in printed and "Kingman" in printed
    saved = json.loads(out.read_text())
    assert len(saved["candidates"]) == 4 and saved["best"] is not None
    assert main(["sweep", "--trace", str(trace_path), "--slo-ms", "40", "--rates", "100,300,3000", "--offline",
                 "--latency-model", str(model), "--out-dir", str(tmp_path / "sweep")]) == 0
    rows = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["rows"]
    assert [r["target_rps"] for r in rows] == [100.0, 300.0, 3000.0]
    assert (tmp_path / "sweep" / "goodput_vs_offered.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_errors_are_clear(tmp_path, capsys):
    assert main(["tune", "--trace", str(tmp_path / "missing.jsonl"), "--slo-ms", "10", "--offline"]) == 2
    assert "trace file not found" in capsys.readouterr().err
    trace_path = tmp_path / "t.jsonl"
    write_trace(synthesize(SynthSpec(duration_s=1)), trace_path)
    assert main(["tune", "--trace", str(trace_path), "--slo-ms", "10", "--offline"]) == 2
    assert "--latency-model" in capsys.readouterr().err
    assert main(["tune", "--trace", str(trace_path), "--slo-ms", "10", "--grid", "bogus=1"]) == 2
    assert "not a setting" in capsys.readouterr().err


def test_cli_replay_writes_report_against_a_stub_process(tmp_path, capsys):
    import asyncio
    import subprocess

    from loadgen.live import stop, wait_ready

    port = _free_port()
    config = tmp_path / "stub.toml"
    config.write_text(f'[gateway]\nhost = "127.0.0.1"\nport = {port}\n')
    process = subprocess.Popen([sys.executable, str(STUB), "--config", str(config), "--service-ms", "3"],
                               start_new_session=True)
    try:
        asyncio.run(wait_ready(f"http://127.0.0.1:{port}", 30, process))
        trace_path = tmp_path / "t.jsonl"
        write_trace(synthesize(SynthSpec(arrivals="uniform", rate_rps=50, duration_s=0.4, samples=2)), trace_path)
        out_dir = tmp_path / "report"
        assert main(["replay", "--trace", str(trace_path), "--url", f"http://127.0.0.1:{port}", "--slo-ms", "50",
                     "--out-dir", str(out_dir), "--no-progress", "--deadline-ms", "5000"]) == 0
    finally:
        stop(process, 10)
    report = json.loads((out_dir / "report.json").read_text())
    assert report["routes"]["score"]["sent"] == 20 and report["routes"]["score"]["ok"] == 20
    assert report["stages"]["from_metrics"]["all"]["worker"]["count"] == 20
    assert {p.name for p in out_dir.glob("*.png")} == {"latency_cdf.png", "latency_over_time.png",
                                                       "throughput_over_time.png", "outcomes_over_time.png"}
    assert "score" in capsys.readouterr().out


def test_a_gateway_command_that_dies_is_reported_with_its_output():
    import pytest

    url = f"http://127.0.0.1:{_free_port()}"
    live = LiveOptions(command_template=f"{sys.executable} -c \"print('boom: bad config'); raise SystemExit(3)\"",
                       url=url, startup_timeout_s=20)
    trace = synthesize(SynthSpec(arrivals="uniform", rate_rps=10, duration_s=0.2, samples=1))
    evaluate = LiveEvaluator(trace, BodyFactory(), live, ReplayOptions(url=url, progress=False))
    with pytest.raises(RuntimeError, match=r"(?s)exited with status 3.*boom: bad config"):
        evaluate({"max_batch_wait_ms": 1.0})
    with pytest.raises(ValueError, match="only change \\[gateway\\] settings"):
        evaluate({"workers": 2})


def test_toml_writer_round_trips_nested_tables():
    from loadgen.live import to_toml

    data = {"name": "x", "score": {"enabled": True, "mlp_head": {"weights": 'a "b".safetensors',
                                                              "layer_sizes": [64, 2]}},
            "worker": {"endpoints": ["ipc:///tmp/w0"], "cpu_threads": 2}, "gateway": {"max_batch_wait_ms": 1.5}}
    assert tomllib.loads(to_toml(data)) == data
