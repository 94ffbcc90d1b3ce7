"""The overload issue's summary keys of one run: live windows, the two replicas, and the replay.

The replay is bench/overload_replay.py's machinery (the simulator driving the gateway's own
scheduler, in that file's world, and the clairvoyant bound of loadgen/bound.py) on the very windows
the live run sent, with the latency model the live worker fitted (its last profile event). Keys:
  admission_over_bound           replay: admission's in-time answers over the bound, per load, and by
                                 class (over the bound of each class alone); `_live` beside it: the
                                 live in-time answers over that same bound (a bound of the model's
                                 world, not of the machine's: a ratio, not a proof)
  admission_over_edf_late_drop   live: median goodput over median goodput, per load (and by class)
  time_to_refusal_ms_p99         live: admission's refusals, every load and window together, from the
                                 body read to the answer written, as the gateway measured it (its
                                 histogram, interpolated in the buckets as histogram_quantile does);
                                 every policy's refusals and 504s beside it (`time_to_refusal_ms`), and
                                 the same from the client's send to its answer (`_client` keys: an
                                 upper bound, with the client's write, read and CPU waits in it)
  pair_retry_over_edf_late_drop  live, two replicas with retries (bench/harness/overload_pair.py): the
                                 pair's median goodput at 2x, admission over edf_late_drop
  priority_high_share            replay at 2x (overload_replay.priority_row)
  worker_idle_share_at_2x        live: per window of admission at 2x, 1 - the worker's busy share;
                                 the replay's beside it
  wasted_compute_share           live: per policy at 2x (overload_summary's), admission's by load beside
  replay_vs_live_max_rel_err     per policy, the largest over loads of |replay - live| / live in-time
                                 answers (summed over the windows); `max` over the policies. The replay
                                 it compares is run in the world the live windows measured
                                 (`replay_vs_live_world`, per load): on the bench's pinning the gateway
                                 and the client share one core, so each arrival keeps the gateway's loop
                                 busy for what a request cost that core, each batch is delayed by its
                                 service time outside its compute (the message path), keeps the worker
                                 busy for the worker's own CPU beyond its compute, and computes at the
                                 speed the worker measured against the fitted model (`compute_factor`);
                                 `_free_loop` beside it: against overload_replay's own world (the world
                                 of the bound and the ratios)
  live_same_schedule_rel_diff    live: for two policies that make every decision alike (one deadline
                                 class, differing only in queue order), how far apart their in-time
                                 answers are per load: the rig's noise, the least error a replay can show
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from typing import Any

from bench.harness.overload_policies import POLICIES
from bench.harness.overload_window import EXPIRED, REFUSED, predicted_ms
from bench.overload_replay import priority_row, replay, world
from bench.overload_replay import load_row as replay_load_row
from loadgen.prometheus import bucket_quantile
from loadgen.service import ServiceModel
from loadgen.simulator import SimSettings
from loadgen.stats import percentile
from loadgen.trace import Trace

ADMISSION, EDF_LATE_DROP, BOUNDED = "admission", "edf_late_drop", "edf_bounded"


def replayed(traces: dict[str, list[Trace]], service: ServiceModel, policies: list[str], token_budget: int,
             measured: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    """Per load: overload_replay's row (bound, ratios, idle, waste) and every policy's in-time answers;
    at 2x, the priority row. `measured` (load -> world settings, `measured_world`): the costs outside the
    model that the live windows measured; every policy's in-time answers are replayed in overload_replay's
    world with those settings (`in_time_by_policy`, what live is compared with) and without them
    (`in_time_by_policy_free_loop`, the world the bound and the ratios above are computed in)."""
    out: dict[str, Any] = {"loads": {}}
    for load, windows in traces.items():
        row = replay_load_row(windows, service)
        settings = (measured or {}).get(load) or {}
        row["measured_world"] = settings
        row["in_time_by_policy"] = {p: sum(_in_time(t, p, service, token_budget, settings) for t in windows)
                                    for p in policies}
        row["in_time_by_policy_free_loop"] = (row["in_time_by_policy"] if not settings else
                                              {p: sum(_in_time(t, p, service, token_budget) for t in windows)
                                               for p in policies})
        out["loads"][load] = row
    if "2x" in traces:
        out["priority_at_2x"] = priority_row(traces["2x"], service)
    return out


def replay_world(policy: str, token_budget: int, measured: dict[str, float] | None = None) -> SimSettings:
    """overload_replay's world for `policy`, the bounded queue with the token budget the live run sized;
    `measured`: simulator settings that replace the world's (gateway_ms_per_request, batch_overhead_ms)."""
    settings = dataclasses.replace(world(policy), **(measured or {}))
    return settings.with_knobs({"max_queue_tokens": max(1, token_budget)}) if policy == BOUNDED else settings


def _in_time(trace: Trace, policy: str, service: ServiceModel, token_budget: int,
             measured: dict[str, float] | None = None) -> int:
    return replay(trace, policy, service, replay_world(policy, token_budget, measured))["in_time"]


MEASURED_WORLD = {"gateway_ms_per_request": "gateway_client_cpu_ms_per_request",
                  "batch_overhead_ms": "batch_overhead_ms",
                  "worker_ms_per_batch": "worker_outside_compute_ms_per_batch"}
"""Simulator setting -> the live window's figure it is measured by (bench/harness/overload_window.py): what a
request cost the core the gateway and the client shared, a batch's service time outside its compute, and the
worker's own CPU per batch beyond its compute (on its one core: time the core did not compute)."""


def measured_world(windows: dict[str, dict[str, list[dict]]],
                   service: ServiceModel | None = None) -> dict[str, dict[str, float]]:
    """Per load, each MEASURED_WORLD setting at the median over every policy's windows of its figure, and with
    `service` (the latency model the replay runs), `compute_factor`: the compute the worker took for the batches
    of every window over `service`'s prediction of them (overload_window.computed_batches). A setting whose
    figure some window lacks is left out: the replay's own world value stands."""
    loads = {load for rows in windows.values() for load in rows}
    out: dict[str, dict[str, float]] = {}
    for load in loads:
        summaries = [w for rows in windows.values() for w in rows.get(load, [])]
        out[load] = {setting: round(statistics.median([w[figure] for w in summaries]), 3)
                     for setting, figure in MEASURED_WORLD.items()
                     if summaries and all(w.get(figure) is not None for w in summaries)}
        computed = [w.get("computed") for w in summaries]
        if service is not None and summaries and all(c is not None for c in computed):
            predicted = sum(predicted_ms(c, service.models["score"]) for c in computed)
            if predicted > 0:
                out[load]["compute_factor"] = round(sum(c["compute_ms"] for c in computed) / predicted, 3)
    return out


def answer_times(windows: dict[str, dict[str, list[dict]]], key: str) -> dict[str, dict[str, Any]]:
    """Per policy, p50 / p99 / count of the windows' `key` times (refusal_answer_ms or expired_answer_ms),
    every load and window together."""
    out = {}
    for policy, loads in windows.items():
        values = [ms for rows in loads.values() for row in rows for ms in row[key]]
        out[policy] = {"p50": _round(percentile(values, 50.0)), "p99": _round(percentile(values, 99.0)),
                       "count": len(values)}
    return out


def gateway_answer_times(windows: dict[str, dict[str, list[dict]]],
                         outcomes: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Per policy, p50 / p99 (ms) / count of the gateway's body-to-answer histogram for `outcomes`, the
    windows' increases summed over every load and window."""
    out = {}
    for policy, loads in windows.items():
        merged: dict[float, float] = defaultdict(float)
        for rows in loads.values():
            for row in rows:
                for outcome in outcomes:
                    for bound, count in row["body_to_answer"][outcome].items():
                        merged[bound] += count
        out[policy] = {"p50": _ms(bucket_quantile(0.50, merged)), "p99": _ms(bucket_quantile(0.99, merged)),
                       "count": int(merged.get(math.inf, 0.0))}
    return out


def keys(figures: dict[str, dict[str, dict]], windows: dict[str, dict[str, list[dict]]], replay: dict[str, Any],
         pair: dict[str, list[dict]] | None, live_keys: dict[str, Any]) -> dict[str, Any]:
    """The issue's keys (see the module docstring) from the live figures and windows, the replay and the pair."""
    loads = list(figures[ADMISSION])
    rows = replay["loads"]
    live_in_time = {p: {load: sum(r["in_time"] for r in windows[p][load]) for load in loads} for p in windows}
    refusals = gateway_answer_times(windows, REFUSED)
    expiries = gateway_answer_times(windows, (EXPIRED,))
    client_refusals = answer_times(windows, "refusal_answer_ms")
    client_expiries = answer_times(windows, "expired_answer_ms")
    rel_err = _rel_err(rows, live_in_time, loads, "in_time_by_policy")
    rel_err_free = _rel_err(rows, live_in_time, loads, "in_time_by_policy_free_loop")
    goodput = {p: {load: figures[p][load]["goodput_rps"] for load in loads} for p in figures}
    classes = figures[ADMISSION][loads[0]]["goodput_by_class_rps"]
    return {
        "admission_over_bound": {load: rows[load]["admission_over_bound"] for load in loads},
        "admission_over_bound_by_class": {load: rows[load]["admission_over_class_alone_bound"] for load in loads},
        "admission_over_bound_live": {load: _ratio(live_in_time[ADMISSION][load], rows[load]["bound_served"])
                                      for load in loads},
        "admission_over_edf_late_drop": {load: _ratio(goodput[ADMISSION][load], goodput[EDF_LATE_DROP][load])
                                         for load in loads},
        "admission_over_edf_late_drop_by_class": {
            load: {c: _ratio(figures[ADMISSION][load]["goodput_by_class_rps"][c],
                             figures[EDF_LATE_DROP][load]["goodput_by_class_rps"][c]) for c in classes}
            for load in loads},
        "admission_over_edf_late_drop_replay": {load: rows[load]["admission_over_edf_late_drop"] for load in loads},
        "time_to_refusal_ms_p99": refusals[ADMISSION]["p99"],
        "time_to_refusal_ms": {"refused": refusals, "answered_504": expiries,
                               "measured": "gateway side, body read to answer written "
                                           "(boundserve_body_to_answer_seconds, interpolated in its buckets)"},
        "time_to_refusal_client_ms_p99": client_refusals[ADMISSION]["p99"],
        "time_to_refusal_client_ms": {"refused": client_refusals, "answered_504": client_expiries,
                                      "measured": "client side, send to answer: an upper bound on body arrival "
                                                  "to answer"},
        "pair_retry_over_edf_late_drop": _pair_ratio(pair),
        "pair_goodput_rps": pair and {p: _median([w["goodput_rps"] for w in ws]) for p, ws in pair.items()},
        "priority_high_share": replay.get("priority_at_2x", {}).get("priority_high_share"),
        "worker_idle_share_at_2x": ([round(1.0 - r["worker_busy"], 3) for r in windows[ADMISSION]["2x"]]
                                    if "2x" in loads else None),
        "worker_idle_share_at_2x_replay": rows["2x"]["worker_idle_share_by_window"] if "2x" in rows else None,
        "worker_idle_scheduler_share_at_2x_replay": (rows["2x"]["idle_scheduler_share_by_window"] if "2x" in rows
                                                     else None),
        "wasted_compute_share": live_keys["wasted_compute_share"],
        "admission_wasted_compute_share_by_load": {load: figures[ADMISSION][load]["wasted_share"] for load in loads},
        "replay_vs_live_max_rel_err": {**{p: round(e, 3) for p, e in rel_err.items()},
                                       "max": round(max(rel_err.values()), 3)},
        "replay_vs_live_in_time": {p: {load: {"replay": rows[load]["in_time_by_policy"][p],
                                              "replay_free_loop": rows[load]["in_time_by_policy_free_loop"][p],
                                              "live": live_in_time[p][load]} for load in loads} for p in windows},
        "replay_vs_live_world": {load: rows[load]["measured_world"] for load in loads},
        "replay_vs_live_max_rel_err_free_loop": {**{p: round(e, 3) for p, e in rel_err_free.items()},
                                                 "max": round(max(rel_err_free.values()), 3)},
        "live_same_schedule_rel_diff": {
            f"{a} / {b}": {load: round(abs(live_in_time[a][load] - live_in_time[b][load])
                                       / max(1, min(live_in_time[a][load], live_in_time[b][load])), 3)
                           for load in loads}
            for a, b in same_schedule(list(windows), len(classes))},
    }


def same_schedule(policies: list[str], classes: int) -> list[tuple[str, str]]:
    """Pairs of `policies` that make every decision alike on a workload with `classes` deadline classes: with
    one class every request's deadline is its arrival plus the same budget, so deadline order is arrival order
    and policies that differ only in queue_order schedule alike. Their live in-time answers differ only by the
    rig's noise: the least error a replay of one of them can be judged at."""
    if classes != 1:
        return []
    known = [p for p in policies if p in POLICIES]
    return [(a, b) for i, a in enumerate(known) for b in known[i + 1:]
            if POLICIES[a] != POLICIES[b] and _but_order(a) == _but_order(b)]


def _but_order(policy: str) -> dict[str, Any]:
    return {k: v for k, v in POLICIES[policy].items() if k != "queue_order"}


def _rel_err(rows: dict[str, dict], live_in_time: dict[str, dict[str, int]], loads: list[str],
             key: str) -> dict[str, float]:
    """Per policy, the largest over loads of |replay - live| / live in-time answers (the replay's `key`)."""
    return {p: max(abs(rows[load][key][p] - live[load]) / max(1, live[load]) for load in loads)
            for p, live in live_in_time.items()}


def _pair_ratio(pair: dict[str, list[dict]] | None) -> float | None:
    if not pair or ADMISSION not in pair or EDF_LATE_DROP not in pair:
        return None
    return _ratio(_median([r["goodput_rps"] for r in pair[ADMISSION]]),
                  _median([r["goodput_rps"] for r in pair[EDF_LATE_DROP]]))


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def _ratio(value: float | None, over: float | None) -> float | None:
    return round(value / over, 3) if value is not None and over else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
