"""OpenTelemetry traces of the gateway's work requests, exported over OTLP/HTTP ([telemetry] in the config).

Off (the default) the gateway holds `OFF`: every hook is a method that returns at once, no span is
made and OpenTelemetry is never imported. On, each request to a work route is one trace:

    POST /v1/rerank (server span: status, error code, drop reason)
    ├── receive        arrival to a parsed body (reading, decompressing, decoding)
    ├── tokenize       the request's texts to token ids
    ├── admission      the admission decision
    ├── queue wait     per job (a request or one chunk of a split one): enqueued to sent, or to its drop
    ├── batch          per job: sent to answered; the batch's id, jobs, samples, tokens, predicted ms, worker
    │   ├── worker queue   the worker's own queue wait (its ScoreResults.queue_ms)
    │   └── compute        the model call (compute_ms), the job's share of it
    └── answer         the answer written as JSON

A caller's W3C `traceparent` header makes the request span its child; each job's `traceparent` (of
its batch span) travels to the worker in the wire message (shared/protocol ScoreRequest/BeamRequest).
The worker does not export spans itself: it already measures its queue wait and compute and sends
them back in every answer, so the gateway writes those two spans from the answer, placed back from
the moment the answer arrived (the worker's clock is not the gateway's; the gap between `batch`'s
start and `worker queue`'s is the transfer). That keeps the workers' hot loop free of an exporter,
its threads and its network I/O, and one process holds the trace backend's address.

Times: the gateway's clock is the event loop's (monotonic seconds); a trace maps it to wall-clock
nanoseconds once, when it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import ApiError
from shared.config import TelemetryConfig
from shared.request_ids import CHUNK_SEPARATOR, is_chunk

CURRENT: contextvars.ContextVar[RequestTrace | None] = contextvars.ContextVar("boundserve_trace", default=None)
"""The trace of the request whose handler runs in this task (None: none, or tracing is off)."""


def stage_ended(stage: str, ms: float) -> None:
    """A stage of the current request (tokenize, admission) that ended now after `ms`; called where
    gateway/metrics.py observes it, so the services need no hook of their own."""
    trace = CURRENT.get()
    if trace is not None:
        now = trace.clock()
        trace.span(stage, now - ms / 1000.0, now)


def request_of(job_id: str) -> str:
    """The wire id of the request a job belongs to (a chunk's id less its `#k`)."""
    return job_id.rpartition(CHUNK_SEPARATOR)[0] if is_chunk(job_id) else job_id


class RequestTrace:
    """One request's trace: its server span and the spans under it (see the module docstring)."""

    def __init__(self, tracer: Any, root: Any, clock: Callable[[], float], offset_ns: int) -> None:
        """`offset_ns`: wall-clock nanoseconds at the loop clock's zero (the root span's own)."""
        from opentelemetry import trace

        self._tracer, self.root, self._trace, self.clock = tracer, root, trace, clock
        self.wire_id: str | None = None
        self._offset_ns = offset_ns
        self._context = trace.set_span_in_context(root)
        self.batches: dict[str, Any] = {}
        """job id -> its open batch span (sent, not yet answered)."""
        self.sent = 0
        self.admitted_at: float | None = None

    def ns(self, at: float) -> int:
        return self._offset_ns + int(at * 1e9)

    def span(self, name: str, start: float, end: float, parent: Any = None, **attributes: Any) -> Any:
        """A finished child span (of the request, or of `parent`) from `start` to `end` (loop seconds)."""
        if name == "admission":
            self.admitted_at = end
        context = self._context if parent is None else self._trace.set_span_in_context(parent)
        span = self._tracer.start_span(name, context=context, start_time=self.ns(start),
                                       attributes={k: v for k, v in attributes.items() if v is not None})
        span.end(end_time=self.ns(end))
        return span

    def batch_sent(self, job: Any, batch_id: int, size: tuple[int, int, int], predicted_ms: float,
                   worker: str, now: float) -> str:
        """The job's queue wait ends and its batch span starts; returns the traceparent for the wire.
        `size`: the batch's (jobs, samples or beams, tokens)."""
        self.span("queue wait", job.enqueued_at or now, now, **{"boundserve.job": job.request_id})
        span = self._tracer.start_span("batch", context=self._context, start_time=self.ns(now), attributes={
            "boundserve.job": job.request_id, "boundserve.batch.id": batch_id, "boundserve.batch.jobs": size[0],
            "boundserve.batch.items": size[1], "boundserve.batch.tokens": size[2],
            "boundserve.batch.predicted_ms": round(predicted_ms, 3), "boundserve.worker": worker})
        self.batches[job.request_id] = span
        self.sent += 1
        return traceparent(span)

    def batch_unsent(self, job_id: str, now: float) -> None:
        """The batch could not be sent (the socket would block): the job stays queued and is sent later."""
        span = self.batches.pop(job_id, None)
        if span is not None:
            self.sent -= 1
            span.set_attribute("boundserve.status", "not_sent")
            span.end(end_time=self.ns(now))

    def batch_answered(self, job: Any, queue_ms: float, compute_ms: float, status: str, now: float) -> None:
        """The job's batch answered: the worker's queue wait and compute under its batch span, and the
        prediction it was sent with (the batcher's Prediction: the worker's backlog and the service)."""
        span = self.batches.pop(job.request_id, None)
        if span is None:
            return
        share_ms, prediction = job.compute_ms, job.dispatched
        if prediction is not None:
            span.set_attributes({"boundserve.batch.predicted_wait_ms": round(prediction.wait_ms, 3),
                                 "boundserve.batch.predicted_service_ms": round(prediction.service_ms, 3)})
        compute_start = now - compute_ms / 1000.0
        self.span("worker queue", compute_start - queue_ms / 1000.0, compute_start, parent=span,
                  **{"boundserve.worker.queue_ms": round(queue_ms, 3)})
        self.span("compute", compute_start, now, parent=span, **{"boundserve.compute_ms": round(compute_ms, 3),
                                                                 "boundserve.compute_share_ms": round(share_ms, 3)})
        span.set_attribute("boundserve.status", status)
        span.end(end_time=self.ns(now))

    def end(self, error: BaseException | None, now: float) -> None:
        """The request's end: its status, and for a failure its code and drop reason, on the request
        span (and on a queue wait that never reached a worker)."""
        from opentelemetry.trace import Status, StatusCode

        for span in self.batches.values():  # sent, never answered (the worker was lost, the client left)
            span.set_attribute("boundserve.status", "unanswered")
            span.end(end_time=self.ns(now))
        if isinstance(error, ApiError):
            self.root.set_attribute("http.response.status_code", error.status)
            self.root.set_attribute("boundserve.error.code", error.code)
            if error.drop_reason is not None:
                self.root.set_attribute("boundserve.drop_reason", error.drop_reason)
                if self.sent == 0 and self.admitted_at is not None:
                    self.span("queue wait", self.admitted_at, now, **{"boundserve.drop_reason": error.drop_reason})
            self.root.set_status(Status(StatusCode.ERROR, error.message[:256]))
        elif error is not None:  # the client left (the handler cancelled), or a bug (the middleware's 500)
            code = "client_closed" if isinstance(error, asyncio.CancelledError) else "internal"
            self.root.set_attribute("boundserve.error.code", code)
            self.root.set_status(Status(StatusCode.ERROR, code))
        else:
            self.root.set_attribute("http.response.status_code", 200)
        self.root.end(end_time=self.ns(now))


def traceparent(span: Any) -> str:
    """A span's W3C traceparent: version 00, trace id, span id, flags."""
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


class _NoTrace:
    """The context of a request not traced: enters as None, leaves nothing behind."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


_NO_TRACE = _NoTrace()


class _Off:
    """Tracing off: every hook returns at once (a request's context is one shared object)."""

    enabled = False

    def request(self, method: str, route: str, headers: Mapping[str, str], arrived: float,
                clock: Callable[[], float]) -> _NoTrace:
        return _NO_TRACE

    def bind(self, wire_id: str, trace: RequestTrace | None) -> None:
        return None

    def trace_of(self, job_id: str) -> RequestTrace | None:
        return None

    def shutdown(self) -> None:
        return None


OFF = _Off()


@dataclass
class Telemetry:
    """Tracing on: a tracer provider of this gateway's own (never the process-wide one) exporting
    through `processor`, and the traces of the requests in progress, by wire id."""

    provider: Any
    tracer: Any
    propagator: Any
    traces: dict[str, RequestTrace] = field(default_factory=dict)
    enabled: bool = True

    @classmethod
    def of(cls, config: TelemetryConfig, exporter: Any = None) -> Telemetry | _Off:
        """OFF unless `config.enabled` or an `exporter` is given (tests: the SDK's in-memory one,
        exported span by span); else OTLP/HTTP to `config.endpoint` in batches."""
        if not config.enabled and exporter is None:
            return OFF
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError as exc:
            raise RuntimeError(f"[telemetry] enabled = true needs OpenTelemetry's SDK and OTLP exporter: "
                               f"pip install 'boundserve[telemetry]' ({exc})") from None
        provider = TracerProvider(resource=Resource.create({"service.name": config.service_name}))
        if exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            otlp = OTLPSpanExporter(endpoint=config.endpoint, timeout=config.export_timeout_ms / 1000.0)
            provider.add_span_processor(BatchSpanProcessor(otlp, max_queue_size=config.max_queue_spans,
                                                           export_timeout_millis=config.export_timeout_ms))
        return cls(provider, provider.get_tracer("boundserve.gateway"), TraceContextTextMapPropagator())

    @contextlib.contextmanager
    def request(self, method: str, route: str, headers: Mapping[str, str], arrived: float,
                clock: Callable[[], float]) -> Iterator[RequestTrace]:
        """The request's trace from `arrived` (loop seconds) to the end of the block, the current one
        in this task meanwhile; a caller's traceparent header makes it a child of the caller's span."""
        from opentelemetry.trace import SpanKind

        parent = self.propagator.extract(carrier={k.lower(): v for k, v in headers.items()
                                                  if k.lower() in ("traceparent", "tracestate")})
        offset_ns = time.time_ns() - int(clock() * 1e9)
        root = self.tracer.start_span(f"{method} {route}", context=parent, kind=SpanKind.SERVER,
                                      start_time=offset_ns + int(arrived * 1e9),
                                      attributes={"http.request.method": method, "http.route": route})
        trace = RequestTrace(self.tracer, root, clock, offset_ns)
        token = CURRENT.set(trace)
        try:
            yield trace
        except BaseException as error:
            trace.end(error, clock())
            raise
        else:
            trace.end(None, clock())
        finally:
            CURRENT.reset(token)
            if trace.wire_id is not None:
                self.traces.pop(trace.wire_id, None)

    def bind(self, wire_id: str, trace: RequestTrace | None) -> None:
        """The request's wire id, by which the worker links find its trace."""
        if trace is not None:
            trace.wire_id = wire_id
            trace.root.set_attribute("boundserve.request_id", wire_id)
            self.traces[wire_id] = trace

    def trace_of(self, job_id: str) -> RequestTrace | None:
        return self.traces.get(request_of(job_id))

    def shutdown(self) -> None:
        """Export what is held (within the exporter's timeout) and stop."""
        self.provider.shutdown()
