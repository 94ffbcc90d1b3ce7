"""PNG plots for reports (matplotlib, Agg backend): latency CDF, latency and throughput over time,
outcomes over time, and goodput versus offered load for sweeps. Each function returns PNG bytes."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from loadgen.result import RequestResult  # noqa: E402


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=96)
    plt.close(fig)
    return buffer.getvalue()


def latency_cdf(results: Sequence[RequestResult], slo_ms: float | None) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 4))
    for route in sorted({r.route for r in results}):
        lat = sorted(r.latency_ms for r in results if r.route == route and r.outcome == "ok")
        if lat:
            ax.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], label=f"{route} (ok, n={len(lat)})")
    if slo_ms:
        ax.axvline(slo_ms, color="red", linestyle="--", label=f"SLO {slo_ms:g} ms")
    ax.set(xlabel="latency from scheduled send (ms)", ylabel="fraction of successful requests",
           title="Latency CDF")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    return _png(fig)


def latency_over_time(series: Sequence[dict[str, Any]], slo_ms: float | None) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    t = [b["t_s"] for b in series]
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99")):
        ax.plot(t, [b[key] if b[key] is not None else float("nan") for b in series], marker=".", label=label)
    if slo_ms:
        ax.axhline(slo_ms, color="red", linestyle="--", label="SLO")
    ax.set(xlabel="time (s, by scheduled send)", ylabel="latency (ms)", title="Latency over time")
    ax.grid(alpha=0.3)
    ax.legend()
    return _png(fig)


def throughput_over_time(series: Sequence[dict[str, Any]], bin_s: float) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    t = [b["t_s"] for b in series]
    ax.plot(t, [b["sent"] / bin_s for b in series], marker=".", label="offered (sent/s)")
    ax.plot(t, [b["throughput_rps"] for b in series], marker=".", label="successful answers/s")
    ax.set(xlabel="time (s)", ylabel="requests per second", title="Throughput over time")
    ax.grid(alpha=0.3)
    ax.legend()
    return _png(fig)


def outcomes_over_time(series: Sequence[dict[str, Any]], bin_s: float) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 3.5))
    t = [b["t_s"] for b in series]
    names = sorted({name for b in series for name in b["outcomes"]}, key=lambda n: (n != "ok", n))
    bottom = [0.0] * len(series)
    for name in names:
        heights = [b["outcomes"].get(name, 0) / bin_s for b in series]
        ax.bar(t, heights, width=bin_s * 0.9, bottom=bottom, align="edge", label=name)
        bottom = [a + h for a, h in zip(bottom, heights)]
    ax.set(xlabel="time (s, by scheduled send)", ylabel="requests per second", title="Outcomes over time")
    ax.legend(fontsize="small")
    return _png(fig)


def goodput_vs_offered(rows: Sequence[dict[str, Any]], slo_ms: float, pct: float) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 4))
    offered = [r["offered_rps"] for r in rows]
    ax.plot(offered, offered, color="grey", linestyle=":", label="offered = goodput")
    ax.plot(offered, [r["goodput_rps"] for r in rows], marker="o", label=f"goodput (≤ {slo_ms:g} ms)")
    ax.plot(offered, [r["throughput_rps"] for r in rows], marker=".", label="throughput (all successes)")
    ax.set(xlabel="offered load (requests/s)", ylabel="requests/s", title="Goodput versus offered load")
    twin = ax.twinx()
    twin.plot(offered, [r["latency_pct_ms"] if r["latency_pct_ms"] is not None else float("nan") for r in rows],
              color="tab:red", marker="x", label=f"p{pct:g} latency")
    twin.axhline(slo_ms, color="tab:red", linestyle="--", alpha=0.5)
    twin.set_ylabel(f"p{pct:g} latency (ms)", color="tab:red")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    return _png(fig)


def latency_cdf_pair(series: dict[str, Sequence[float]], slo_ms: float | None, title: str) -> bytes:
    """CDFs of several latency samples on one axis (e.g. live against simulated)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, values in series.items():
        lat = sorted(values)
        if lat:
            ax.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], label=f"{name} (ok, n={len(lat)})")
    if slo_ms:
        ax.axvline(slo_ms, color="red", linestyle="--", label=f"SLO {slo_ms:g} ms")
    ax.set(xlabel="latency from scheduled send (ms)", ylabel="fraction of successful requests", title=title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    return _png(fig)
