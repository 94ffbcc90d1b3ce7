"""The overload benchmark's figures from its windows: medians and spreads per policy and load, the
ratios the issue asks for, and the goals checked against them.

Every figure of a policy at a load is the median of its windows (goodput with the spread: the
smallest and largest window); p99 and the shares likewise. The ablations are every policy but
`admission`; "best ablation" is the one with the highest median goodput at that load. The issue
named three (the bounded queue, the fair FCFS and deadline order with expiry); `edf_late_drop`
(predicted-late drops without early refusal) is here too, and the goals are judged against all
four, with the figure against the three alone beside it.
"""

from __future__ import annotations

import statistics
from typing import Any

ADMISSION = "admission"
FAIR_FCFS = "fcfs_late_drop"
BOUNDED = "edf_bounded"
NAMED_IN_ISSUE = ("edf_bounded", "fcfs_late_drop", "edf_expiry")


def table(windows: dict[str, dict[str, list[dict]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{policy: {load: figures}} from {policy: {load: [window summaries]}}."""
    return {policy: {load: _figures(rows) for load, rows in loads.items()} for policy, loads in windows.items()}


def _figures(rows: list[dict]) -> dict[str, Any]:
    goodputs = [r["goodput_rps"] for r in rows]
    classes = sorted({c for r in rows for c in r["by_class"]}, key=float)
    compute = sum(r["compute_s"] for r in rows)
    return {
        "goodput_rps": _median(goodputs),
        "goodput_spread_rps": [round(min(goodputs), 2), round(max(goodputs), 2)],
        "windows": len(rows),
        "offered_rps": _median([r["offered_rps"] for r in rows]),
        "ok_p99_ms": _median([r["ok_p99_ms"] for r in rows]),
        "refused_share": _median([r["refused"] / r["offered"] for r in rows]),
        "dropped_share": _median([r["outcomes"].get("deadline_exceeded", 0) / r["offered"] for r in rows]),
        "ok_late_share": _median([r["ok_late"] / r["offered"] for r in rows]),
        "wasted_share": round(sum(r["wasted_s"] for r in rows) / compute, 4) if compute > 0 else 0.0,
        "worker_busy": _median([r["worker_busy"] for r in rows]),
        "worker_cpu": _median([r["worker_cpu"] for r in rows]),
        "worker_cpu_while_busy": _median([r.get("worker_cpu_while_busy") for r in rows]),
        "gateway_cpu": _median([r["gateway_cpu"] for r in rows]),
        "client_cpu": _median([r.get("client_cpu") for r in rows]),
        "gateway_client_cpu_ms_per_request": _median([r.get("gateway_client_cpu_ms_per_request") for r in rows]),
        "batch_overhead_ms": _median([r.get("batch_overhead_ms") for r in rows]),
        "batch_fill": _median([r["batch_fill"] for r in rows]),
        "measured_over_predicted_service": _median([r["measured_over_predicted_service"] for r in rows]),
        "sender_lag_p99_ms": _median([r["sender"]["lag_ms"]["p99"] for r in rows]),
        "sender_saturated_windows": sum(r["sender"]["saturated"] for r in rows),
        "goodput_by_class_rps": {c: _median([r["by_class"].get(c, {}).get("goodput_rps") for r in rows])
                                 for c in classes},
    }


def ratios(figures: dict[str, dict[str, dict[str, Any]]], capacity_rps: float) -> dict[str, Any]:
    """The issue's keys (see the module docstring and docs/design/scheduling.md)."""
    admission = figures[ADMISSION]
    goodput = {policy: {load: f["goodput_rps"] for load, f in loads.items()} for policy, loads in figures.items()}
    own_best = max(goodput[ADMISSION].values())
    out: dict[str, Any] = {
        "admission_at_2x_over_capacity": _ratio(goodput[ADMISSION].get("2x"), capacity_rps),
        "admission_at_2x_over_own_best": _ratio(goodput[ADMISSION].get("2x"), own_best),
        "admission_at_4x_over_own_best": _ratio(goodput[ADMISSION].get("4x"), own_best),
        "wasted_compute_share": {policy: loads["2x"]["wasted_share"] for policy, loads in figures.items()
                                 if "2x" in loads},
        "admission_over_best_ablation_by_load": {},
        "best_ablation_by_load": {},
    }
    for load in admission:
        best = max((p for p in figures if p != ADMISSION and load in figures[p]), key=lambda p: goodput[p][load])
        out["best_ablation_by_load"][load] = best
        out["admission_over_best_ablation_by_load"][load] = _ratio(goodput[ADMISSION][load], goodput[best][load])
    out["best_ablation_at_2x"] = out["best_ablation_by_load"].get("2x")
    out["admission_at_2x_over_best_ablation"] = out["admission_over_best_ablation_by_load"].get("2x")
    out["admission_at_2x_over_each_ablation"] = {p: _ratio(goodput[ADMISSION].get("2x"), goodput[p].get("2x"))
                                                 for p in figures if p != ADMISSION}
    named = [p for p in NAMED_IN_ISSUE if "2x" in figures.get(p, {})]
    if named:
        best_named = max(named, key=lambda p: goodput[p]["2x"])
        out["best_named_ablation_at_2x"] = best_named
        out["admission_at_2x_over_best_named_ablation"] = _ratio(goodput[ADMISSION].get("2x"),
                                                                 goodput[best_named]["2x"])
    for name, policy in (("fair_fcfs", FAIR_FCFS), ("bounded_queue", BOUNDED)):
        if policy in goodput:
            out[f"admission_over_{name}_by_load"] = {load: _ratio(goodput[ADMISSION][load], goodput[policy].get(load))
                                                     for load in admission}
    if len(next(iter(admission.values()))["goodput_by_class_rps"]) > 1:
        out["goodput_by_class_at_2x"] = {policy: loads["2x"]["goodput_by_class_rps"]
                                         for policy, loads in figures.items() if "2x" in loads}
    return out


def capacity_check(figures: dict[str, dict[str, dict[str, Any]]], capacity_rps: float) -> dict[str, Any]:
    """Whether the sweep's capacity held: the best median goodput of any policy at any load, and, when
    that is above the capacity, the ratio admission at 2x would have against it (the sweep's short
    windows on a busy machine can find a peak below what the measured windows sustained)."""
    best_policy, best_load = max(((p, load) for p, loads in figures.items() for load in loads),
                                 key=lambda pl: figures[pl[0]][pl[1]]["goodput_rps"] or 0.0)
    best = figures[best_policy][best_load]["goodput_rps"]
    out = {"best_window_median_rps": best, "by": f"{best_policy} at {best_load}",
           "capacity_below_a_window_median": best > capacity_rps}
    if best > capacity_rps:
        out["admission_at_2x_over_best_window_median"] = _ratio(figures[ADMISSION].get("2x", {}).get("goodput_rps"),
                                                                best)
    return out


def goals(figures: dict[str, dict[str, dict[str, Any]]], keys: dict[str, Any], workload: str) -> dict[str, Any]:
    """Each goal of issue #19 for this workload, with the figure it is judged on and whether it holds."""
    out: dict[str, Any] = {}

    def goal(name: str, value: float | None, bound: float) -> None:
        out[name] = {"value": value, "at_least": bound, "holds": value is not None and value >= bound}

    goal("admission_at_2x_over_own_best", keys["admission_at_2x_over_own_best"], 0.95)
    goal("admission_at_4x_over_own_best", keys["admission_at_4x_over_own_best"], 0.95)
    goal("admission_at_2x_over_fair_fcfs", keys.get("admission_over_fair_fcfs_by_load", {}).get("2x"), 1.3)
    for name, share in keys["wasted_compute_share"].items():
        if name == ADMISSION:
            out["admission_wasted_share_at_2x"] = {"value": share, "at_most": 0.01, "holds": share <= 0.01}
    waste_4x = figures[ADMISSION].get("4x", {}).get("wasted_share")
    out["admission_wasted_share_at_4x"] = {"value": waste_4x, "at_most": 0.01,
                                           "holds": waste_4x is not None and waste_4x <= 0.01}
    if workload == "uniform":
        worst = min((v for v in keys.get("admission_over_bounded_queue_by_load", {}).values() if v is not None),
                    default=None)
        goal("admission_over_bounded_queue_at_every_load", worst, 1.0)
    else:
        goal("admission_at_2x_over_best_ablation", keys["admission_at_2x_over_best_ablation"], 1.2)
        goal("admission_at_2x_over_best_named_ablation", keys.get("admission_at_2x_over_best_named_ablation"), 1.2)
        out["every_class_at_2x"] = _class_goal(keys["goodput_by_class_at_2x"], keys["best_ablation_at_2x"],
                                               keys.get("best_named_ablation_at_2x"))
    return out


def _class_goal(by_class: dict[str, dict[str, float]], best: str, best_named: str | None) -> dict[str, Any]:
    """Admission's goodput in each class at 2x against every ablation's, and whether it is at least
    that of the best ablation (the one best in all classes together), of the best of those the issue
    named, and of whichever ablation is best in that class."""
    others = {p: c for p, c in by_class.items() if p != ADMISSION}
    rows = {cls: {"admission": value, **{p: others[p].get(cls) for p in others}}
            for cls, value in by_class[ADMISSION].items()}

    def holds(against) -> bool:
        return all((row["admission"] or 0.0) >= (against(row) or 0.0) for row in rows.values())

    return {"classes": rows,
            "holds_against_best_ablation": holds(lambda row: row[best]),
            "holds_against_best_named_ablation": holds(lambda row: row[best_named]) if best_named else None,
            "holds_against_best_in_each_class": holds(lambda row: max(row[p] or 0.0 for p in others))}


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


def _ratio(value: float | None, over: float | None) -> float | None:
    return round(value / over, 3) if value is not None and over else None
