"""One measured window of the overload benchmark: an open-loop replay, and the gateway's /metrics and
the workers' CPU read every second while it runs.

The replay is loadgen's (loadgen/replayer.py: each request leaves at its scheduled time, latency
counts from then); goodput, percentiles and sender lag are loadgen.stats' (goodput: answers within
the request's own deadline per second of the window). What the server did comes from declared data
only: the gateway's Prometheus series (drops by reason, batches and their fill, predicted and
measured batch service time, worker compute and the part of it wasted, the gateway's own CPU, the
queue, the learnt lateness) and /proc/<pid>/stat of the worker processes (their CPU). The worker's
CPU seconds over its compute seconds (`worker_cpu_while_busy`) say how much of the time it computed
it really had a CPU: about 1 on a quiet machine, less where other processes took its core. The client's
own CPU (this process's, over the replay) beside the gateway's: where both share one core (the bench's
pinning), `gateway_client_cpu_ms_per_request` is what each request costs that core; `batch_overhead_ms`
is a batch's service time (the gateway's send to its answer, less the worker's queue) outside its compute:
the two figures the replay's validation world takes (bench/harness/overload_keys.py).
How fast a request learns it will not be served is measured where the issue defines it, by the gateway:
its histogram of the time from a request's body read to its answer written, by outcome
(`boundserve_body_to_answer_seconds`, gateway/metrics.py), its increase over the window for the refusals
(503 deadline_unmeetable, 429 queue_full) and the 504s (`body_to_answer`). Beside it, the client's time
from its send to the answer (the high-resolution clock's: the loop's moves in 1 ms steps under uvloop),
for each refusal (`refusal_answer_ms`) and each 504 (`expired_answer_ms`): an upper bound on the
gateway's, with the client's write and read, and the wait of both for a CPU, in it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from loadgen.bodies import BodyFactory
from loadgen.prometheus import fetch_metrics, parse
from loadgen.replayer import ReplayOptions, replay
from loadgen.result import RequestResult
from loadgen.stack import BatchLine
from loadgen.stats import percentile, route_summary, sender_summary, window_of
from loadgen.trace import Trace
from shared.latency_model import LatencyModel

COUNTERS = {
    "compute_s": ("boundserve_worker_compute_seconds_total", {}),
    "wasted_late_s": ("boundserve_wasted_compute_seconds_total", {"reason": "late"}),
    "wasted_dropped_s": ("boundserve_wasted_compute_seconds_total", {"reason": "dropped"}),
    "predicted_s": ("boundserve_batch_predicted_seconds_total", {}),
    "service_s": ("boundserve_batch_service_seconds_total", {}),
    "batches": ("boundserve_batch_fill_ratio_count", {"workload": "score"}),
    "fill_sum": ("boundserve_batch_fill_ratio_sum", {"workload": "score"}),
    "gateway_cpu_s": ("process_cpu_seconds_total", {}),
}
"""What is read of each scrape: (series, labels it must carry), summed over the others."""
REFUSED = ("deadline_unmeetable", "queue_full")
EXPIRED = "deadline_exceeded"
BODY_TO_ANSWER = "boundserve_body_to_answer_seconds_bucket"
"""The gateway's histogram of body read to answer written (cumulative buckets, upper bounds in seconds)."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds of the processes (their /proc/<pid>/stat), 0 for one that is gone."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14, 15)
    return total


def read(text: str) -> dict[str, Any]:
    """The COUNTERS, the queue, the learnt lateness and the loop's present lag (ms) of one /metrics page, and
    the body-to-answer histogram of the refusals and 504s ({outcome: {upper bound s: cumulative count}})."""
    samples = parse(text)
    out: dict[str, Any] = {name: 0.0 for name in COUNTERS}
    out["lateness_ms"], out["loop_lag_ms"], out["queue_jobs"] = 0.0, 0.0, 0.0
    out["body_to_answer"] = {outcome: {} for outcome in (*REFUSED, EXPIRED)}
    for name, labels, value in samples:
        if name == BODY_TO_ANSWER and labels.get("outcome") in out["body_to_answer"]:
            out["body_to_answer"][labels["outcome"]][float(labels["le"])] = value
        for key, (series, wanted) in COUNTERS.items():
            if name == series and all(labels.get(k) == v for k, v in wanted.items()):
                out[key] += value
        if name == "boundserve_queue_jobs" and labels.get("workload") == "score":
            out["queue_jobs"] = value
        if name == "boundserve_lateness_seconds" and labels.get("workload") == "score":
            out["lateness_ms"] = round(value * 1000.0, 2)
        if name == "boundserve_loop_lag_seconds" and labels.get("workload") == "score":
            out["loop_lag_ms"] = round(value * 1000.0, 2)
    return out


async def run_window(url: str, trace: Trace, bodies: BodyFactory, worker_pids: Sequence[int],
                     sample_s: float = 1.0, id_prefix: str | None = None) -> dict[str, Any]:
    """Replay `trace` against `url` (request i with X-Request-Id `<id_prefix><i>` where given); returns the
    window's summary (see summarize)."""
    samples: list[tuple[float, float, dict[str, Any]]] = []  # (s from the start, worker CPU s, page)
    start = time.monotonic()
    async with aiohttp.ClientSession() as session:
        async def scrape() -> None:
            text = await fetch_metrics(session, url)
            if text is not None:  # a scrape that failed is left out; the next one covers its second
                samples.append((time.monotonic() - start, cpu_seconds(worker_pids), read(text)))

        async def sample_every() -> None:
            while True:
                await asyncio.sleep(sample_s - (time.monotonic() - start) % sample_s)
                await scrape()

        await scrape()
        sampler = asyncio.create_task(sample_every())
        client_cpu_start = time.process_time()
        try:
            run = await replay(trace, bodies, ReplayOptions(url=url, progress=False, scrape_metrics=False,
                                                            id_prefix=id_prefix))
        finally:
            sampler.cancel()
        client_cpu_s = time.process_time() - client_cpu_start
        await scrape()
    return summarize(trace, run.results, samples, client_cpu_s)


def summarize(trace: Trace, results: list[RequestResult], samples: list[tuple[float, float, dict]],
              client_cpu_s: float = 0.0) -> dict[str, Any]:
    """Goodput in all and by deadline class, the tail, what was refused, late or dropped, what the
    server spent (and wasted), and the same second by second (`seconds`). `client_cpu_s`: the CPU seconds
    this process (the client) spent sending the window and reading its answers."""
    deadlines = [r.deadline_ms for r in trace.records]
    window_s = window_of(results)
    by_class: dict[str, dict[str, Any]] = {}
    for deadline in sorted(set(deadlines)):
        chosen = [res for res, d in zip(results, deadlines) if d == deadline]
        summary = route_summary(chosen, window_s, deadline)
        by_class[f"{deadline:g}"] = {"offered": summary["sent"], "goodput_rps": summary["goodput_rps"],
                                     "outcomes": summary["outcomes"]}
    ok_ms = [r.latency_ms for r in results if r.outcome == "ok"]
    outcomes = Counter(r.outcome for r in results)
    late = sum(1 for r, d in zip(results, deadlines) if r.outcome == "ok" and r.latency_ms > d)
    in_time = sum(1 for r, d in zip(results, deadlines) if r.outcome == "ok" and r.latency_ms <= d)
    first, last = samples[0], samples[-1]
    spent = {key: last[2][key] - first[2][key] for key in COUNTERS}
    span_s = max(1e-9, last[0] - first[0])
    wasted_s = spent["wasted_late_s"] + spent["wasted_dropped_s"]
    return {
        "window_s": round(window_s, 3),
        "offered": len(results),
        "offered_rps": round(len(results) / window_s, 2) if window_s else None,
        "goodput_rps": round(sum(c["goodput_rps"] or 0.0 for c in by_class.values()), 2),
        "in_time": in_time,
        "by_class": by_class,
        "ok_p50_ms": _rounded(percentile(ok_ms, 50.0)),
        "ok_p99_ms": _rounded(percentile(ok_ms, 99.0)),
        "outcomes": dict(sorted(outcomes.items())),
        "refused": sum(outcomes[code] for code in REFUSED),
        "ok_late": late,
        "compute_s": round(spent["compute_s"], 4),
        "wasted_s": round(wasted_s, 4),
        "wasted_share": round(wasted_s / spent["compute_s"], 4) if spent["compute_s"] > 0 else 0.0,
        "worker_busy": round(spent["compute_s"] / span_s, 3),
        "worker_cpu": round((last[1] - first[1]) / span_s, 3),
        "worker_cpu_while_busy": (round((last[1] - first[1]) / spent["compute_s"], 3) if spent["compute_s"] > 0
                                  else None),
        "worker_outside_compute_ms_per_batch": (
            round(1000.0 * (last[1] - first[1] - spent["compute_s"]) / spent["batches"], 3) if spent["batches"]
            else None),
        "gateway_cpu": round(spent["gateway_cpu_s"] / span_s, 3),
        "client_cpu": round(client_cpu_s / span_s, 3),
        "gateway_client_cpu_ms_per_request": (round(1000.0 * (spent["gateway_cpu_s"] + client_cpu_s) / len(results), 3)
                                              if results else None),
        "batches": int(spent["batches"]),
        "batch_overhead_ms": (round(1000.0 * (spent["service_s"] - spent["compute_s"]) / spent["batches"], 3)
                              if spent["batches"] else None),
        "batch_fill": round(spent["fill_sum"] / spent["batches"], 3) if spent["batches"] else None,
        "measured_over_predicted_service": (round(spent["service_s"] / spent["predicted_s"], 3)
                                            if spent["predicted_s"] > 0 else None),
        "sender": sender_summary(results),
        "seconds": per_second(results, deadlines, samples),
        "body_to_answer": {outcome: bucket_increase(first[2]["body_to_answer"][outcome], buckets)
                           for outcome, buckets in last[2]["body_to_answer"].items()},
        "refusal_answer_ms": answer_ms(results, REFUSED),
        "expired_answer_ms": answer_ms(results, (EXPIRED,)),
    }


COMPUTED = ("batches", "items", "tokens", "tokens_per_item", "compute_ms")


def computed_batches(lines: Sequence[BatchLine], shapes: dict[str, tuple[str, int, int]]) -> dict[str, float]:
    """What the worker computed of a window, from its batch_done lines (`shapes`: the window's request ids ->
    (route, B, B*L) as loadgen/calibrate.request_shape gives them): per batch of the window's requests alone,
    with one or more computed, its members' B, B*L and L summed, and its compute. A latency model's prediction
    of those batches follows from the sums (`predicted_ms`). A batch that
    holds a chunk of a split request (whose share of the request the line does not give) is left out and
    counted (`left_out`)."""
    sums = dict.fromkeys(COMPUTED, 0.0) | {"left_out": 0}
    seen = Counter(i for line in lines for i in line.request_ids)
    for line in lines:
        if not line.request_ids or not all(i in shapes for i in line.request_ids):
            continue
        live = [shapes[i] for i in line.request_ids if i not in line.expired]
        if not live or line.compute_ms <= 0:
            continue
        if any(seen[i] > 1 for i in line.request_ids):
            sums["left_out"] += 1
            continue
        items, tokens = sum(s[1] for s in live), sum(s[2] for s in live)
        for key, value in zip(COMPUTED, (1, items, tokens, tokens / items, line.compute_ms)):
            sums[key] += value
    return {key: round(value, 3) for key, value in sums.items()}


def predicted_ms(computed: dict[str, float], model: LatencyModel) -> float:
    """The model's prediction of the batches `computed` sums (computed_batches), summed."""
    return model.predict_sum_ms(computed["batches"], computed["items"], computed["tokens"], computed["tokens_per_item"])


def bucket_increase(before: dict[float, float], after: dict[float, float]) -> dict[float, float]:
    """The cumulative buckets of the observations between two scrapes of one histogram."""
    return {bound: count - before.get(bound, 0.0) for bound, count in after.items()}


def answer_ms(results: list[RequestResult], outcomes: Sequence[str]) -> list[float]:
    """Milliseconds from each send to its answer, for the requests that ended with one of `outcomes`."""
    return [round(r.try_ms, 3) for r in results if r.outcome in outcomes]


def per_second(results: list[RequestResult], deadlines: list[float],
               samples: list[tuple[float, float, dict]]) -> list[dict[str, Any]]:
    """Per 1 s of the window (requests by scheduled second; the server between two scrapes)."""
    client: dict[int, Counter] = defaultdict(Counter)
    for r, deadline in zip(results, deadlines):
        row = client[int(r.scheduled_ms // 1000.0)]
        row["offered"] += 1
        row["refused"] += r.outcome in REFUSED
        row["in_time"] += r.outcome == "ok" and r.latency_ms <= deadline
        row["late"] += r.outcome == "ok" and r.latency_ms > deadline
        row["dropped"] += r.outcome == "deadline_exceeded"
    rows = []
    for k, ((t0, cpu0, a), (t1, cpu1, b)) in enumerate(zip(samples, samples[1:])):
        dt = max(1e-9, t1 - t0)
        d = {key: b[key] - a[key] for key in COUNTERS}
        rows.append({
            "t_s": round(t0, 2), **{key: client[k][key] for key in ("offered", "refused", "in_time", "late",
                                                                     "dropped")},
            "admitted": client[k]["offered"] - client[k]["refused"],
            "batches": int(d["batches"]),
            "batch_fill": round(d["fill_sum"] / d["batches"], 3) if d["batches"] else None,
            "predicted_ms": round(1000.0 * d["predicted_s"] / d["batches"], 2) if d["batches"] else None,
            "measured_ms": round(1000.0 * d["service_s"] / d["batches"], 2) if d["batches"] else None,
            "worker_busy": round(d["compute_s"] / dt, 3),
            "wasted_ms": round(1000.0 * (d["wasted_late_s"] + d["wasted_dropped_s"]), 2),
            "worker_cpu": round((cpu1 - cpu0) / dt, 3),
            "gateway_cpu": round(d["gateway_cpu_s"] / dt, 3),
            "queue_jobs": b["queue_jobs"],
            "lateness_ms": b["lateness_ms"],
            "loop_lag_ms": b["loop_lag_ms"],
        })
    return rows


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


async def idle(url: str, timeout_s: float = 10.0) -> None:
    """Until the gateway has nothing queued or in flight (its own gauges), then a short pause."""
    end = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < end:
            page = {name: value for name, _, value in parse(await fetch_metrics(session, url))
                    if name in ("boundserve_queue_jobs", "boundserve_batches_in_flight")}
            if page and not any(page.values()):
                break
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
