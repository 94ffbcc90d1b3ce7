"""bench/harness/provenance.py, the one writer of benchmark results: a result whose parity failed is never
written; every result says the threads each side used and the load while it was measured. What the
documents show of the committed results is checked by tests/bench/test_report.py."""

from __future__ import annotations

import json
import time

import pytest

from bench.harness import provenance
from bench.harness.provenance import LoadSampler, ParityFailed, timed_part, write_result

CHECKS_OK = [{"check": "ours_vs_reference", "max_abs_diff": 1e-5, "ok": True}]
CHECKS_FAILED = [*CHECKS_OK, {"check": "theirs_vs_reference", "max_abs_diff": 3.9, "ok": False}]


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "RESULTS", tmp_path)
    return tmp_path


def test_a_result_whose_parity_failed_is_printed_and_never_written(results, capsys):
    with pytest.raises(ParityFailed) as stopped:
        write_result("score_node-x", {"speedup": 2.0, "parity": CHECKS_FAILED}, quick=False, threads=2)
    assert stopped.value.code != 0 and "theirs_vs_reference" in str(stopped.value.code)
    assert not (results / "score_node-x.json").exists()
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["speedup"] == 2.0  # the figures stay readable


def test_a_failed_parity_leaves_the_last_good_result_in_place(results):
    write_result("beam_node-x", {"speedup": 1.5, "parity": CHECKS_OK}, quick=False, threads=2)
    before = (results / "beam_node-x.json").read_text()
    for failed in ({"speedup": 9.0, "parity": CHECKS_FAILED}, {"speedup": 9.0, "parity_ok": False}):
        with pytest.raises(ParityFailed):
            write_result("beam_node-x", failed, quick=False, threads=2)
    assert (results / "beam_node-x.json").read_text() == before


def test_a_result_records_the_threads_of_each_side_and_the_load_sampled_while_it_ran(results):
    threads = {"ours": 2, "hf_best": 2, "ct2": 2}
    with timed_part() as sampler:
        end = time.monotonic() + 30
        while len(sampler.load_1m) < 2:  # the sampler's first tick (each second)
            assert time.monotonic() < end, "the load sampler never ticked"
            time.sleep(0.05)
    path = write_result("timed", {"parity": CHECKS_OK}, quick=True, threads=threads)
    run = json.loads(path.read_text())["run"]
    assert run["threads"] == threads
    load = run["load"]
    assert load["over"] == "timed part" and load["samples"] >= 3  # start, a tick, stop
    assert load["load_average_1m"]["min"] <= load["load_average_1m"]["median"] <= load["load_average_1m"]["max"]
    assert load["process_cpu_cores"]["min"] >= 0.0


def test_the_sampler_samples_from_start_to_stop_on_its_own_thread():
    sampler = LoadSampler(interval_s=0.1).start()
    assert sampler.running
    end = time.monotonic() + 30
    while len(sampler.load_1m) < 4:  # start, then one per interval
        assert time.monotonic() < end
        time.sleep(0.02)
    sampler.stop()
    summary = sampler.summary("x")
    assert summary["samples"] == len(sampler.load_1m) >= 5  # the last one taken at stop
    assert len(sampler.process_cores) >= summary["samples"] - 2  # one per interval of more than 50 ms
    assert not sampler.running

