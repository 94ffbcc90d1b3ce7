"""Report arithmetic on known inputs: percentiles, throughput, goodput, attainment, lag, stages."""

import math

import numpy as np
import pytest

from loadgen.prometheus import bucket_quantile, parse, stage_breakdown
from loadgen.result import RequestResult
from loadgen.stats import percentile, percentile_interval, sender_summary, summarize, timeseries
from loadgen.sweep import measure


def _result(i, route, scheduled, latency, outcome="ok", lag=0.0):
    return RequestResult(i, route, scheduled, sent_ms=scheduled + lag, done_ms=scheduled + latency,
                         status=200 if outcome == "ok" else 503, outcome=outcome)


def test_percentiles_match_linear_interpolation():
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 90) == pytest.approx(4.6)
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 5.0
    assert percentile([], 99) is None
    rng = np.random.default_rng(0)
    data = list(rng.exponential(10.0, 1001))
    for q in (50, 90, 99, 99.9):
        assert percentile(data, q) == pytest.approx(float(np.percentile(data, q)))


def test_goodput_attainment_and_outcomes_on_known_inputs():
    # 10 score requests over 9 s of schedule (one per second): 6 ok (latencies 10..60 ms),
    # 2 deadline_unmeetable, 1 queue_full, 1 deadline_exceeded. SLO 35 ms.
    results = [_result(i, "score", 1000.0 * i, 10.0 * (i + 1)) for i in range(6)]
    results += [_result(6, "score", 6000.0, 1.0, "deadline_unmeetable"),
                _result(7, "score", 7000.0, 1.0, "deadline_unmeetable"),
                _result(8, "score", 8000.0, 1.0, "queue_full"),
                _result(9, "score", 9000.0, 100.0, "deadline_exceeded")]
    report = summarize(results, slo_ms=35.0)
    s = report["routes"]["score"]
    assert report["window_s"] == 9.0
    assert s["sent"] == 10 and s["ok"] == 6
    assert s["outcomes"] == {"deadline_exceeded": 1, "deadline_unmeetable": 2, "ok": 6, "queue_full": 1}
    assert s["throughput_rps"] == pytest.approx(6 / 9)
    assert s["within_slo"] == 3                                   # 10, 20, 30 ms
    assert s["goodput_rps"] == pytest.approx(3 / 9)
    assert s["slo_attainment"] == pytest.approx(0.3)
    assert s["latency_ms"]["p50"] == pytest.approx(35.0)          # over successes only
    assert s["latency_ms"]["mean"] == pytest.approx(35.0)
    assert s["latency_ms"]["max"] == 60.0
    assert report["routes"]["all"]["sent"] == 10


def test_routes_are_separate_and_all_combines_them():
    results = [_result(0, "score", 0.0, 5.0), _result(1, "generate", 1000.0, 50.0),
               _result(2, "generate", 2000.0, 70.0)]
    report = summarize(results, slo_ms=60.0)
    assert report["routes"]["generate"]["within_slo"] == 1
    assert report["routes"]["score"]["within_slo"] == 1
    assert report["routes"]["all"]["within_slo"] == 2
    assert report["routes"]["all"]["goodput_rps"] == pytest.approx(1.0)


def test_sender_lag_and_saturation_flag():
    calm = [_result(i, "score", 10.0 * i, 5.0, lag=0.2) for i in range(100)]
    assert not sender_summary(calm)["saturated"] and sender_summary(calm)["late_sends"] == 0
    behind = [_result(i, "score", 10.0 * i, 5.0, lag=float(i)) for i in range(100)]
    summary = sender_summary(behind)
    assert summary["saturated"] and summary["late_sends"] == 98 and summary["lag_ms"]["max"] == 99.0


def test_timeseries_bins_by_scheduled_send_and_counts_completions_when_done():
    results = [_result(0, "score", 100.0, 10.0), _result(1, "score", 900.0, 200.0),
               _result(2, "score", 1500.0, 1.0, "queue_full")]
    bins = timeseries(results, bin_s=1.0)
    assert [b["sent"] for b in bins] == [2, 1]
    assert [b["completed_ok"] for b in bins] == [1, 1]
    assert bins[1]["outcomes"] == {"queue_full": 1}
    assert bins[0]["p50_ms"] == pytest.approx(105.0)


def test_sweep_measure_counts_rejections_as_misses():
    results = [_result(i, "score", 10.0 * i, 5.0) for i in range(98)]
    results += [_result(98, "score", 980.0, 1.0, "queue_full"), _result(99, "score", 990.0, 1.0, "queue_full")]
    row = measure(results, 100.0, slo_ms=10.0, pct=99.0)
    assert row["latency_pct_ms"] == 5.0 and row["attainment"] == pytest.approx(0.98)
    assert not row["meets_slo"]
    assert measure(results, 100.0, slo_ms=10.0, pct=98.0)["meets_slo"]


METRICS_BEFORE = """# HELP x
boundserve_stage_latency_seconds_bucket{stage="queue",le="0.001"} 1
boundserve_stage_latency_seconds_bucket{stage="queue",le="0.01"} 2
boundserve_stage_latency_seconds_bucket{stage="queue",le="+Inf"} 2
boundserve_stage_latency_seconds_sum{stage="queue"} 0.006
boundserve_stage_latency_seconds_count{stage="queue"} 2
"""
METRICS_AFTER = """garbage line that does not parse {
boundserve_stage_latency_seconds_bucket{stage="queue",le="0.001"} 1
boundserve_stage_latency_seconds_bucket{stage="queue",le="0.01"} 12
boundserve_stage_latency_seconds_bucket{stage="queue",le="+Inf"} 12
boundserve_stage_latency_seconds_sum{stage="queue"} 0.056
boundserve_stage_latency_seconds_count{stage="queue"} 12
boundserve_stage_latency_seconds_count{stage="worker"} nan-ish
"""


def test_stage_breakdown_diffs_histograms_between_scrapes():
    stages = stage_breakdown(METRICS_BEFORE, METRICS_AFTER)["all"]
    queue = stages["queue"]
    assert queue["count"] == 10
    assert queue["mean_ms"] == pytest.approx(5.0)
    # all 10 new observations fall in (1 ms, 10 ms]: the median interpolates to 5.5 ms
    assert queue["p50_ms"] == pytest.approx(5.5)
    assert "worker" not in stages
    assert stage_breakdown(None, None) == {} and stage_breakdown("", "nonsense") == {}


def test_bucket_quantile_and_label_parsing():
    assert bucket_quantile(0.5, {1.0: 0.0, 2.0: 10.0, math.inf: 10.0}) == pytest.approx(1.5)
    assert bucket_quantile(0.99, {1.0: 0.0, math.inf: 5.0}) == 1.0
    assert bucket_quantile(0.5, {}) is None
    name, labels, value = parse('m{a="x\\"y",route="score"} 3 1700000000')[0]
    assert (name, labels, value) == ("m", {"a": 'x"y', "route": "score"}, 3.0)


def test_percentile_interval_brackets_the_estimate_and_narrows_with_more_answers():
    few = [float(i) for i in range(100)]
    many = [float(i % 100) for i in range(10_000)]
    low, high = percentile_interval(few, 99.0)
    assert low <= percentile(few, 99.0) <= high and high <= max(few)
    many_low, many_high = percentile_interval(many, 99.0)
    assert many_high - many_low < high - low
    assert percentile_interval([], 99.0) is None and percentile_interval([5.0], 99.0) == (5.0, 5.0)
