"""bench/shared_prefix.py --e2e: the shared-prefix gain through the real stack, and the latency model's error.

One `python -m worker` serves two gateways built from the same config: "shared" with the default
sharing threshold, "unshared" with a threshold no request reaches. Each request (a context + 15
items, as token ids) is sent to both, one at a time, alternating, so the worker computes one request
per batch. The worker's events (shared/events.py) give its fitted latency model (Profiled) and every batch's
measured compute_ms (BatchDone); the model's prediction for each batch (from its samples and computed
tokens, shared.latency_model) is compared with what was measured.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench.harness.provenance import ROOT
from loadgen.live import wait_ready
from loadgen.stack import deployment_toml
from loadgen.processes import free_port, spawn, stop_all, tail
from shared.events import BatchDone, Profiled, read_events
from shared.request_ids import client_id

NEVER_SHARE = 1_000_000  # a [score] min_shared_prefix_tokens no request reaches


def post(url: str, body: dict, request_id: str) -> tuple[float, dict]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url + "/v1/score", data=data, headers={
        "Content-Type": "application/json", "X-Request-Id": request_id})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.loads(response.read())
    return time.perf_counter() - start, answer


def start(argv: list[str], log: Path) -> subprocess.Popen:
    """`python <argv>` from the repository, its output in `log` (loadgen/processes.spawn)."""
    return spawn([sys.executable, *argv], log, cwd=ROOT)


def measure_e2e(config, artifacts: Path, requests) -> dict:
    from shared.latency_model import LatencyModel

    folder = artifacts.parent.parent / "e2e-shared"
    folder.mkdir(parents=True, exist_ok=True)
    # Seconds-long CPU batches: a bounded profile, no heartbeat timeout during a batch, long deadlines.
    worker = dataclasses.replace(config.worker, endpoints=(f"tcp://127.0.0.1:{free_port()}",), devices=("cpu",),
                                 profile_budget_s=60.0, profile_repeats=1, warmup_runs=1)
    gateway = dataclasses.replace(config.gateway, access_log=False, worker_timeout_ms=600_000,
                                  max_deadline_ms=600_000)
    config = config.replace(worker=worker, gateway=gateway)
    worker_log = folder / "worker.log"
    processes = [start(["-m", "worker", "--config", str(_write(folder / "worker.toml", config)),
                        "--artifacts", str(artifacts)], worker_log)]
    urls, logs = {}, [worker_log]
    for name, threshold in (("shared", config.score.min_shared_prefix_tokens), ("unshared", NEVER_SHARE)):
        port = free_port()
        variant = config.replace(score=dataclasses.replace(config.score, min_shared_prefix_tokens=threshold),
                                 gateway=dataclasses.replace(config.gateway, port=port))
        logs.append(folder / f"gateway-{name}.log")
        processes.append(start(["-m", "gateway", "--config", str(_write(folder / f"{name}.toml", variant)),
                                "--artifacts", str(artifacts)], logs[-1]))
        urls[name] = f"http://127.0.0.1:{port}"
    try:
        for url in urls.values():
            try:
                asyncio.run(wait_ready(url, 900.0))
            except TimeoutError as exc:
                raise RuntimeError(f"{exc}:\n" + "\n".join(tail(p, 1500) for p in logs)) from None
        return _run(urls, requests, worker_log, LatencyModel)
    finally:
        stop_all(reversed(processes), timeout_s=60.0)


def _write(path: Path, config) -> Path:
    path.write_text(deployment_toml(config))
    return path


def _run(urls: dict, requests, worker_log: Path, LatencyModel) -> dict:
    seconds, answers, computed = {name: [] for name in urls}, {name: [] for name in urls}, {}
    for r, (context, items) in enumerate(requests):
        body = {"samples": [{"input_ids": context.tolist() + i.tolist()} for i in items],
                "label_token_ids": [9454, 2152], "output": "logits", "deadline_ms": 600_000}
        for name, url in (list(urls.items()) if r % 2 == 0 else list(urls.items())[::-1]):
            request_id = f"{name}-{r}"
            s, answer = post(url, body, request_id)
            seconds[name].append(s)
            answers[name].append(answer)
            computed[request_id] = (len(context) + sum(len(i) for i in items) if name == "shared"
                                    else sum(len(context) + len(i) for i in items))
    diff = max(abs(a - b) for sa, ua in zip(answers["shared"], answers["unshared"])
               for ra, rb in zip(sa["scores"], ua["scores"]) for a, b in zip(ra, rb))
    profiled = [e for e in read_events(worker_log, Profiled) if e.workload == "score"][-1]
    model = LatencyModel(**profiled.coefficients())
    errors = {"shared": [], "unshared": []}
    for e in read_events(worker_log, BatchDone):
        ids = [client_id(r) for r in e.request_ids]  # one request per batch
        if len(ids) == 1 and ids[0] in computed:
            rid = ids[0]
            predicted = model.predict_batch_ms(15, computed[rid])
            errors[rid.split("-")[0]].append((predicted - e.compute_ms) / e.compute_ms)
    mean = {name: sum(s) / len(s) for name, s in seconds.items()}
    cached = [a["usage"].get("prompt_tokens_details", {}).get("cached_tokens") for a in answers["shared"]]
    return {
        "requests_per_gateway": len(requests), "shared_s_per_request": mean["shared"],
        "unshared_s_per_request": mean["unshared"], "speedup": mean["unshared"] / mean["shared"],
        "max_abs_diff_shared_vs_unshared_scores": diff, "cached_tokens": cached,
        "latency_model": profiled.coefficients(),
        "latency_model_rel_error_shared": errors["shared"], "latency_model_rel_error_unshared": errors["unshared"],
    }
