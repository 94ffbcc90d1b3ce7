"""The report of `loadgen validate`, in the style of the replay reports (loadgen/report.py).

Under out_dir: validate.json (the summary the command prints), index.html (tables of the levels,
the calibration and each level's routes live and simulated, latency CDFs live against simulated),
and per level live.jsonl and sim.jsonl (one RequestResult per line).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from loadgen.result import ReplayRun, RequestResult
from loadgen.report import clean_json, fmt, image_html, meta_table, page, routes_table, table_html
from loadgen.stats import summarize


def write_validation(out: Path, summary: dict[str, Any], live: list[ReplayRun], sim: list[list[RequestResult]],
                     plots: bool = True) -> Path:
    """Write the files above; returns the HTML page's path."""
    (out / "validate.json").write_text(json.dumps(clean_json(summary), indent=2))
    parts = [meta_table({k: v for k, v in summary.items() if k not in ("levels", "calibration")}),
             "<h2>Levels</h2><p>sim: the workers at the speed they reported for the level's own batches; "
             "calibration-only: at the speed they reported for the calibration batches; profile-only: at the "
             "speed of their start-up profile. Compute vs calibration: the level's compute time over the "
             "calibration's, both relative to the start-up profile.</p>" + levels_table(summary["levels"]),
             "<h2>Calibration</h2>" + meta_table(summary["calibration"])]
    for row, run, results in zip(summary["levels"], live, sim):
        folder = out / f"level-{row['load']:g}"
        folder.mkdir(exist_ok=True)
        for name, rows in (("live.jsonl", run.results), ("sim.jsonl", results)):
            (folder / name).write_text("".join(json.dumps(clean_json(r.to_json())) + "\n" for r in rows))
        parts.append(_level_html(row, run, results, summary["slo_ms"], plots))
    path = out / "index.html"
    path.write_text(page("boundserve simulator validation", parts))
    return path


def levels_table(levels: list[dict[str, Any]]) -> str:
    header = ["load", "offered/s", "goodput/s live", "sim", "err", "p50 ms live", "sim", "p99 ms live",
              "live p99 90% bootstrap", "sim", "err",
              "drops live", "drops sim", "compute vs calibration", "calibration-only sim: goodput/s", "p99 ms",
              "profile-only sim: goodput/s", "p99 ms"]
    rows = []
    for r in levels:
        rows.append([f"{r['load']:g}", fmt(r["offered_rps"]), fmt(r["live_goodput_rps"]), fmt(r["sim_goodput_rps"]),
                     _pct(r["goodput_rel_err"]), fmt(r["live_p50_ms"]), fmt(r["sim_p50_ms"]), fmt(r["live_p99_ms"]),
                     _interval(r.get("live_p99_interval_ms")),
                     fmt(r["sim_p99_ms"]), _pct(r["p99_rel_err"]), _counts(r["live_drops"]), _counts(r["sim_drops"]),
                     fmt((r.get("measured") or {}).get("compute_vs_calibration")),
                     fmt(r["calibration_sim_goodput_rps"]), fmt(r["calibration_sim_p99_ms"]),
                     fmt(r["profile_sim_goodput_rps"]), fmt(r["profile_sim_p99_ms"])])
    return table_html(header, rows)


def _level_html(row: dict[str, Any], run: ReplayRun, results: list[RequestResult], slo_ms: float,
                plots: bool) -> str:
    title = f"Level {row['load']:g} x capacity"
    parts = [f"<h2>{title}</h2>"]
    if row["live_sender_saturated"]:
        parts.append("<p class='warn'>The client fell behind its schedule: live latencies include client delay.</p>")
    for name, rows in (("live", run.results), ("simulated", results)):
        routes = summarize(rows, slo_ms, run.window_s or None)["routes"]
        parts.append(f"<h3>{name}</h3>" + routes_table(routes))
    if plots:
        from loadgen.plots import latency_cdf_pair

        series = {name: [r.latency_ms for r in rows if r.outcome == "ok"]
                  for name, rows in (("live", run.results), ("simulated", results))}
        parts.append(image_html(f"latency CDF at {row['load']:g}x", latency_cdf_pair(series, slo_ms, title)))
    return "\n".join(parts)


def _interval(bounds: tuple[float, float] | list[float] | None) -> str:
    return "-" if bounds is None else f"{fmt(bounds[0])}-{fmt(bounds[1])}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _counts(counts: dict[str, int]) -> str:
    return html.escape(", ".join(f"{k}: {v}" for k, v in counts.items())) or "-"
