"""Where the gateway's finished traces go: the OpenTelemetry SDK's spans, built from the plain tuples
gateway/telemetry.py records, handed to an exporter (gateway/telemetry.py's docstring says why).

A trace, as recorded and as sent between processes (msgpack):

    (trace id: 16 bytes big-endian, the caller's span id (0: none), the caller's tracestate ("": none),
     [(name, span id, parent span id (0: the request span, whose parent is the caller's),
       start ns, end ns, attributes, status code (UNSET/ERROR), status description), ...])

Two ways out. `ExportProcess` (the gateway, [telemetry] enabled): each trace goes, as one message that
never blocks, to an exporter process of the gateway's own (`python -m gateway.trace_export`), which
builds the spans, encodes them and posts them over OTLP/HTTP in batches, so the encoding and the
network I/O take none of the event loop's interpreter lock. `ExportNow` (tests, with the SDK's
in-memory exporter): each trace exported in this process as it ends.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any, Protocol

import msgpack
import zmq

from shared.config import TelemetryConfig

log = logging.getLogger(__name__)

UNSET, ERROR = 0, 2
"""Status codes as OpenTelemetry numbers them (StatusCode.UNSET, StatusCode.ERROR)."""
SCOPE = "boundserve.gateway"
IN_FLIGHT_TRACES = 1024
"""Traces the gateway's socket holds for the exporter process before new ones are dropped (never blocking)."""
EXPORT_BATCH_SPANS = 512
EXPORT_DELAY_S = 0.5
"""The exporter process posts every EXPORT_DELAY_S, or sooner once EXPORT_BATCH_SPANS are held."""


def check_installed() -> None:
    """Tracing needs OpenTelemetry's SDK and OTLP/HTTP exporter: say so at start, not at the first trace."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(f"[telemetry] enabled = true needs OpenTelemetry's SDK and OTLP exporter: "
                           f"pip install 'boundserve[telemetry]' ({exc})") from None


class Exporter(Protocol):
    def start(self) -> None: ...
    def ship(self, trace: tuple) -> None: ...
    def close(self) -> None: ...


class SpanBuilder:
    """Traces (the layout above) to the SDK's ReadableSpans, under this gateway's resource and scope."""

    def __init__(self, service_name: str) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, TraceFlags, TraceState
        from opentelemetry.trace.status import Status, StatusCode

        self._resource = Resource.create({"service.name": service_name})
        self._scope = InstrumentationScope(SCOPE)
        self._span, self._context, self._state = ReadableSpan, SpanContext, TraceState
        self._kinds = (SpanKind.INTERNAL, SpanKind.SERVER)
        self._flags = TraceFlags(TraceFlags.SAMPLED)
        self._statuses = {UNSET: Status(StatusCode.UNSET)}
        self._status, self._error = Status, StatusCode.ERROR

    def spans(self, trace: Sequence[Any]) -> list[Any]:
        trace_bytes, caller_span_id, tracestate, records = trace
        trace_id = int.from_bytes(trace_bytes, "big")
        state = self._state.from_header([tracestate]) if tracestate else None
        caller = (self._context(trace_id, caller_span_id, True, self._flags, state) if caller_span_id else None)
        built = []
        for name, span_id, parent_id, start_ns, end_ns, attributes, status, description in records:
            parent = self._context(trace_id, parent_id, False, self._flags, state) if parent_id else caller
            built.append(self._span(
                name, self._context(trace_id, span_id, False, self._flags, state), parent, self._resource,
                attributes, kind=self._kinds[parent_id == 0], start_time=start_ns, end_time=end_ns,
                status=self._statuses[UNSET] if status == UNSET else self._status(self._error, description),
                instrumentation_scope=self._scope))
        return built


class ExportNow:
    """Each trace exported by `exporter` (an SDK SpanExporter) in this process, as it ends (tests)."""

    def __init__(self, exporter: Any, service_name: str) -> None:
        self._exporter, self._builder = exporter, SpanBuilder(service_name)

    def start(self) -> None:
        return None

    def ship(self, trace: tuple) -> None:
        self._exporter.export(self._builder.spans(trace))

    def close(self) -> None:
        self._exporter.shutdown()


class ExportProcess:
    """The exporter process and the socket to it; owns both (`start` starts, `close` flushes and stops)."""

    def __init__(self, config: TelemetryConfig) -> None:
        self.config = config
        self.dropped_traces = 0
        """Traces dropped because the exporter process was IN_FLIGHT_TRACES behind (never blocking the loop)."""
        self._folder: str | None = None
        self._context: zmq.Context | None = None
        self._socket: zmq.Socket | None = None
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self._folder = tempfile.mkdtemp(prefix="boundserve-trace-")
        endpoint = f"ipc://{self._folder}/spans"
        c = self.config
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gateway.trace_export", "--receive", endpoint, "--to", c.endpoint,
             "--service-name", c.service_name, "--export-timeout-ms", str(c.export_timeout_ms),
             "--max-queue-spans", str(c.max_queue_spans)], stdin=subprocess.DEVNULL)
        self._context = zmq.Context(1)
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, IN_FLIGHT_TRACES)
        self._socket.connect(endpoint)  # held here until the process binds: nothing of the first requests is lost

    def ship(self, trace: tuple) -> None:
        try:
            self._socket.send(msgpack.packb(trace), zmq.NOBLOCK)  # type: ignore[union-attr]
        except zmq.Again:
            self.dropped_traces += 1
            if self.dropped_traces & (self.dropped_traces - 1) == 0:  # 1, 2, 4, ...: said, never flooding the log
                log.warning("the trace exporter is %d traces behind: %d traces dropped so far",
                            IN_FLIGHT_TRACES, self.dropped_traces)

    def close(self) -> None:
        """An empty message asks the process to post what it holds and exit (within the export timeout)."""
        if self.process is None:
            return
        timeout_s = self.config.export_timeout_ms / 1000.0
        try:
            self._socket.setsockopt(zmq.SNDTIMEO, int(timeout_s * 1000))  # type: ignore[union-attr]
            self._socket.send(b"")  # behind the traces in flight  # type: ignore[union-attr]
            self._socket.close(linger=int(timeout_s * 1000))  # type: ignore[union-attr]
            self.process.wait(timeout=2 * timeout_s + 10.0)  # its start, then its last posts
        except (zmq.Again, subprocess.TimeoutExpired):
            log.warning("the trace exporter did not finish in time: stopped, its held spans lost")
            self._socket.close(linger=0)  # type: ignore[union-attr]
            self.process.kill()
            self.process.wait()
        finally:
            self._context.term()  # type: ignore[union-attr]
            shutil.rmtree(self._folder, ignore_errors=True)  # type: ignore[arg-type]
            self.process = None


def serve(socket: zmq.Socket, builder: SpanBuilder, exporter: Any, max_queue_spans: int, parent: int) -> None:
    """The exporter process's loop: receive traces, post them in batches, until the empty message
    (or the gateway that started it is gone); then post what is held."""
    held: list[Any] = []
    dropped, next_post = 0, time.monotonic() + EXPORT_DELAY_S
    stopping = False
    while not stopping:
        if socket.poll(max(0, int((next_post - time.monotonic()) * 1000))):
            while not stopping and len(held) < EXPORT_BATCH_SPANS:  # what is waiting, up to a batch
                try:
                    message = socket.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if not message:
                    stopping = True
                    break
                spans = builder.spans(msgpack.unpackb(message))
                if len(held) + len(spans) > max_queue_spans:
                    dropped += len(spans)
                else:
                    held += spans
        stopping = stopping or os.getppid() != parent
        if held and (stopping or len(held) >= EXPORT_BATCH_SPANS or time.monotonic() >= next_post):
            for start in range(0, len(held), EXPORT_BATCH_SPANS):
                exporter.export(held[start:start + EXPORT_BATCH_SPANS])
            held = []
        if time.monotonic() >= next_post:
            if dropped:
                log.warning("trace exporter: %d spans dropped (over max_queue_spans %d)", dropped, max_queue_spans)
                dropped = 0
            next_post = time.monotonic() + EXPORT_DELAY_S


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="boundserve's trace exporter process (started by the gateway)")
    parser.add_argument("--receive", required=True, help="the ZeroMQ endpoint to bind for the gateway's traces")
    parser.add_argument("--to", required=True, help="the OTLP/HTTP traces endpoint")
    parser.add_argument("--service-name", required=True)
    parser.add_argument("--export-timeout-ms", type=int, required=True)
    parser.add_argument("--max-queue-spans", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the gateway too, whose stop ends this process
    parent = os.getppid()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    exporter = OTLPSpanExporter(endpoint=args.to, timeout=args.export_timeout_ms / 1000.0)
    context = zmq.Context(1)
    socket = context.socket(zmq.PULL)
    socket.setsockopt(zmq.RCVHWM, IN_FLIGHT_TRACES)
    socket.bind(args.receive)
    try:
        serve(socket, SpanBuilder(args.service_name), exporter, args.max_queue_spans, parent)
    finally:
        exporter.shutdown()
        socket.close(linger=0)
        context.term()


if __name__ == "__main__":
    main()
