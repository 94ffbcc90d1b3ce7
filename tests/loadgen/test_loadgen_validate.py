"""`loadgen validate` end to end at small scale: it starts a real worker behind the real gateway,
replays a trace live at three load levels and again through the simulator, and reports both with their
relative error, every request accounted for on each side.

How close the simulator comes is a measurement, not a behaviour: it depends on the machine's load while
the live levels run, so it is reported (bench/overload.py's `replay_vs_live_max_rel_err`) and never
asserted here. The model is compute-bound (tests/loadgen/conftest.py, COMPUTE_BOUND), so the client and
the gateway stay light next to the compute, as in a deployment."""

import json

import pytest

from loadgen.__main__ import main
from loadgen.synth import SynthSpec, synthesize
from loadgen.trace import write_trace
from shared.events import BatchDone, read_events
from shared.policy import DROP_CODES

pytestmark = pytest.mark.slow  # the compiled demo artifacts, and a real worker process


def test_validate_replays_each_level_live_and_simulated(compute_bound_deployment, tmp_path, capsys):
    config, artifacts = compute_bound_deployment
    trace_path, out = tmp_path / "t.jsonl", tmp_path / "validate"
    # goodput counts every success (within 1 s, past any deadline the config allows): near an SLO as
    # tight as the deadline it would count answers a hair either side of it, a cliff, not an error
    write_trace(synthesize(SynthSpec(arrivals="gamma", cv=3.0, rate_rps=100, duration_s=200, samples=8,
                                     tokens_per_sample=64, seed=5)), trace_path)
    assert main(["validate", "--trace", str(trace_path), "--config", str(config),
                 "--artifacts", str(artifacts), "--levels", "0.5,1,2", "--duration-s", "3",
                 "--calibration-requests", "120", "--slo-ms", "1000", "--out-dir", str(out)]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [level["load"] for level in last["levels"]] == [0.5, 1.0, 2.0]
    for level in last["levels"]:
        for key in ("live_goodput_rps", "sim_goodput_rps", "live_p99_ms", "sim_p99_ms"):
            assert isinstance(level[key], float), (key, level)
    assert isinstance(last["max_rel_err"], float)
    assert last["max_rel_err"] == max(max(lv["goodput_rel_err"], lv["p99_rel_err"]) for lv in last["levels"])
    summary = json.loads((out / "validate.json").read_text())
    offered = [row["offered_rps"] for row in summary["levels"]]
    assert offered == sorted(offered) and offered[-1] > 3 * offered[0]
    for row in summary["levels"]:  # the same requests both ways, every one accounted for
        assert sum(row["live_outcomes"].values()) == sum(row["sim_outcomes"].values()) > 0
        assert set(row["live_drops"]) <= set(DROP_CODES) and set(row["sim_drops"]) <= set(DROP_CODES)
        folder = out / f"level-{row['load']:g}"
        live, sim = (folder / "live.jsonl").read_text(), (folder / "sim.jsonl").read_text()
        assert len(live.splitlines()) == len(sim.splitlines()) == sum(row["live_outcomes"].values())
    assert summary["calibration"]["batches"] > 0 and "score" in summary["calibration"]["model"]
    for row in summary["levels"]:  # the speed each level was simulated at, measured on its own batches
        assert row["measured"]["batches"] > 0 and "score" in row["measured"]["model"]
        assert isinstance(row["calibration_sim_goodput_rps"], float)
    page = (out / "index.html").read_text()
    assert "Levels" in page and page.count("data:image/png;base64,") == 3
    assert read_events(out / "stack.log", BatchDone)
