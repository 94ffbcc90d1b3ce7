"""Live tuning and the command line against the real gateway (`python -m gateway`), before a stand-in
worker on a thread that speaks the real protocol; and the TOML the tuner writes."""

import asyncio
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from loadgen.__main__ import main
from loadgen.bodies import BodyFactory
from loadgen.live import LiveEvaluator, LiveOptions, candidate_config, wait_ready
from loadgen.processes import stop
from loadgen.replayer import ReplayOptions
from loadgen.processes import free_port
from loadgen.synth import SynthSpec, synthesize
from loadgen.trace import write_trace
from loadgen.tuner import grid, recommended_config, tune
from shared.config import parse_config
from shared.latency_correction import VERIFIED_AFTER
from tests.loadgen.conftest import deployment_toml

ROOT = Path(__file__).resolve().parents[2]


def _gateway_cmd(artifacts: Path) -> str:
    return f"{sys.executable} -m gateway --config {{config}} --artifacts {artifacts}"


def test_candidate_config_is_a_valid_deployment_config():
    text = candidate_config(str(ROOT / "configs" / "demo.toml"), "http://127.0.0.1:8123",
                            {"max_batch_wait_ms": 3, "score_deadline_ms": 70.4, "max_queue_tokens": 1000.0})
    config = parse_config(tomllib.loads(text))
    assert config.gateway.port == 8123 and config.gateway.max_batch_wait_ms == 3.0
    assert config.gateway.score_deadline_ms == 70 and config.gateway.max_queue_tokens == 1000
    assert config.bounds.max_beam_width == 128                      # the rest of the base is kept


def test_a_prompt_template_with_newlines_and_quotes_survives_the_writer(tmp_path):
    base = tmp_path / "base.toml"
    base.write_text('[score]\nprompt_template = "Query: \\"{query}\\"\\nItem:\\t{text}\\n\\\\ end"\n'
                    '[gateway]\nport = 9000\n')
    text = recommended_config(base, {"score_deadline_ms": 55, "max_samples_per_batch": 8})
    config = parse_config(tomllib.loads(text))
    assert config.score.prompt_template == 'Query: "{query}"\nItem:\t{text}\n\\ end'
    assert config.gateway.score_deadline_ms == 55 and config.bounds.max_samples_per_batch == 8
    candidate = parse_config(tomllib.loads(candidate_config(str(base), "http://127.0.0.1:8124", {})))
    assert candidate.score.prompt_template == config.score.prompt_template and candidate.gateway.port == 8124


def test_a_recommendation_the_config_refuses_is_an_error_naming_the_field(tmp_path):
    base = tmp_path / "base.toml"
    base.write_text("[gateway]\nport = 9000\n")
    with pytest.raises(ValueError, match="max_queue_tokens"):
        recommended_config(base, {"max_queue_tokens": 0})


def test_live_tuning_restarts_the_real_gateway_per_candidate(tmp_path, standin, standin_artifacts):
    # A 1 ms default deadline cannot be met by a worker taking 5 ms: only the start-up probes are
    # answered; with 500 ms every request is. The SLO (a generous 1 s) is met by both; goodput decides.
    url = f"http://127.0.0.1:{free_port()}"
    base = deployment_toml(tmp_path, standin.endpoint)
    trace = synthesize(SynthSpec(arrivals="uniform", rate_rps=40, duration_s=0.5, samples=2, tokens_per_sample=4))
    live = LiveOptions(command_template=_gateway_cmd(standin_artifacts), base_config=str(base), url=url,
                       startup_timeout_s=60, warmup_s=0.1, log_dir=str(tmp_path))
    evaluate = LiveEvaluator(trace, BodyFactory(), live, ReplayOptions(url=url, progress=False))
    result = tune(grid({"score_deadline_ms": [1, 500]}), evaluate, slo_ms=1000.0)
    assert evaluate.runs == 2
    tight, relaxed = result.candidates
    assert relaxed.outcomes == {"ok": 20}
    # refused at admission (unmeetable) or, where parsing and tokenizing alone outlast 1 ms (a slower CPU: 11 of 20
    # on an AVX2 machine), found past the deadline first (exceeded); either way not served, but for the probes that
    # confirm the start-up profile (at most VERIFIED_AFTER, each on an idle worker: answered when it is quick enough)
    refused = tight.outcomes.get("deadline_unmeetable", 0) + tight.outcomes.get("deadline_exceeded", 0)
    assert refused >= 20 - VERIFIED_AFTER, tight.outcomes
    assert set(tight.outcomes) <= {"ok", "deadline_unmeetable", "deadline_exceeded"}
    assert result.best_candidate().knobs == {"score_deadline_ms": 500}


def test_cli_synth_tune_offline_writes_a_loadable_config_and_sweeps(tmp_path, capsys):
    trace_path = tmp_path / "t.jsonl"
    assert main(["synth", "--out", str(trace_path), "--arrivals", "gamma", "--cv", "2", "--rate", "300",
                 "--duration-s", "5", "--samples", "4", "--tokens-per-sample", "50", "--score-fraction", "0.8",
                 "--prompt-tokens", "30", "--beam-width", "8"]) == 0
    model = tmp_path / "lm.json"
    model.write_text(json.dumps({"score": {"alpha": 0.0, "beta": 0.01, "gamma": 0.2, "delta": 2.0},
                                 "beam": {"alpha": 0.0002, "beta": 0.0, "gamma": 0.05, "delta": 3.0}}))
    out, written = tmp_path / "tune.json", tmp_path / "tuned.toml"
    # an SLO with room above the 40 ms deadline candidates: admission admits up to the deadline, so
    # the tail of answers sits near it (the check is the CLI's plumbing, not a latency figure)
    code = main(["tune", "--trace", str(trace_path), "--slo-ms", "50", "--offline", "--latency-model", str(model),
                 "--config", str(ROOT / "configs" / "demo.toml"), "--grid", "max_batch_wait_ms=0,2",
                 "--grid", "score_deadline_ms=20,40", "--capacity", "--max-workers", "4", "--out", str(out),
                 "--write-config", str(written)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "[gateway]" in printed and "Kingman" in printed
    saved = json.loads(out.read_text())
    assert len(saved["candidates"]) == 4 and saved["best"] is not None
    config = parse_config(tomllib.loads(written.read_text()))
    assert config.gateway.score_deadline_ms == saved["best"]["score_deadline_ms"]
    assert config.gateway.max_batch_wait_ms == saved["best"]["max_batch_wait_ms"]
    assert config.name == "demo"                                    # the rest of the base config is kept
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


def test_cli_replay_writes_a_report_against_the_real_gateway(tmp_path, capsys, standin, standin_artifacts):
    port = free_port()
    config = deployment_toml(tmp_path, standin.endpoint, port=port)
    process = subprocess.Popen([sys.executable, "-m", "gateway", "--config", str(config), "--artifacts",
                                str(standin_artifacts)], cwd=ROOT, start_new_session=True)
    try:
        asyncio.run(wait_ready(f"http://127.0.0.1:{port}", 60, (process,)))
        trace_path = tmp_path / "t.jsonl"
        write_trace(synthesize(SynthSpec(arrivals="uniform", rate_rps=50, duration_s=0.4, samples=2)), trace_path)
        out_dir = tmp_path / "report"
        assert main(["replay", "--trace", str(trace_path), "--url", f"http://127.0.0.1:{port}", "--slo-ms", "1000",
                     "--out-dir", str(out_dir), "--no-progress", "--deadline-ms", "5000"]) == 0
    finally:
        stop(process, 10)
    report = json.loads((out_dir / "report.json").read_text())
    assert report["routes"]["score"]["sent"] == 20 and report["routes"]["score"]["ok"] == 20
    assert report["stages"]["from_metrics"]["all"]["total"]["count"] == 20
    assert report["stages"]["from_metrics"]["all"]["worker"]["count"] >= 1
    assert {p.name for p in out_dir.glob("*.png")} == {"latency_cdf.png", "latency_over_time.png",
                                                       "throughput_over_time.png", "outcomes_over_time.png"}
    assert "score" in capsys.readouterr().out


def test_a_gateway_command_that_dies_is_reported_with_its_output():
    url = f"http://127.0.0.1:{free_port()}"
    live = LiveOptions(command_template=f"{sys.executable} -c \"print('boom: bad config'); raise SystemExit(3)\"",
                       url=url, startup_timeout_s=20)
    trace = synthesize(SynthSpec(arrivals="uniform", rate_rps=10, duration_s=0.2, samples=1))
    evaluate = LiveEvaluator(trace, BodyFactory(), live, ReplayOptions(url=url, progress=False))
    with pytest.raises(RuntimeError, match=r"(?s)exited with status 3.*boom: bad config"):
        evaluate({"max_batch_wait_ms": 1.0})
    with pytest.raises(ValueError, match="only change \\[gateway\\] settings"):
        evaluate({"workers": 2})
