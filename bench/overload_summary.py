"""The overload benchmark's figures from its windows: medians and spreads per policy and load, the
ratios the issue asks for, and the goals checked against them.

Every figure of a policy at a load is the median of its windows (goodput with the spread: the
smallest and largest window); p99 and the shares likewise. The ablations are every policy but
`admission`; "best ablation" is the one with the highest median goodput at that load.
"""

from __future__ import annotations

import statistics
from typing import Any

ADMISSION = "admission"
FAIR_FCFS = "fcfs_late_drop"
BOUNDED = "edf_bounded"


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
        "gateway_cpu": _median([r["gateway_cpu"] for r in rows]),
        "batch_fill": _median([r["batch_fill"] for r in rows]),
        "measured_over_predicted_service": _median([r["measured_over_predicted_service"] for r in rows]),
        "sender_lag_p99_ms": _median([r["sender"]["lag_ms"]["p99"] for r in rows]),
        "sender_saturated_windows": sum(r["sender"]["saturated"] for r in rows),
        "goodput_by_class_rps": {c: _median([r["by_class"].get(c, {}).get("goodput_rps") for r in rows])
                                 for c in classes},
    }


def ratios(figures: dict[str, dict[str, dict[str, Any]]], capacity_rps: float) -> dict[str, Any]:
    """The issue's keys (see the module docstring and README, "Overload")."""
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
    for name, policy in (("fair_fcfs", FAIR_FCFS), ("bounded_queue", BOUNDED)):
        if policy in goodput:
            out[f"admission_over_{name}_by_load"] = {load: _ratio(goodput[ADMISSION][load], goodput[policy].get(load))
                                                     for load in admission}
    if len(next(iter(admission.values()))["goodput_by_class_rps"]) > 1:
        out["goodput_by_class_at_2x"] = {policy: loads["2x"]["goodput_by_class_rps"]
                                         for policy, loads in figures.items() if "2x" in loads}
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
        out["every_class_at_2x"] = _class_goal(keys["goodput_by_class_at_2x"], keys["best_ablation_at_2x"])
    return out


def _class_goal(by_class: dict[str, dict[str, float]], best: str) -> dict[str, Any]:
    """Admission's goodput in each class at 2x against the best ablation's (the one best in all) and
    against the best of any ablation in that class."""
    mine = by_class[ADMISSION]
    others = {p: c for p, c in by_class.items() if p != ADMISSION}
    rows = {}
    for cls, value in mine.items():
        top = max(others, key=lambda p: others[p].get(cls) or 0.0)
        rows[cls] = {"admission": value, "best_ablation": others[best].get(cls),
                     "best_in_class": {"policy": top, "goodput_rps": others[top].get(cls)}}
    return {"classes": rows,
            "holds_against_best_ablation": all((r["admission"] or 0) >= (r["best_ablation"] or 0)
                                               for r in rows.values()),
            "holds_against_best_in_each_class": all((r["admission"] or 0) >= (r["best_in_class"]["goodput_rps"] or 0)
                                                    for r in rows.values())}


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


def _ratio(value: float | None, over: float | None) -> float | None:
    return round(value / over, 3) if value is not None and over else None
