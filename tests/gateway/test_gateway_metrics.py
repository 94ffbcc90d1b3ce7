"""/metrics: prometheus_client's text format, counters that move once per request, seconds.

Requests are counted by route and outcome; a drop (work taken and not served) is counted once, by
the policy's reason; client errors are never drops.
"""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

import yaml

from gateway.metrics import DROP_REASONS, LATENCY_BUCKETS_S, STAGES, Metrics
from shared.latency_model import LatencyModel
from tests.gateway.conftest import endpoint, start_stack
from tests.gateway.metrics_page import families, sample, scrape
from loadgen.standin_worker import StandInWorker
from tests.gateway.waiting import until

SCORE = "/v1/score"
ROOT = Path(__file__).resolve().parents[2]


def drops(text: str) -> dict[str, float]:
    return {reason: sample(text, "boundserve_drops_total", reason=reason) for reason in DROP_REASONS}


def requests(text: str, outcome: str) -> float | None:
    return sample(text, "boundserve_requests_total", route=SCORE, outcome=outcome)


async def test_the_page_parses_and_counts_ok_400_and_413_as_requests_never_as_drops(stack):
    assert (await stack.post(SCORE, {"samples": ["x"], "labels": ["yes"]}))[0] == 200
    assert (await stack.post(SCORE, {"samples": [""], "labels": ["yes"]}))[0] == 400
    assert (await stack.post(SCORE, {"samples": [{"input_ids": [1] * 513}], "label_token_ids": [1]}))[0] == 413
    text = await scrape(stack)
    page = families(text)
    assert (requests(text, "ok"), requests(text, "invalid_request"), requests(text, "too_large")) == (1, 1, 1)
    assert drops(text) == dict.fromkeys(DROP_REASONS, 0.0)
    assert page["boundserve_requests"].type == "counter" and page["boundserve_drops"].type == "counter"
    stage = page["boundserve_stage_latency_seconds"]
    assert stage.type == "histogram"
    bounds = [float(s.labels["le"]) for s in stage.samples
              if s.name.endswith("_bucket") and s.labels["stage"] == "total"]
    assert bounds == [*LATENCY_BUCKETS_S, float("inf")]
    assert {s.labels["stage"] for s in stage.samples} == set(STAGES)
    assert sample(text, "boundserve_stage_latency_seconds_count", stage="total") == 3
    assert sample(text, "boundserve_stage_latency_seconds_count", stage="tokenize") == 1  # 400 and 413: before
    assert sample(text, "boundserve_batch_fill_ratio_count", workload="score") == 1
    assert sample(text, "boundserve_queue_jobs", workload="score") == 0
    assert sample(text, "boundserve_workers_ready") == 1
    assert "process_cpu_seconds" in page and "python_info" in page  # the process's own metrics


async def test_a_401_is_a_request_not_a_drop(request_tokenizer):
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size).start()
    stack = await start_stack(request_tokenizer, [worker], auth_token="s3cret")
    try:
        assert (await stack.post(SCORE, {"samples": ["x"], "labels": ["yes"]}))[0] == 401
        text = await scrape(stack, Authorization="Bearer s3cret")
        assert requests(text, "unauthorized") == 1
        assert sum(drops(text).values()) == 0
    finally:
        await stack.client.close()
        worker.stop()


async def test_an_expiry_in_the_queue_is_one_drop(request_tokenizer):
    gate = threading.Event()
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=gate).start()
    stack = await start_stack(request_tokenizer, [worker], max_inflight_batches_per_worker=1, max_batch_wait_ms=0.0)
    try:
        blocker = asyncio.create_task(stack.post(SCORE, {"samples": ["x"], "labels": ["yes"], "deadline_ms": 10_000}))
        await until(lambda: worker.requests, what="the worker holding the blocker")
        status, body, _ = await stack.post(SCORE, {"samples": ["y"], "labels": ["yes"], "deadline_ms": 80})
        assert status == 504 and "queue" in body["error"]["message"]
        gate.set()
        assert (await blocker)[0] == 200
        text = await scrape(stack)
        assert requests(text, "deadline_exceeded") == 1 and requests(text, "ok") == 1
        assert drops(text) == {**dict.fromkeys(DROP_REASONS, 0.0), "expired_in_queue": 1.0}
    finally:
        await stack.client.close()
        worker.stop()


async def test_a_predicted_late_drop_is_counted_once_by_its_reason(request_tokenizer):
    """Early refusal off: a 15-sample request (predicted 15 x 100 ms alone) with a 1.2 s deadline is
    queued behind a held batch; once the worker is free it cannot finish in time, and is dropped unsent."""
    per_sample = LatencyModel(0.0, 0.0, 100.0, 0.0)  # 100 ms a sample, and the stand-in takes that for one
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, latency=per_sample,
                           delay_ms=100).start()
    stack = await start_stack(request_tokenizer, [worker], max_inflight_batches_per_worker=1, max_batch_wait_ms=0.0,
                              admission=False)
    try:
        for _ in range(3):  # measured batches confirm the profile: predicted-late drops start
            assert (await stack.post(SCORE, {"samples": ["x"], "labels": ["yes"], "deadline_ms": 10_000}))[0] == 200
        worker.gate = threading.Event()
        blocker = asyncio.create_task(stack.post(SCORE, {"samples": ["b"], "labels": ["yes"], "deadline_ms": 10_000}))
        await until(lambda: len(worker.requests) == 4, what="the worker holding the blocker")
        doomed = asyncio.create_task(stack.post(SCORE, {"samples": ["l"] * 15, "labels": ["yes"],
                                                        "deadline_ms": 1_200}))
        await until(lambda: stack.gateway.batchers["score"].queued_jobs == 1, what="the doomed request queued")
        worker.gate.set()
        status, body, _ = await doomed
        assert status == 504 and "past its deadline" in body["error"]["message"], body
        assert (await blocker)[0] == 200
        assert len(worker.requests) == 4  # never sent
        text = await scrape(stack)
        assert requests(text, "deadline_exceeded") == 1
        assert drops(text) == {**dict.fromkeys(DROP_REASONS, 0.0), "predicted_late": 1.0}
    finally:
        await stack.client.close()
        worker.stop()


async def test_every_series_the_prometheus_rules_name_is_on_the_page(stack):
    config = yaml.safe_load((ROOT / "configs/prometheus.yml").read_text())
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert "./configs/prometheus-rules.yml:/etc/prometheus/rules.yml:ro" in compose["services"]["prometheus"]["volumes"]
    assert config["rule_files"] == ["/etc/prometheus/rules.yml"]
    rules = yaml.safe_load((ROOT / "configs/prometheus-rules.yml").read_text())
    named = {name for group in rules["groups"] for rule in group["rules"]
             for name in re.findall(r"\bboundserve_[a-z_]+", rule["expr"])}
    assert (await stack.post(SCORE, {"samples": ["x"], "labels": ["yes"]}))[0] == 200
    on_page = {s.name for family in families(await scrape(stack)).values() for s in family.samples}
    assert named and named <= on_page, named - on_page


def test_each_gateway_has_its_own_registry():
    first, second = Metrics(), Metrics()  # the global registry would refuse the second set of names
    first.count_request(SCORE, "ok")
    assert first.value("boundserve_requests_total", route=SCORE, outcome="ok") == 1
    assert second.value("boundserve_requests_total", route=SCORE, outcome="ok") == 0
