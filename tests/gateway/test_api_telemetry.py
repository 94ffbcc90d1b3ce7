"""OpenTelemetry traces of work requests: the spans the SDK's in-memory exporter receives (a caller's
traceparent continued, every stage of the request, the batch and the worker's timings, the drop reason
of a dropped request), the traceparent that reaches the worker in the wire message, OTLP/HTTP export to
a receiver decoding the protobuf, and tracing off by default with nothing of OpenTelemetry imported."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.app import GATEWAY, make_app
from gateway.telemetry import OFF
from gateway.wiring import Settings
from loadgen.standin_worker import StandInWorker, standin_manifest
from shared.config import TelemetryConfig
from tests.gateway.conftest import Stack, deployment, endpoint, wait_ready
from loadgen.processes import free_port
from tests.gateway.waiting import until

ROOT = Path(__file__).resolve().parents[2]
CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
RERANK = {"query": "red running shoe", "documents": ["blue phone case", "red shoe", "cheap coffee"]}


@contextlib.asynccontextmanager
async def traced_stack(request_tokenizer, telemetry=TelemetryConfig(), exporter=None, gate=None, **gateway):
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=gate).start()
    config = deployment([worker.endpoint], **gateway).replace(telemetry=telemetry)
    settings = Settings(config, standin_manifest(request_tokenizer.vocab_size), request_tokenizer,
                        span_exporter=exporter)
    client = TestClient(TestServer(make_app(settings)))
    await client.start_server()
    stack = Stack(client, [worker])
    try:
        await wait_ready(stack)
        yield stack
    finally:
        if gate is not None:
            gate.set()
        await client.close()
        worker.stop()


def by_name(spans) -> dict[str, list]:
    named: dict[str, list] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


async def test_a_traced_request_has_a_span_per_stage_under_the_callers_trace(request_tokenizer):
    exporter = InMemorySpanExporter()
    async with traced_stack(request_tokenizer, exporter=exporter) as stack:
        status, body, _ = await stack.post("/v1/rerank", RERANK, headers={"traceparent": TRACEPARENT})
        assert status == 200, body
        [received] = stack.workers[0].requests
    spans = by_name(exporter.get_finished_spans())
    [root] = spans.pop("POST /v1/rerank")
    assert f"{root.context.trace_id:032x}" == CALLER_TRACE and f"{root.parent.span_id:016x}" == CALLER_SPAN
    assert root.attributes["http.response.status_code"] == 200
    assert set(spans) == {"receive", "tokenize", "admission", "queue wait", "batch", "worker queue", "compute",
                          "answer"}
    assert all(s.context.trace_id == root.context.trace_id for group in spans.values() for s in group)
    [batch] = spans["batch"]
    for name in ("receive", "tokenize", "admission", "queue wait", "batch", "answer"):
        assert [s.parent.span_id for s in spans[name]] == [root.context.span_id], name
    for name in ("worker queue", "compute"):
        assert [s.parent.span_id for s in spans[name]] == [batch.context.span_id], name
    assert batch.attributes["boundserve.batch.items"] == 3 and batch.attributes["boundserve.batch.jobs"] == 1
    assert batch.attributes["boundserve.batch.predicted_ms"] >= 0 and batch.attributes["boundserve.status"] == "ok"
    assert "boundserve.batch.predicted_service_ms" in batch.attributes
    assert received.traceparent == f"00-{CALLER_TRACE}-{batch.context.span_id:016x}-01"  # on the wire
    ordered = [spans[n][0] for n in ("receive", "tokenize", "admission", "queue wait", "batch", "answer")]
    # in order (to the 1 ms clock): each starts and ends no earlier than the one before; they may overlap
    # where admission's last act is to enqueue the job, which starts its queue wait
    for a, b in zip(ordered, ordered[1:]):
        assert a.start_time <= b.start_time + 1_000_000 and a.end_time <= b.end_time + 1_000_000, (a.name, b.name)
    assert root.start_time <= ordered[0].start_time and ordered[-1].end_time <= root.end_time


async def test_a_request_dropped_in_the_queue_carries_its_drop_reason(request_tokenizer):
    exporter, gate = InMemorySpanExporter(), threading.Event()
    # admission off: the request must reach the queue and be dropped there (with it on, a loop slowed by
    # the earlier tests' work widens the admission margin past the 300 ms and refuses it at the door)
    async with traced_stack(request_tokenizer, exporter=exporter, gate=gate, max_inflight_batches_per_worker=1,
                            max_batch_wait_ms=0.0, admission=False) as stack:
        first = asyncio.create_task(stack.post("/v1/score", {"samples": ["x"], "labels": ["yes"],
                                                             "deadline_ms": 30_000}))
        await until(lambda: stack.workers[0].requests, what="the worker holding the first request")
        status, body, _ = await stack.post("/rerank", {"query": "red shoe", "texts": ["a"], "deadline_ms": 300})
        assert status == 504 and body["error"]["code"] == "deadline_exceeded", body
        gate.set()
        assert (await first)[0] == 200
    [root] = [s for s in exporter.get_finished_spans() if s.name == "POST /rerank"]
    assert root.attributes["boundserve.error.code"] == "deadline_exceeded"
    reason = root.attributes["boundserve.drop_reason"]
    assert reason in ("expired_in_queue", "predicted_late") and not root.status.is_ok
    queued = [s for s in exporter.get_finished_spans() if s.name == "queue wait"
              and s.context.trace_id == root.context.trace_id]
    assert [s.attributes["boundserve.drop_reason"] for s in queued] == [reason]


class Receiver:
    """An OTLP/HTTP traces endpoint on a thread and event loop of its own (the exporter posts from its
    thread while the gateway's loop may be waiting on it), decoding each export's protobuf."""

    def __init__(self) -> None:
        self.port, self.requests, self.got = free_port(), [], threading.Event()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    async def _traces(self, request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        self.requests.append((request.headers.get("Content-Type"), message))
        self.got.set()
        return web.Response(body=b"", content_type="application/x-protobuf")

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._started.set()
        self._loop.run_forever()

    def __enter__(self) -> Receiver:
        self._thread.start()
        self._started.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


async def test_spans_are_exported_over_otlp_http_as_protobuf(request_tokenizer):
    with Receiver() as receiver:
        config = TelemetryConfig(enabled=True, endpoint=f"http://127.0.0.1:{receiver.port}/v1/traces",
                                 service_name="gateway-under-test")
        async with traced_stack(request_tokenizer, telemetry=config) as stack:
            exporter_process = stack.client.app[GATEWAY].telemetry.export.process
            status, body, _ = await stack.post("/v1/embeddings", {"input": ["red shoe"]},
                                               headers={"traceparent": TRACEPARENT})
            assert status == 200, body
        # the gateway stopped: its exporter process posted what it held, then ended
        assert receiver.got.is_set()
        assert exporter_process.poll() == 0
    content_type, export = receiver.requests[0]
    assert content_type == "application/x-protobuf"
    [resource_spans] = export.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"]
    assert service == "gateway-under-test"
    spans = [s for scope in resource_spans.scope_spans for s in scope.spans]
    names = {s.name for s in spans}
    assert {"POST /v1/embeddings", "receive", "tokenize", "batch", "compute", "answer"} <= names
    assert {s.trace_id.hex() for s in spans} == {CALLER_TRACE}


async def test_a_sample_ratio_of_zero_traces_only_what_callers_sample(request_tokenizer):
    exporter = InMemorySpanExporter()
    unsampled = TRACEPARENT[:-2] + "00"
    async with traced_stack(request_tokenizer, telemetry=TelemetryConfig(sample_ratio=0.0), exporter=exporter) as stack:
        for headers in ({}, {"traceparent": unsampled}, {"traceparent": TRACEPARENT}):
            status, body, _ = await stack.post("/v1/rerank", RERANK, headers=headers)
            assert status == 200, body
        assert [r.traceparent for r in stack.workers[0].requests][:2] == ["", ""]  # nothing recorded, nothing sent
    [root] = [s for s in exporter.get_finished_spans() if s.name == "POST /v1/rerank"]
    assert f"{root.context.trace_id:032x}" == CALLER_TRACE  # the caller's sampled trace, whole
    assert {s.context.trace_id for s in exporter.get_finished_spans()} == {root.context.trace_id}


async def test_a_malformed_traceparent_starts_a_trace_of_its_own(request_tokenizer):
    exporter = InMemorySpanExporter()
    async with traced_stack(request_tokenizer, exporter=exporter) as stack:
        status, body, _ = await stack.post("/v1/rerank", RERANK, headers={"traceparent": f"00-{CALLER_TRACE}-zz-01"})
        assert status == 200, body
        [received] = stack.workers[0].requests
    [root] = [s for s in exporter.get_finished_spans() if s.name == "POST /v1/rerank"]
    assert root.parent is None and f"{root.context.trace_id:032x}" != CALLER_TRACE
    assert received.traceparent.startswith(f"00-{root.context.trace_id:032x}-")


async def test_tracing_is_off_by_default(request_tokenizer):
    async with traced_stack(request_tokenizer) as stack:
        assert stack.client.app[GATEWAY].telemetry is OFF
        status, _, _ = await stack.post("/v1/rerank", RERANK, headers={"traceparent": TRACEPARENT})
        assert status == 200
        assert stack.workers[0].requests[0].traceparent == ""  # nothing traced, nothing sent
    script = ("import sys; from gateway.app import make_app; from gateway.telemetry import Telemetry; "
              "from shared.config import TelemetryConfig; Telemetry.of(TelemetryConfig()); "
              "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
