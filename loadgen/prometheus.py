"""The gateway's /metrics: fetch, parse with prometheus_client's text parser, diff stage histograms.

The per-stage breakdown of a run is the difference of the stage histograms
(`boundserve_stage_latency_seconds{stage=...}`) scraped before and after it: count, mean, and
p50/p99 interpolated inside the buckets as Prometheus' histogram_quantile does, reported in
milliseconds. A page that does not parse as a whole is read line by line, skipping the lines that
do not parse; a missing metric gives an empty breakdown, never an error.
"""

from __future__ import annotations

import math
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

STAGE_METRIC = "boundserve_stage_latency_seconds"
MS_PER_S = 1000.0

Sample = tuple[str, dict[str, str], float]


async def fetch_metrics(session, url: str, timeout_s: float = 5.0) -> str | None:
    """GET {url}/metrics as text, or None if the server has none (or is not answering)."""
    import aiohttp

    try:
        async with session.get(url.rstrip("/") + "/metrics",
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            return await response.text() if response.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


def parse(text: str | None) -> list[Sample]:
    """(name, labels, value) for every sample that parses."""
    try:
        return _samples(text or "")
    except ValueError:  # a broken page: keep what each line on its own gives
        samples: list[Sample] = []
        for line in (text or "").splitlines():
            try:
                samples += _samples(line)
            except ValueError:
                continue
        return samples


def _samples(text: str) -> list[Sample]:
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def stage_breakdown(before: str | None, after: str | None) -> dict[str, dict]:
    """{group: {stage: {count, mean_ms, p50_ms, p99_ms}}} for the requests between two scrapes.

    `group` joins the histogram's labels other than stage and le ("all" when there are none)."""
    now = _histograms(parse(after), STAGE_METRIC)
    return _diff(now, _histograms(parse(before), STAGE_METRIC), MS_PER_S) if now else {}


def _diff(now: dict, then: dict, ms_per_unit: float) -> dict[str, dict]:
    out: dict[str, dict] = defaultdict(dict)
    for key, hist in now.items():
        old = then.get(key, {"count": 0.0, "sum": 0.0, "buckets": {}})
        count = hist["count"] - old["count"]
        if count <= 0:
            continue
        buckets = {le: n - old["buckets"].get(le, 0.0) for le, n in hist["buckets"].items()}
        group, stage = key
        out[group][stage] = {
            "count": int(count),
            "mean_ms": ms_per_unit * (hist["sum"] - old["sum"]) / count,
            "p50_ms": _scaled(bucket_quantile(0.50, buckets), ms_per_unit),
            "p99_ms": _scaled(bucket_quantile(0.99, buckets), ms_per_unit),
        }
    return dict(out)


def bucket_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Quantile from cumulative buckets {upper bound: count}, linear inside a bucket."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for upper in bounds:
        count = buckets[upper]
        if count >= rank:
            if math.isinf(upper):
                return lower
            inside = count - below
            return lower + (upper - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = upper, count
    return lower


def _histograms(samples: list[Sample], metric: str) -> dict[tuple[str, str], dict]:
    hists: dict[tuple[str, str], dict] = {}
    for name, labels, value in samples:
        if not name.startswith(metric):
            continue
        suffix = name[len(metric):]
        if suffix not in ("_bucket", "_sum", "_count"):
            continue
        stage = labels.get("stage", "all")
        group = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("stage", "le")) or "all"
        hist = hists.setdefault((group, stage), {"count": 0.0, "sum": 0.0, "buckets": {}})
        if suffix == "_bucket":
            try:
                hist["buckets"][float(labels["le"].replace("+Inf", "inf"))] = value
            except (KeyError, ValueError):
                continue
        else:
            hist[suffix[1:]] = value
    return hists


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else factor * value


def counter_diff(before: str | None, after: str | None, metric: str, label: str) -> dict[str, float]:
    """{value of `label`: increase of counter `metric`} between two scrapes (a `_total` suffix on
    either side of the name is accepted)."""
    def totals(text: str | None) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for name, labels, value in parse(text):
            if name in (metric, metric.removesuffix("_total"), metric + "_total") and label in labels:
                out[labels[label]] += value
        return out

    then = totals(before)
    return {key: value - then.get(key, 0.0) for key, value in totals(after).items() if value - then.get(key, 0.0)}
