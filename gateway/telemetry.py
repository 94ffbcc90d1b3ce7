"""OpenTelemetry traces of the gateway's work requests, exported over OTLP/HTTP ([telemetry] in the config).

Off (the default) the gateway holds `OFF`: every hook is a method that returns at once, no span is
made and OpenTelemetry is never imported. On, each sampled request to a work route is one trace:

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

What it costs: the event loop only appends each finished span as a tuple (name, ids, times in
nanoseconds, attributes) to its request's trace, and at the request's end hands the whole trace to
gateway/trace_export.py, which sends it to an exporter process of the gateway's own; there the
tuples become the SDK's spans, are encoded as protobuf and posted. The OpenTelemetry SDK's own
spans cost the loop about 35 us each (ids through its sampler, a lock, attribute validation), and
its batch processor encodes on a thread of the gateway that takes the loop's interpreter lock. A
request not sampled ([telemetry] sample_ratio, gateway/trace_context.py) costs one random draw.

Times: the gateway's clock is the event loop's (monotonic seconds); a trace maps it to wall-clock
nanoseconds once, when it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from gateway.errors import ApiError
from gateway.trace_context import CallerContext, RatioSampler, caller_context, new_span_id, new_trace_id, traceparent
from gateway.trace_export import ERROR, UNSET, ExportNow, ExportProcess, Exporter, check_installed
from shared.config import TelemetryConfig
from shared.request_ids import CHUNK_SEPARATOR, is_chunk

CURRENT: contextvars.ContextVar[RequestTrace | None] = contextvars.ContextVar("boundserve_trace", default=None)
"""The trace of the request whose handler runs in this task (None: none, or not traced)."""


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
    """One request's trace: its server span and the finished spans under it, as tuples in
    gateway/trace_export.py's layout (see the module docstring)."""

    def __init__(self, trace_id: int, caller: CallerContext | None, name: str, clock: Callable[[], float],
                 offset_ns: int, arrived: float, attributes: dict[str, Any]) -> None:
        """`offset_ns`: wall-clock nanoseconds at the loop clock's zero; `arrived`: loop seconds."""
        self.trace_id, self.caller, self.name, self.clock = trace_id, caller, name, clock
        self.span_id = new_span_id()
        """The request (server) span's id: the parent of every other span but those under `batch`."""
        self._offset_ns, self._start_ns = offset_ns, offset_ns + int(arrived * 1e9)
        self.attributes = attributes
        """The request span's attributes, filled as the request goes."""
        self.spans: list[tuple] = []
        self.batches: dict[str, tuple[int, int, dict[str, Any]]] = {}
        """job id -> its open batch span (id, start ns, attributes): sent, not yet answered."""
        self.wire_id: str | None = None
        self.sent = 0
        self.admitted_at: float | None = None

    def ns(self, at: float) -> int:
        return self._offset_ns + int(at * 1e9)

    def span(self, name: str, start: float, end: float, parent: int | None = None, **attributes: Any) -> int:
        """A finished child span (of the request, or of the span whose id is `parent`) from `start` to
        `end` (loop seconds); returns its id."""
        if name == "admission":
            self.admitted_at = end
        span_id = new_span_id()
        self.spans.append((name, span_id, parent or self.span_id, self.ns(start), self.ns(end),
                           {k: v for k, v in attributes.items() if v is not None}, UNSET, ""))
        return span_id

    def batch_sent(self, job: Any, batch_id: int, size: tuple[int, int, int], predicted_ms: float,
                   worker: str, now: float) -> str:
        """The job's queue wait ends and its batch span starts; returns the traceparent for the wire.
        `size`: the batch's (jobs, samples or beams, tokens)."""
        self.span("queue wait", job.enqueued_at or now, now, **{"boundserve.job": job.request_id})
        span_id = new_span_id()
        self.batches[job.request_id] = (span_id, self.ns(now), {
            "boundserve.job": job.request_id, "boundserve.batch.id": batch_id, "boundserve.batch.jobs": size[0],
            "boundserve.batch.items": size[1], "boundserve.batch.tokens": size[2],
            "boundserve.batch.predicted_ms": round(predicted_ms, 3), "boundserve.worker": worker})
        self.sent += 1
        return traceparent(self.trace_id, span_id)

    def _end_batch(self, job_id: str, status: str, now: float) -> int | None:
        """The job's batch span ended now with `status`; its id (None: it had none open)."""
        opened = self.batches.pop(job_id, None)
        if opened is None:
            return None
        span_id, start_ns, attributes = opened
        attributes["boundserve.status"] = status
        self.spans.append(("batch", span_id, self.span_id, start_ns, self.ns(now), attributes, UNSET, ""))
        return span_id

    def batch_unsent(self, job_id: str, now: float) -> None:
        """The batch could not be sent (the socket would block): the job stays queued and is sent later."""
        if self._end_batch(job_id, "not_sent", now) is not None:
            self.sent -= 1

    def batch_answered(self, job: Any, queue_ms: float, compute_ms: float, status: str, now: float) -> None:
        """The job's batch answered: the worker's queue wait and compute under its batch span, and the
        prediction it was sent with (the batcher's Prediction: the worker's backlog and the service)."""
        opened = self.batches.get(job.request_id)
        if opened is None:
            return
        prediction = job.dispatched
        if prediction is not None:
            opened[2]["boundserve.batch.predicted_wait_ms"] = round(prediction.wait_ms, 3)
            opened[2]["boundserve.batch.predicted_service_ms"] = round(prediction.service_ms, 3)
        span_id = self._end_batch(job.request_id, status, now)
        compute_start = now - compute_ms / 1000.0
        self.span("worker queue", compute_start - queue_ms / 1000.0, compute_start, parent=span_id,
                  **{"boundserve.worker.queue_ms": round(queue_ms, 3)})
        self.span("compute", compute_start, now, parent=span_id, **{
            "boundserve.compute_ms": round(compute_ms, 3), "boundserve.compute_share_ms": round(job.compute_ms, 3)})

    def end(self, error: BaseException | None, now: float) -> tuple:
        """The request's end: its status, and for a failure its code and drop reason, on the request
        span (and on a queue wait that never reached a worker); returns the whole trace, in
        gateway/trace_export.py's layout, to export."""
        for job_id in list(self.batches):  # sent, never answered (the worker was lost, the client left)
            self._end_batch(job_id, "unanswered", now)
        status, description = UNSET, ""
        if isinstance(error, ApiError):
            self.attributes["http.response.status_code"] = error.status
            self.attributes["boundserve.error.code"] = error.code
            if error.drop_reason is not None:
                self.attributes["boundserve.drop_reason"] = error.drop_reason
                if self.sent == 0 and self.admitted_at is not None:
                    self.span("queue wait", self.admitted_at, now, **{"boundserve.drop_reason": error.drop_reason})
            status, description = ERROR, error.message[:256]
        elif error is not None:  # the client left (the handler cancelled), or a bug (the middleware's 500)
            code = "client_closed" if isinstance(error, asyncio.CancelledError) else "internal"
            self.attributes["boundserve.error.code"] = code
            status, description = ERROR, code
        else:
            self.attributes["http.response.status_code"] = 200
        self.spans.append((self.name, self.span_id, 0, self._start_ns, self.ns(now), self.attributes, status,
                           description))
        caller = self.caller
        return (self.trace_id.to_bytes(16, "big"), caller.span_id if caller else 0,
                caller.tracestate if caller else "", self.spans)


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

    def start(self) -> None:
        return None

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


class Telemetry:
    """Tracing on: the sampler, where finished traces go (gateway/trace_export.py), and the traces of
    the requests in progress, by wire id."""

    enabled = True

    def __init__(self, export: Exporter, sampler: RatioSampler) -> None:
        self.export, self.sampler = export, sampler
        self.traces: dict[str, RequestTrace] = {}

    @classmethod
    def of(cls, config: TelemetryConfig, exporter: Any = None) -> Telemetry | _Off:
        """OFF unless `config.enabled` or an `exporter` is given (tests: the SDK's in-memory one, each
        trace exported as it ends, in this process); else OTLP/HTTP to `config.endpoint` from the
        exporter process, started by `start`."""
        if not config.enabled and exporter is None:
            return OFF
        check_installed()
        sampler = RatioSampler(config.sample_ratio)
        if exporter is not None:
            return cls(ExportNow(exporter, config.service_name), sampler)
        return cls(ExportProcess(config), sampler)

    def start(self) -> None:
        """Start the exporter process (the gateway's start: constructors only wire)."""
        self.export.start()

    @contextlib.contextmanager
    def request(self, method: str, route: str, headers: Mapping[str, str], arrived: float,
                clock: Callable[[], float]) -> Iterator[RequestTrace | None]:
        """The request's trace from `arrived` (loop seconds) to the end of the block, the current one
        in this task meanwhile; a caller's traceparent header makes it a child of the caller's span.
        None (nothing recorded) for a request the sampler leaves out."""
        caller = caller_context(headers)
        trace_id = caller.trace_id if caller is not None else new_trace_id()
        if not self.sampler.sampled(trace_id, caller):
            yield None
            return
        trace = RequestTrace(trace_id, caller, f"{method} {route}", clock, time.time_ns() - int(clock() * 1e9),
                             arrived, {"http.request.method": method, "http.route": route})
        token = CURRENT.set(trace)
        error: BaseException | None = None
        try:
            yield trace
        except BaseException as raised:
            error = raised
            raise
        finally:
            CURRENT.reset(token)
            if trace.wire_id is not None:
                self.traces.pop(trace.wire_id, None)
            self.export.ship(trace.end(error, clock()))

    def bind(self, wire_id: str, trace: RequestTrace | None) -> None:
        """The request's wire id, by which the worker links find its trace."""
        if trace is not None:
            trace.wire_id = wire_id
            trace.attributes["boundserve.request_id"] = wire_id
            self.traces[wire_id] = trace

    def trace_of(self, job_id: str) -> RequestTrace | None:
        return self.traces.get(request_of(job_id))

    def shutdown(self) -> None:
        """Export what is held (within the export timeout) and stop."""
        self.export.close()
