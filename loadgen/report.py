"""Run reports: JSON numbers, per-request JSON lines, PNG plots and one self-contained HTML page."""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any

from loadgen.prometheus import stage_breakdown
from loadgen.result import ReplayRun, RequestResult
from loadgen.stats import summarize, timeseries


def build_report(run: ReplayRun, slo_ms: float | None, meta: dict[str, Any], bin_s: float = 1.0) -> dict[str, Any]:
    """All numbers of a run: per-route summary, sender lag, server stages, time series."""
    report = {"meta": {**meta, "started_unix": run.started_unix, "max_in_flight": run.max_in_flight}}
    report.update(summarize(run.results, slo_ms, run.window_s or None))
    report["stages"] = {
        "from_metrics": stage_breakdown(run.metrics_before, run.metrics_after),
    }
    report["timeseries"] = {"bin_s": bin_s, "bins": timeseries(run.results, bin_s)}
    return report


def write_report(out_dir: str | Path, run: ReplayRun, report: dict[str, Any], plots: bool = True) -> Path:
    """report.json, results.jsonl, *.png and index.html under out_dir; returns the HTML path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(clean_json(report), indent=2))
    (out / "results.jsonl").write_text("".join(json.dumps(clean_json(r.to_json())) + "\n" for r in run.results))
    images = render_plots(run.results, report) if plots else {}
    for name, png in images.items():
        (out / f"{name}.png").write_bytes(png)
    page = out / "index.html"
    page.write_text(html_page(report, images))
    return page


def render_plots(results: list[RequestResult], report: dict[str, Any]) -> dict[str, bytes]:
    from loadgen import plots

    slo = report["routes"]["all"]["slo_ms"]
    series, bin_s = report["timeseries"]["bins"], report["timeseries"]["bin_s"]
    return {
        "latency_cdf": plots.latency_cdf(results, slo),
        "latency_over_time": plots.latency_over_time(series, slo),
        "throughput_over_time": plots.throughput_over_time(series, bin_s),
        "outcomes_over_time": plots.outcomes_over_time(series, bin_s),
    }


def html_page(report: dict[str, Any], images: dict[str, bytes], title: str = "boundserve load report") -> str:
    """A self-contained page: tables of the numbers and the plots inlined as data: URIs."""
    parts = [meta_table(report.get("meta", {}))]
    if "routes" in report:
        slo = report["routes"]["all"]["slo_ms"]
        note = f"<p>SLO: answered successfully within {slo:g} ms (goodput, attainment).</p>" if slo else ""
        parts.append("<h2>Per route</h2>" + note + routes_table(report["routes"]))
    if "sender" in report:
        parts.append(_sender_html(report["sender"]))
    if report.get("stages"):
        parts.append("<h2>Server stages</h2>" + _stages_html(report["stages"]))
    parts += [image_html(name, png) for name, png in images.items()]
    return page(title, parts)


def page(title: str, parts: list[str]) -> str:
    """A self-contained HTML page in the reports' one style."""
    head = [f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>",
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
            "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#eee}"
            ".warn{color:#b00;font-weight:bold}</style></head><body>", f"<h1>{title}</h1>"]
    return "\n".join(head + parts + ["</body></html>"])


def image_html(name: str, png: bytes) -> str:
    data = base64.b64encode(png).decode()
    return f"<h2>{html.escape(name.replace('_', ' '))}</h2><img src='data:image/png;base64,{data}'>"


def routes_table(routes: dict[str, dict[str, Any]]) -> str:
    header = ["route", "sent", "ok", "thru/s", "goodput/s", "attain", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms",
              "mean ms", "outcomes"]
    rows = []
    for route, s in routes.items():
        lat = s["latency_ms"]
        rows.append([route, s["sent"], s["ok"], fmt(s["throughput_rps"]), fmt(s["goodput_rps"]),
                     fmt(s["slo_attainment"], 3), *(fmt(lat[k]) for k in ("p50", "p90", "p99", "p999", "mean")),
                     html.escape(", ".join(f"{k}: {v}" for k, v in s["outcomes"].items()))])
    return table_html(header, rows)


def _sender_html(sender: dict[str, Any]) -> str:
    lag = sender["lag_ms"]
    text = (f"<h2>Sender</h2><p>lag behind schedule: p50 {fmt(lag['p50'], 2)} ms, p99 {fmt(lag['p99'], 2)} ms, "
            f"max {fmt(lag['max'], 2)} ms; {sender['late_sends']} sends later than "
            f"{sender['late_threshold_ms']:g} ms.</p>")
    if sender["saturated"]:
        text += "<p class='warn'>The client was saturated: latencies include client delay.</p>"
    return text


def _stages_html(stages: dict[str, Any]) -> str:
    rows = []
    for source, groups in stages.items():
        for group, by_stage in groups.items():
            for stage, v in by_stage.items():
                rows.append([source, group, stage, v["count"], fmt(v.get("mean_ms"), 2),
                             fmt(v.get("p50_ms"), 2), fmt(v.get("p99_ms"), 2)])
    if not rows:
        return "<p>The server exposed no stage histograms or timing headers.</p>"
    return table_html(["source", "group", "stage", "count", "mean ms", "p50 ms", "p99 ms"], rows)


def meta_table(meta: dict[str, Any]) -> str:
    rows = [[html.escape(str(k)), html.escape(json.dumps(v) if isinstance(v, (dict, list)) else str(v))]
            for k, v in meta.items()]
    return table_html(["key", "value"], rows)


def table_html(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def clean_json(value: Any) -> Any:
    """NaN and infinity become null so the JSON stays standard."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    return value
