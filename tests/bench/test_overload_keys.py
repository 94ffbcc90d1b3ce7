"""bench/overload.py's one JSON line, assembled from real inputs: the committed trace's windows, run by
the simulator (the gateway's own scheduler) in the replay's world as the "live" windows and summarised
by the live window code (bench/harness/overload_window.py), the replay of those windows
(bench/harness/overload_keys.py) and a two-replica summary (bench/harness/overload_pair.py).

A --quick run of the benchmark itself takes minutes (worker profiling, a capacity sweep): too long for
the suite on a small machine; its assembly is what is tested here. Where "live" ran in the replay's own
world, the replay must agree with it exactly: a different window drawn, or a policy's settings
crossed, shows as a relative error above 0. The gateway's body-to-answer histogram of a window is the
gateway's own (gateway/metrics.py), fed the simulator's send-to-answer times and read back from its
text page as a live window reads it.
"""

from __future__ import annotations

import argparse
import bisect
import math

from bench.harness import overload_keys, overload_load, overload_summary
from bench.harness.overload_pair import summarize as pair_summary
from bench.harness.overload_policies import POLICIES
from bench.harness.overload_window import COUNTERS, EXPIRED, REFUSED, read, summarize
from bench.overload import live_windows
from gateway.metrics import BODY_TO_ANSWER_BUCKETS_S, Metrics
from loadgen.result import RequestResult
from loadgen.service import ServiceModel
from loadgen.simulator import Simulator
from loadgen.trace import Trace
from shared.latency_model import LatencyModel

SERVICE = ServiceModel({"score": LatencyModel(0.0015, 0.004, 0.0, 12.0)})
CAPACITY_RPS, BUDGET = 45.0, 6000
ISSUE_KEYS = ("admission_over_bound", "admission_over_edf_late_drop", "time_to_refusal_ms_p99",
              "pair_retry_over_edf_late_drop", "priority_high_share", "worker_idle_share_at_2x",
              "wasted_compute_share", "replay_vs_live_max_rel_err")


def _simulated(trace: Trace, policy: str, measured: dict | None = None) -> tuple[list[RequestResult], Simulator]:
    """The window through the simulator in the replay's world (`measured`: settings in place of the world's)."""
    simulator = Simulator(overload_keys.replay_world(policy, BUDGET, measured), SERVICE)
    results = simulator.run(trace)
    for result in results:  # the simulator has one clock: its send to answer is the try's time
        result.try_ms = result.done_ms - result.sent_ms
    return results, simulator


def _histograms(results: list[RequestResult]) -> dict:
    """The body-to-answer histograms of a gateway's page after it answered `results` (send = body read)."""
    metrics = Metrics()
    for result in results:
        if result.outcome in (*REFUSED, EXPIRED):
            metrics.observe_body_to_answer(result.outcome, 503, result.try_ms / 1000.0)
    return read(metrics.render().decode())["body_to_answer"]


def _window(trace: Trace, policy: str, measured: dict | None = None) -> dict:
    """A "live" window: simulated, and its costs outside the model as a window measures them: the loop's cost per
    request split between the gateway's CPU counter and the client's CPU, a batch's service time outside compute,
    the worker's CPU (its compute and its own time per batch), and the batches its log names (`computed`)."""
    world = overload_keys.replay_world(policy, BUDGET, measured)
    results, simulator = _simulated(trace, policy, measured)
    compute_s, batches = sum(simulator.compute_ms.values()) / 1000.0, len(simulator.computed)
    span_s = max(r.t_ms for r in trace.records) / 1000.0
    start = {key: 0.0 for key in COUNTERS} | {"lateness_ms": 0.0, "loop_lag_ms": 0.0, "queue_jobs": 0.0,
                                               "body_to_answer": _histograms([])}
    core_s = world.gateway_ms_per_request * len(results) / 1000.0
    end = start | {"compute_s": compute_s, "batches": float(batches), "fill_sum": float(batches),
                   "body_to_answer": _histograms(results), "gateway_cpu_s": 0.6 * core_s,
                   "service_s": compute_s + batches * world.batch_overhead_ms / 1000.0}
    worker_cpu_s = compute_s + batches * world.worker_ms_per_batch / 1000.0
    window = summarize(trace, results, [(0.0, 0.0, start), (span_s, worker_cpu_s, end)], client_cpu_s=0.4 * core_s)
    window["computed"] = {"batches": batches, "items": sum(b for b, _, _ in simulator.computed),
                          "tokens": sum(b * l for b, l, _ in simulator.computed),
                          "tokens_per_item": sum(l for _, l, _ in simulator.computed),
                          "compute_ms": sum(t for _, _, t in simulator.computed)}
    return window


def test_the_json_line_has_the_issues_keys_and_the_replay_agrees_with_a_run_in_its_own_world():
    workload = overload_load.trace(overload_load.TRACE, 2, 60, (50.0, 100.0, 300.0))
    args = argparse.Namespace(window_s=10.0, windows=2)
    traces = {f"{load:g}x": live_windows(workload, args, CAPACITY_RPS, load) for load in (1.0, 2.0)}
    windows = {p: {load: [_window(t, p) for t in ts] for load, ts in traces.items()} for p in POLICIES}
    figures = overload_summary.table(windows)
    replay = overload_keys.replayed(traces, SERVICE, list(POLICIES), BUDGET)
    pair = {p: [pair_summary(t, _simulated(t, p)[0]) for t in traces["2x"]] for p in ("admission", "edf_late_drop")}
    keys = overload_keys.keys(figures, windows, replay, pair, overload_summary.ratios(figures, CAPACITY_RPS))

    assert set(ISSUE_KEYS) <= set(keys)
    assert keys["replay_vs_live_max_rel_err"] == {**{p: 0.0 for p in POLICIES}, "max": 0.0}
    assert set(keys["admission_over_bound"]) == {"1x", "2x"} == set(keys["admission_over_edf_late_drop"])
    assert all(0.0 < ratio <= 1.0 for ratio in keys["admission_over_bound"].values())
    assert keys["admission_over_bound"] == keys["admission_over_bound_live"]   # the same runs, the same bound
    refused = sum(w["refused"] for rows in windows["admission"].values() for w in rows)
    assert refused > 0 and keys["time_to_refusal_ms"]["refused"]["admission"]["count"] == refused
    assert keys["time_to_refusal_client_ms"]["refused"]["admission"]["count"] == refused
    expired = sum(w["outcomes"].get(EXPIRED, 0) for rows in windows["edf_late_drop"].values() for w in rows)
    assert expired > 0 and keys["time_to_refusal_ms"]["answered_504"]["edf_late_drop"]["count"] == expired
    for what, policy in (("refused", "admission"), ("answered_504", "edf_late_drop")):  # the same times, both
        gateway = keys["time_to_refusal_ms"][what][policy]["p99"]  # sides: the client's in the gateway's bucket
        assert _bucket_ms(keys["time_to_refusal_client_ms"][what][policy]["p99"]) == _bucket_ms(gateway), what
    assert keys["time_to_refusal_ms_p99"] == keys["time_to_refusal_ms"]["refused"]["admission"]["p99"]
    assert keys["time_to_refusal_client_ms_p99"] == keys["time_to_refusal_client_ms"]["refused"]["admission"]["p99"]
    assert keys["pair_retry_over_edf_late_drop"] == round(
        keys["pair_goodput_rps"]["admission"] / keys["pair_goodput_rps"]["edf_late_drop"], 3)
    assert len(keys["worker_idle_share_at_2x"]) == 2 and 0.0 < keys["priority_high_share"]


def _bucket_ms(ms: float) -> tuple[float, float]:
    """The (lower, upper] bucket of the body-to-answer histogram that `ms` falls in, in ms."""
    bounds = [0.0, *(1000.0 * b for b in BODY_TO_ANSWER_BUCKETS_S), math.inf]
    k = max(1, bisect.bisect_left(bounds, ms))
    return bounds[k - 1], bounds[k]


def test_live_windows_are_replayed_in_the_world_they_measured():
    """"Live" windows in which each arrival kept the gateway's loop busy 3 ms (the CPU a request cost the core the
    gateway and the client share), each batch spent 4 ms outside its compute and the worker 0.7 ms of its own CPU
    beyond it, measured as a window measures them: the replay in the world they measured agrees with them
    exactly; the replay's own world does not."""
    rig = {"gateway_ms_per_request": 3.0, "batch_overhead_ms": 4.0, "worker_ms_per_batch": 0.7}
    traces, windows = _rig_windows(rig)
    measured = overload_keys.measured_world(windows)
    assert measured == {"1x": rig, "2x": rig}
    figures = overload_summary.table(windows)
    replay = overload_keys.replayed(traces, SERVICE, list(windows), BUDGET, measured)
    keys = overload_keys.keys(figures, windows, replay, None, overload_summary.ratios(figures, CAPACITY_RPS))
    assert keys["replay_vs_live_max_rel_err"]["max"] == 0.0
    assert keys["replay_vs_live_max_rel_err_free_loop"]["max"] > 0.0
    assert keys["replay_vs_live_world"] == measured
    older = {"admission": {"1x": [{"in_time": 1, "batch_overhead_ms": 2.0}]}}  # a window without the client's CPU
    assert overload_keys.measured_world(older) == {"1x": {"batch_overhead_ms": 2.0}}


def test_a_worker_slower_than_its_fitted_model_is_measured_and_replayed_at_its_speed():
    """"Live" windows on a worker that computes 1.3x the model it fitted: the batches its log names, over the
    model's prediction of them, give that factor (within the replay world's own jitter, which live carries too),
    and the replay at it comes close to live where the replay at the fitted model's speed does not."""
    rig = {"gateway_ms_per_request": 1.0, "batch_overhead_ms": 1.0, "worker_ms_per_batch": 0.0, "compute_factor": 1.3}
    traces, windows = _rig_windows(rig)
    measured = overload_keys.measured_world(windows, SERVICE)
    assert all(abs(world["compute_factor"] / 1.3 - 1.0) < 0.05 for world in measured.values())
    assert overload_keys.measured_world(windows)["1x"].keys() == measured["1x"].keys() - {"compute_factor"}
    figures = overload_summary.table(windows)
    ratios = overload_summary.ratios(figures, CAPACITY_RPS)
    at_speed = overload_keys.keys(figures, windows, overload_keys.replayed(traces, SERVICE, list(windows), BUDGET,
                                                                           measured), None, ratios)
    unscaled = {load: {k: v for k, v in world.items() if k != "compute_factor"} for load, world in measured.items()}
    at_model = overload_keys.keys(figures, windows, overload_keys.replayed(traces, SERVICE, list(windows), BUDGET,
                                                                           unscaled), None, ratios)
    assert at_speed["replay_vs_live_max_rel_err"]["max"] < 0.05
    assert at_model["replay_vs_live_max_rel_err"]["max"] > 0.1


def test_policies_that_schedule_alike_give_the_rigs_noise_on_one_deadline_class_only():
    assert overload_keys.same_schedule(list(POLICIES), 1) == [("edf_late_drop", "fcfs_late_drop")]
    assert overload_keys.same_schedule(list(POLICIES), 3) == []
    assert overload_keys.same_schedule(["admission", "edf_bounded", "edf_expiry"], 1) == []


def _rig_windows(rig: dict) -> tuple[dict[str, list[Trace]], dict[str, dict[str, list[dict]]]]:
    workload = overload_load.trace(overload_load.TRACE, 2, 60, (50.0, 100.0, 300.0))
    args = argparse.Namespace(window_s=10.0, windows=2)
    traces = {f"{load:g}x": live_windows(workload, args, CAPACITY_RPS, load) for load in (1.0, 2.0)}
    windows = {p: {load: [_window(t, p, rig) for t in ts] for load, ts in traces.items()}
               for p in ("admission", "edf_late_drop")}
    return traces, windows
