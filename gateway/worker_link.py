"""The gateway's connection to one worker: handshake, batches out, results and heartbeats in.

A DEALER socket connects to the worker's ROUTER (shared/protocol/). The link is `connecting`
until the worker answers Hello with Ready, `ready` until a Goodbye, a draining heartbeat or a batch
refused `draining` makes it `draining` (answered with our Goodbye, the last thing we send it; a
refused batch's jobs go back to the queue: `on_returned`); it is `lost` when its connection closes
(the worker's process is gone, or ZMTP heartbeats went unanswered: gateway/liveness.py) and
`stalled` when a batch has run far past its prediction. Either way every batch in flight on it
fails at once with 503 worker_lost; Hello goes out on every new connection (and is repeated while
absent) so a restarted worker rejoins. A stalled worker comes back once its heartbeat shows it
idle, or as a new connection.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
import dataclasses
from dataclasses import dataclass

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from gateway.errors import ApiError
from gateway.job import DONE, SENT, Job, fail, finish, wire_ids
from shared.latency_correction import CorrectedModel
from gateway.liveness import LivenessPolicy, connect_monitored
from shared import protocol
from shared.bounds import Bounds, batch_capacity
from shared.policy import DropReason, busy_ms
from shared.work import NO_REUSE, HeldPrefixes, StaticPrefix
from gateway.telemetry import OFF, Telemetry, _Off

log = logging.getLogger("gateway.worker")
CONNECTING, READY, DRAINING, LOST, STALLED = "connecting", "ready", "draining", "lost", "stalled"
HELLO_REQUIRED = getattr(protocol.ErrorCode, "HELLO_REQUIRED", "hello_required")


@dataclass(frozen=True)
class Answered:
    """What one answered batch tells the gateway's metrics."""

    workload: str
    round_trip_ms: float
    """Send to answer."""
    service_ms: float
    """The round trip less the time the batch waited in the worker's queue."""
    predicted_ms: float
    """The service time predicted when it was sent."""
    compute_ms: float
    """The model call, as the worker measured it (0: every request had expired)."""
    dropped_ms: float
    """Compute spent on requests that had already failed (overdue, a sibling chunk failed): wasted."""


@dataclass
class InFlight:
    """A batch sent to the worker and not yet answered."""

    workload: str
    jobs: dict[str, Job]
    sent_at: float
    predicted_ms: float
    items: int
    tokens_per_item: float


class WorkerLink:
    """One worker as the gateway sees it: state, latency models, batches in flight."""

    telemetry: Telemetry | _Off = OFF
    """The gateway's tracing (gateway/wiring.py sets it); OFF: the hooks below are skipped."""

    def __init__(self, endpoint: str, gateway_id: str, clock: Callable[[], float],
                 on_change: Callable[[], None], on_answer: Callable[[Answered], None] = lambda answer: None,
                 static: StaticPrefix = NO_REUSE, on_returned: Callable[[list[Job]], None] = lambda jobs: None,
                 bounds: Bounds | None = None) -> None:
        self.endpoint = endpoint
        self.pid = 0
        self.gateway_id = gateway_id
        self.state = CONNECTING
        self.worker_id = ""
        self.latency_models: dict[str, CorrectedModel] = {}
        self.in_flight: dict[int, InFlight] = {}
        self.answered_at = -math.inf
        """Loop time of the worker's last answer to a batch (the batches after it started no earlier)."""
        self.out_of_service_since: float | None = None
        """Loop time at which a worker that had been ready was declared lost or stalled."""
        self.prefix_cache = protocol.PrefixCacheReport()
        """Its prefix cache as its latest heartbeat reported it (what it holds, its counters)."""
        self.reuse: HeldPrefixes = HeldPrefixes(static=static)
        """Which leading tokens a request sent here need not compute: the static prefix and the
        prefixes its latest heartbeat said its cache holds (the cost model's view of this worker)."""
        self.bounds = bounds
        """The bounds the gateway's artifacts were compiled for: a worker whose Ready names others is not
        served (None: any; a test's link alone)."""
        self.refused_because = ""
        """Why the worker's last Ready was refused (its bounds differ from the gateway's); empty: it was not."""
        self.on_catalog_state: Callable[[protocol.CatalogState], None] = lambda state: None
        """Where the worker's answers to catalogue updates go (gateway/catalog_admin.py)."""
        self._clock = clock
        self._on_change = on_change
        self._on_answer = on_answer
        self._on_returned = on_returned
        """Jobs of a batch the worker refused uncomputed because it is draining: to be queued again."""
        self._socket: zmq.asyncio.Socket | None = None
        self._monitor: zmq.asyncio.Socket | None = None
        self._connected = False
        """Between the socket's handshake and its connection's close, as its monitor reported them and
        `serve` read them: nothing is sent outside (ZeroMQ would queue it for the next connection)."""

    def open(self, context: zmq.asyncio.Context, policy: LivenessPolicy) -> None:
        self._connected = False
        self._socket, self._monitor = connect_monitored(context, self.endpoint, policy)

    def close(self) -> None:
        if self._socket is not None:
            if not self._socket.closed:
                self._socket.disable_monitor()
            self._socket.close(linger=0)
            self._socket = None
        if self._monitor is not None:
            self._monitor.close(linger=0)
            self._monitor = None

    def serves(self, workload: str) -> bool:
        return self.state == READY and workload in self.latency_models

    def hello(self) -> None:
        self._send(protocol.Hello(protocol_version=protocol.PROTOCOL_VERSION, gateway_id=self.gateway_id))

    def busy_ms(self, now: float) -> float:
        """Predicted milliseconds a batch sent now would wait here behind what is in flight (the policy's rule)."""
        return busy_ms(((b.sent_at, b.predicted_ms, self._overhead_ms(b.workload)) for b in self.in_flight.values()),
                       now, self.answered_at)

    def _overhead_ms(self, workload: str) -> float:
        model = self.latency_models.get(workload)
        return 0.0 if model is None else model.overhead_ms

    async def serve(self) -> str:
        """Read messages and connection events until either stops; returns why it stopped.

        One loop reads both, and a connection event is acted on only after every message that reached
        the socket before it: a worker that answers and then exits (the end of a drain) has its answers
        read before its connection's close fails what is still in flight."""
        assert self._socket is not None and self._monitor is not None
        sockets = (self._socket, self._monitor)
        # Plain views of the same sockets: what is ready is read at once, in order, with no future between
        messages, events = (zmq.Socket.shadow(sock.underlying) for sock in sockets)
        while True:
            # pyzmq cancels a pending poll when its socket is closed under it
            ready = [sock.poll(flags=zmq.POLLIN) for sock in sockets]
            try:
                await asyncio.wait(ready, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in ready:
                    waiting.cancel()
                    waiting.add_done_callback(_consume)
            if any(sock.closed for sock in sockets):
                return "its socket was closed under its reader"
            try:
                # the events first: every message sent before them is readable by the time they are
                happened = _ready_frames(events)
                for frames in _ready_frames(messages):
                    self._receive(frames)
            except zmq.ZMQError as exc:
                return f"its socket failed: {exc}"
            for frames in happened:
                event = parse_monitor_message(frames)["event"]
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self._on_connected()
                elif event == zmq.EVENT_DISCONNECTED:
                    self._on_disconnected()
                elif event == zmq.EVENT_MONITOR_STOPPED:
                    return "its connection monitor stopped"

    def _receive(self, frames: list[bytes]) -> None:
        """Dispatch one message; bad frames are logged, never fatal."""
        try:
            self._dispatch(protocol.decode(frames))
        except protocol.ProtocolError as exc:
            log.warning("worker %s sent a bad message: %s", self.endpoint, exc)
        except Exception:  # a bug in a handler must not stop this worker's receive loop
            log.exception("handling a message from worker %s failed", self.endpoint)

    # ---- sending -------------------------------------------------------------------------------

    def send_batch(self, batch_id: int, workload: str, jobs: list[Job], predicted_ms: float) -> bool:
        """Send jobs as one batch; False (nothing sent) when the socket would block."""
        now = self._clock()
        parents = self._trace_sent(batch_id, jobs, predicted_ms, now) if self.telemetry.enabled else None
        if workload == "score":
            message = protocol.ScoreBatch(batch_id, "int32", tuple(
                _score_request(j, now, parents[i] if parents else "") for i, j in enumerate(jobs)))
        else:
            beams, steps, k = jobs[0].beam_key  # type: ignore[misc]
            requests = tuple(protocol.BeamRequest(j.request_id, _remaining_ms(j, now), protocol.pack_ids(j.token_ids[0]),
                                                  parents[i] if parents else "", j.catalog) for i, j in enumerate(jobs))
            message = protocol.BeamBatch(batch_id, "int32", beams, steps, k, requests)
        if not self._send(message):
            if parents:
                self._trace_unsent(jobs, now)
            return False
        items = sum(j.batch_items for j in jobs)
        tokens = sum(j.latency_tokens for j in jobs)
        self.in_flight[batch_id] = InFlight(workload, {j.request_id: j for j in jobs}, now, predicted_ms,
                                            items, tokens / max(1, items))
        for job in jobs:
            job.state = SENT
        return True

    def _trace_sent(self, batch_id: int, jobs: list[Job], predicted_ms: float, now: float) -> list[str]:
        """Each job's batch span started (gateway/telemetry.py); their traceparents, for the wire."""
        size = (len(jobs), sum(j.batch_items for j in jobs), sum(j.tokens for j in jobs))
        parents = []
        for job in jobs:
            trace = self.telemetry.trace_of(job.request_id)
            parents.append(trace.batch_sent(job, batch_id, size, predicted_ms, self.endpoint, now) if trace else "")
        return parents

    def _trace_unsent(self, jobs: list[Job], now: float) -> None:
        for job in jobs:
            trace = self.telemetry.trace_of(job.request_id)
            if trace is not None:
                trace.batch_unsent(job.request_id, now)

    def _send(self, message: protocol.Message) -> bool:
        if self._socket is None or not self._connected:
            return False
        try:
            sent = self._socket.send_multipart(protocol.encode(message), flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            return False
        if not sent.done():  # zmq.asyncio answers with a future; with NOBLOCK it is normally done
            sent.add_done_callback(_consume)
            return True
        return sent.exception() is None  # zmq.Again: no connected worker, or its queue is full

    def send_control(self, message: protocol.Message) -> bool:
        """Send a message that is not a batch (a catalogue update); False when it could not be queued."""
        return self._send(message)

    # ---- receiving -----------------------------------------------------------------------------

    def _dispatch(self, message: protocol.Message) -> None:
        handler = _HANDLERS.get(type(message))
        if handler is not None:
            handler(self, message)

    def _on_ready(self, ready: protocol.Ready) -> None:
        if ready.protocol_version != protocol.PROTOCOL_VERSION:
            log.error("worker %s speaks protocol %s, gateway %s", self.endpoint, ready.protocol_version,
                      protocol.PROTOCOL_VERSION)
            return
        if differences := bounds_differences(ready.bounds, self.bounds):
            because = f"its artifacts were compiled for other bounds than this gateway's: {'; '.join(differences)}"
            if because != self.refused_because:  # once, not at each Hello it answers
                log.error("worker %s (pid %s) not served: %s; deploy one build to gateway and workers",
                          self.endpoint, ready.pid, because)
            self.refused_because = because
            return
        self.refused_because = ""
        if self.pid and ready.pid != self.pid and self.in_flight:  # a new process: the old one's batches are gone
            self.declare_lost(f"it restarted as pid {ready.pid}")
        if self.state == READY and ready.pid == self.pid:
            return  # the answer to a Hello repeated before the first answer came
        self._adopt_models(ready)
        if ready.pid != self.pid:  # a new process starts with an empty prefix cache
            self.prefix_cache, self.reuse = protocol.PrefixCacheReport(), HeldPrefixes(static=self.reuse.static)
        self.worker_id, self.pid, self.state = ready.worker_id, ready.pid, READY
        self.out_of_service_since = None
        log.info("worker %s ready (%s, pid %s, workloads %s)", self.endpoint, ready.device, ready.pid,
                 ",".join(ready.workloads))
        self._on_change()

    def _adopt_models(self, ready: protocol.Ready) -> None:
        old = self.latency_models
        self.latency_models = {w: CorrectedModel(m, *batch_capacity(ready.bounds, w)) for w, m in ready.latency.items()
                       if w in ready.workloads}
        for workload, model in self.latency_models.items():  # keep what was learnt across a reconnect
            if workload in old:
                model.ratio, model.overhead_ms = old[workload].ratio, old[workload].overhead_ms

    def _on_results(self, message: protocol.ScoreResults | protocol.BeamResults) -> None:
        batch = self.in_flight.pop(message.batch_id, None)
        if batch is None:
            return  # answered after the batch was given up (worker declared lost)
        self.answered_at = self._clock()
        round_trip_ms = (self.answered_at - batch.sent_at) * 1000.0
        service_ms = round_trip_ms - message.queue_ms
        model = self.latency_models.get(batch.workload)
        if model is not None and message.compute_ms > 0:
            model.observe(batch.items, batch.tokens_per_item, message.compute_ms, service_ms)
        dropped_ms = _share_compute(batch, message)
        if self.telemetry.enabled:
            for result in message.results:
                trace, job = self.telemetry.trace_of(result.request_id), batch.jobs.get(result.request_id)
                if trace is not None and job is not None:
                    trace.batch_answered(job, message.queue_ms, message.compute_ms, str(result.status),
                                         self.answered_at)
        for result in message.results:
            job = batch.jobs.pop(result.request_id, None)
            if job is None:
                continue
            if result.status == protocol.Status.OK:
                finish(job, result)
            elif result.status == protocol.Status.EXPIRED:
                fail(job, ApiError("deadline_exceeded", "the deadline passed before the worker could start "
                                                       "this request; it was dropped uncomputed",
                                  drop_reason=DropReason.EXPIRED_IN_WORKER))
            else:
                fail(job, ApiError("worker_error", f"the worker refused this request: {result.error}"))
        for job in batch.jobs.values():
            fail(job, ApiError("worker_error", "the worker answered the batch without this request"))
        self._on_answer(Answered(batch.workload, round_trip_ms, service_ms, batch.predicted_ms, message.compute_ms,
                                 dropped_ms))
        self._on_change()

    def _on_heartbeat(self, beat: protocol.Heartbeat) -> None:
        if beat.prefix_cache.held != self.prefix_cache.held:
            self.reuse = HeldPrefixes(frozenset(beat.prefix_cache.held), self.reuse.static)
        self.prefix_cache = beat.prefix_cache
        if beat.draining and self.state == READY:
            self._drained_by_worker()
        elif self.state == LOST or (self.state == STALLED and beat.in_flight == 0 and beat.queue_depth == 0):
            self.hello()  # a worker that came back (or finished what stalled it): ask for Ready again

    def _on_error(self, error: protocol.Error) -> None:
        if error.code == HELLO_REQUIRED:  # a restarted worker that does not know this gateway yet
            self.state = CONNECTING
            self.hello()
            self._on_change()
        batch = self.in_flight.pop(error.batch_id, None) if error.batch_id is not None else None
        if batch is None:
            log.warning("worker %s: %s: %s", self.endpoint, error.code, error.message)
            return
        if error.code == protocol.ErrorCode.DRAINING:  # sent before its Goodbye reached us: never computed
            self._drained_by_worker()
            self._on_returned(list(batch.jobs.values()))
            self._on_change()
            return
        for job in batch.jobs.values():
            fail(job, ApiError("worker_error", f"the worker refused the batch ({error.code}): {error.message}"))
        self._on_change()

    def _on_goodbye(self, goodbye: protocol.Goodbye) -> None:
        self._drained_by_worker()

    def _drained_by_worker(self) -> None:
        """The worker drains: route nothing more to it, at once, and answer its Goodbye with ours (the
        last message it gets from us: protocol 10's drain handshake)."""
        if self.state == READY:
            self.state = DRAINING
        self._send(protocol.Goodbye(self.gateway_id, "no more batches"))
        self._on_change()

    def _on_connected(self) -> None:
        """A new connection completed its handshake: introduce ourselves (the worker may be new)."""
        self._connected = True
        self.state = CONNECTING if self.state == LOST else self.state
        self.hello()

    def _on_disconnected(self) -> None:
        self._connected = False
        self.declare_lost("its connection closed: the process is gone, or ZMTP heartbeats went unanswered")

    def declare_lost(self, why: str, state: str = LOST) -> None:
        """Fail everything in flight here at once (503 worker_lost) and stop sending to the worker."""
        if self.state in (READY, DRAINING):
            self.out_of_service_since = self._clock()
        elif not self.in_flight:  # not serving already: nothing to fail, nothing to say
            self.state = state if self.state != STALLED else self.state
            return
        self.state = state
        batches, self.in_flight = self.in_flight, {}
        for batch in batches.values():
            for job in batch.jobs.values():
                fail(job, ApiError("worker_lost", f"worker {self.endpoint} stopped answering ({why}) while "
                                                 "computing this request", drop_reason=DropReason.WORKER_LOST))
        log.warning("worker %s %s: %s (%d batches failed)", self.endpoint, state, why, len(batches))
        self._on_change()


def _share_compute(batch: InFlight, message: protocol.ScoreResults | protocol.BeamResults) -> float:
    """Give each computed job its share of the batch's compute (by tokens computed); returns the ms
    spent on jobs that had already failed (their answers were no longer wanted)."""
    computed = [batch.jobs[r.request_id] for r in message.results
                if r.status == protocol.Status.OK and r.request_id in batch.jobs]
    tokens = sum(job.latency_tokens for job in computed)
    dropped_ms = 0.0
    for job in computed:
        share_ms = message.compute_ms * job.latency_tokens / tokens if tokens else 0.0
        job.compute_ms += share_ms
        dropped_ms += share_ms if job.state == DONE else 0.0
    return dropped_ms


def _ready_frames(sock: zmq.Socket) -> list[list[bytes]]:
    """Every message `sock` holds now, oldest first, without waiting."""
    ready = []
    while True:
        try:
            ready.append(sock.recv_multipart(zmq.NOBLOCK))
        except zmq.Again:
            return ready


def _consume(future) -> None:
    if not future.cancelled():
        future.exception()


def _remaining_ms(job: Job, now: float) -> float:
    return (job.deadline - now) * 1000.0


def _score_request(job: Job, now: float, traceparent: str = "") -> protocol.ScoreRequest:
    flat, suffix_lens = wire_ids(job)  # a shared prefix once, then each sample's suffix
    return protocol.ScoreRequest(job.request_id, _remaining_ms(job, now), flat.tobytes(), suffix_lens, job.label_ids,
                          job.top_k, job.return_hidden, job.prefix_len, traceparent,
                          job.prompt_logprobs)


_HANDLERS: dict[type, Callable[[WorkerLink, object], None]] = {
    protocol.Ready: WorkerLink._on_ready,
    protocol.ScoreResults: WorkerLink._on_results,
    protocol.BeamResults: WorkerLink._on_results,
    protocol.Heartbeat: WorkerLink._on_heartbeat,
    protocol.Error: WorkerLink._on_error,
    protocol.Goodbye: WorkerLink._on_goodbye,
    protocol.CatalogState: lambda link, state: link.on_catalog_state(state),
}


def bounds_differences(worker: Bounds, gateway: Bounds | None) -> list[str]:
    """Each bound a worker's Ready names that differs from the gateway's compiled one, in words (empty: they
    agree, or the gateway has none to hold it to)."""
    if gateway is None:
        return []
    return [f"{f.name} = {getattr(worker, f.name)} on the worker, {getattr(gateway, f.name)} here"
            for f in dataclasses.fields(Bounds) if worker.limit(f.name) != gateway.limit(f.name)]
