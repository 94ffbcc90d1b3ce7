"""The worker's receive loop: ROUTER socket, handshake, admission to the queue, heartbeats, drain.

Main loop: poll → receive (decode, check, queue or refuse at once) → forward replies from the
compute threads → heartbeat every known gateway → when asked to stop, drain and return 0.
Only this thread touches the ROUTER socket. Liveness does not depend on this loop: libzmq's I/O
thread answers the gateways' ZMTP heartbeats even while Python cannot run (a package loaded by torch's
own loader holds the GIL for a whole CPU run), and pings them in turn, dropping a connection whose
gateway stopped answering. A build's CPU packages run through worker/runtime/package_runner.py, whose calls
release the GIL: this loop then reads, decodes and queues the next batch while one computes, so a
batch's queue time starts when it arrives.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import msgspec
import zmq

from shared.config import WorkerConfig
from shared.events import Serving
from shared.protocol import (PROTOCOL_VERSION, BeamBatch, CatalogSwap, DecodeLimits, Error, ErrorCode, Goodbye,
                             Heartbeat, Hello, PrefixCacheReport, ProtocolError, Ready, ScoreBatch, Shutdown, decode,
                             encode, peek_batch_id)
from worker.batch_queue import BatchQueue, PendingBatch
from worker.catalog_admin import CatalogAdmin
from worker.catalog_store import CatalogStore
from worker.catalog_watch import CatalogWatch
from worker.bounds_check import BatchRefused
from worker.logs import JsonLog
from worker.prefix_cache import PrefixCache
from worker.compute import ComputePool
from worker.refit import BackgroundRefit
from worker.stats import WorkerStats
from worker.workloads import Workloads

PoolFactory = Callable[[BatchQueue, WorkerStats, zmq.Context, str], ComputePool]
"""(queue, stats, context, outbox endpoint) -> the compute threads, made when the sockets open."""
RefitFactory = Callable[["WorkerServer"], BackgroundRefit]
"""(server) -> the background profile refit, started once serving."""

MAX_PEERS = 1024
MAX_RECV_PER_TURN = 256  # frames read before forwarding replies again, so neither side starves
LOGGED_IDS = 8  # request ids a refusal's log line names (and how many there were)
GATEWAY_SILENCE_MS = 10_000  # a gateway connection unanswered this long is dropped (libzmq's pings)
REFIT_JOIN_S = 30.0  # at exit: let a background profile call in progress finish


class WorkerServer:
    """Serves one device. Constructed with everything it needs; sockets open in run()."""

    def __init__(self, endpoint: str, config: WorkerConfig, ready: Ready, workloads: Workloads,
                 pool_factory: PoolFactory, log: JsonLog, refit_factory: RefitFactory | None = None,
                 prefix_cache: PrefixCache | None = None, catalogs: CatalogStore | None = None,
                 catalog_watch: CatalogWatch | None = None) -> None:
        self.endpoint, self.config, self.ready, self.log = endpoint, config, ready, log
        self.prefix_cache = prefix_cache  # reported in every heartbeat (the compute lanes fill it)
        self.workloads = workloads  # what each batch type is checked, computed and answered with
        self.pool_factory = pool_factory
        self.refit_factory = refit_factory  # after a start on a cached profile
        self.limits = DecodeLimits(max_frame_bytes=config.max_message_bytes, max_bin_len=config.max_message_bytes)
        self.stats = WorkerStats()
        self.queue = BatchQueue(config.max_queued_batches)
        self.peers: dict[bytes, str] = {}  # ROUTER identity -> gateway id
        self.stop_requested = False
        self.draining = False
        self.catalog_admin = CatalogAdmin(catalogs, log)  # CatalogSwap: swapped on a thread, answered via the outbox
        self.catalog_watch = catalog_watch  # [beam] constraints reloaded when the file changes
        self.outbox: tuple[zmq.Context, str] | None = None  # where threads send replies; set in run()
        self.drain_began = 0.0
        """Monotonic seconds at which the drain began (the gateways' Goodbyes are awaited from then)."""
        self.handlers = {Hello: self.on_hello, ScoreBatch: self.on_batch, BeamBatch: self.on_batch,
                         Shutdown: self.on_shutdown, Goodbye: self.on_goodbye, CatalogSwap: self.on_catalog_swap}

    def request_stop(self) -> None:
        """Ask the loop to drain and return (safe from a signal handler)."""
        self.stop_requested = True

    def run(self) -> int:
        context = zmq.Context()
        router = context.socket(zmq.ROUTER)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sends to a vanished peer fail instead of vanishing
        router.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
        router.setsockopt(zmq.LINGER, 2000)
        router.setsockopt(zmq.HEARTBEAT_IVL, self.config.heartbeat_interval_ms)
        router.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(GATEWAY_SILENCE_MS, 10 * self.config.heartbeat_interval_ms))
        outbox = f"inproc://worker-outbox-{os.getpid()}-{id(self)}"
        pull = context.socket(zmq.PULL)
        pull.bind(outbox)
        pool = self.pool_factory(self.queue, self.stats, context, outbox)
        self.outbox = (context, outbox)
        try:
            try:
                router.bind(self.endpoint)
            except zmq.ZMQError as exc:
                self.log.error("bind_failed", endpoint=self.endpoint, error=str(exc))
                return 2
            pool.start()
            refit = self.refit_factory(self) if self.refit_factory is not None else None
            if refit is not None:
                refit.start()
            if self.catalog_watch is not None:
                self.catalog_watch.start()
            self.log.emit(Serving(endpoint=self.endpoint, pid=os.getpid(), workloads=self.ready.workloads))
            self._loop(router, pull)
            if refit is not None:
                refit.join(REFIT_JOIN_S)
            pool.stop()
            if self.catalog_watch is not None:
                self.catalog_watch.stop()
            self.catalog_admin.join(REFIT_JOIN_S)
            self._forward_replies(router, pull, block_ms=0)
            self.log.info("stopped", counters=msgspec.structs.asdict(self.stats.counters()))
            return 0
        finally:
            router.close()
            pull.close(linger=0)
            context.term()

    def _loop(self, router: zmq.Socket, pull: zmq.Socket) -> None:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(pull, zmq.POLLIN)
        interval_s = self.config.heartbeat_interval_ms / 1000.0
        next_beat = time.monotonic()
        while True:
            if self.stop_requested and not self.draining:
                self._begin_drain(router)
            if self.draining and self._drained():
                return
            timeout_ms = max(0.0, (next_beat - time.monotonic()) * 1000.0)
            events = dict(poller.poll(timeout_ms))
            if pull in events:
                self._forward_replies(router, pull, block_ms=0)
            if router in events:
                self._receive(router)
            if time.monotonic() >= next_beat:
                self._heartbeat(router)
                next_beat = time.monotonic() + interval_s

    # ---- receive side ---------------------------------------------------------------------------

    def _receive(self, router: zmq.Socket) -> None:
        for _ in range(MAX_RECV_PER_TURN):
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            now = time.monotonic()
            if len(frames) < 2:
                continue  # not even an identity and one frame: nothing to answer
            peer = frames[0]
            try:
                message = decode(frames[1:], self.limits)
            except ProtocolError as exc:
                self.stats.add(errors=1)
                self.log.warning("malformed_frame", peer=peer.hex(), error=str(exc))
                batch_id = peek_batch_id(frames[1:], self.limits)
                self._send(router, peer, Error(code=ErrorCode.MALFORMED, message=str(exc), batch_id=batch_id))
                continue
            handler = self.handlers.get(type(message))
            if handler is None:
                self.stats.add(errors=1)
                self.log.warning("unsupported_message", peer=peer.hex(), kind=type(message).__name__)
                self._send(router, peer, Error(code=ErrorCode.UNSUPPORTED,
                                               message=f"a worker does not accept {type(message).__name__}"))
                continue
            handler(router, peer, message, now)

    def on_hello(self, router: zmq.Socket, peer: bytes, hello: Hello, now: float) -> None:
        if hello.protocol_version != PROTOCOL_VERSION:
            self.peers.pop(peer, None)  # a peer known before speaks another version now: its batches are refused
            self._send(router, peer, Error(code=ErrorCode.VERSION_MISMATCH,
                                           message=f"worker speaks protocol {PROTOCOL_VERSION}, "
                                                   f"gateway sent {hello.protocol_version}"))
        elif self.draining:
            self._send(router, peer, Error(code=ErrorCode.DRAINING, message="worker is shutting down"))
        elif peer not in self.peers and len(self.peers) >= MAX_PEERS:
            self._send(router, peer, Error(code=ErrorCode.OVERLOADED, message=f"more than {MAX_PEERS} gateways"))
        else:
            self.peers[peer] = hello.gateway_id
            self.log.info("hello", gateway=hello.gateway_id, peer=peer.hex())
            self._send(router, peer, self.ready)

    def on_batch(self, router: zmq.Socket, peer: bytes, batch: ScoreBatch | BeamBatch, now: float) -> None:
        refusal = self._admit(peer, batch, now)
        if refusal is not None:
            code, message = refusal
            ids = [r.request_id for r in batch.requests[:LOGGED_IDS]]  # a batch can hold thousands
            self.log.warning("batch_refused", batch_id=batch.batch_id, code=code, error=message,
                             requests=len(batch.requests), request_ids=ids)
            self._send(router, peer, Error(code=code, message=message, batch_id=batch.batch_id))

    def _admit(self, peer: bytes, batch: ScoreBatch | BeamBatch, now: float) -> tuple[str, str] | None:
        """Queue the batch, or (code, message) saying why it is refused."""
        if peer not in self.peers:
            self.stats.add(errors=1)
            return ErrorCode.HELLO_REQUIRED, "send Hello before batches (this worker does not know you)"
        if self.draining:
            self.stats.add(overloaded=1)
            return ErrorCode.DRAINING, "worker is shutting down and takes no new batches"
        workload = self.workloads.for_batch(batch)
        if workload is None:
            self.stats.add(errors=1)
            return ErrorCode.UNSUPPORTED, f"this worker serves {', '.join(self.ready.workloads)} batches only"
        try:
            pending = PendingBatch.received(peer, batch, now)
            pending.rejected = workload.check(batch)
        except BatchRefused as exc:
            self.stats.add(errors=1)
            return exc.code, exc.message
        if not self.queue.offer(pending):
            self.stats.add(overloaded=1)
            return ErrorCode.OVERLOADED, f"queue full ({self.queue.capacity} batches waiting)"
        return None

    def on_shutdown(self, router: zmq.Socket, peer: bytes, message: Shutdown, now: float) -> None:
        if peer not in self.peers:  # only a gateway this worker knows may stop it
            self.stats.add(errors=1)
            self.log.warning("shutdown_refused", peer=peer.hex(), reason=message.reason)
            self._send(router, peer, Error(code=ErrorCode.HELLO_REQUIRED,
                                           message="send Hello before Shutdown (this worker does not know you)"))
            return
        self.log.info("shutdown_requested", peer=peer.hex(), reason=message.reason)
        self.request_stop()
        if not self.draining:  # at once, so batches behind it in this turn are refused
            self._begin_drain(router)

    def on_catalog_swap(self, router: zmq.Socket, peer: bytes, message: CatalogSwap, now: float) -> None:
        if peer not in self.peers:  # only a gateway this worker knows may change what it serves
            self.stats.add(errors=1)
            self._send(router, peer, Error(code=ErrorCode.HELLO_REQUIRED,
                                           message="send Hello before CatalogSwap (this worker does not know you)"))
            return
        self.catalog_admin.start_swap(peer, message, *self.outbox)

    def on_goodbye(self, router: zmq.Socket, peer: bytes, message: Goodbye, now: float) -> None:
        self.peers.pop(peer, None)
        self.log.info("goodbye", peer=peer.hex(), gateway=message.sender_id, reason=message.reason)

    # ---- send side ------------------------------------------------------------------------------

    def _forward_replies(self, router: zmq.Socket, pull: zmq.Socket, block_ms: int) -> None:
        while pull.poll(block_ms):
            frames = pull.recv_multipart(copy=False)
            self._send_frames(router, frames[0].bytes, frames[1:])

    def _heartbeat(self, router: zmq.Socket) -> None:
        beat = Heartbeat(worker_id=self.ready.worker_id, queue_depth=self.queue.depth,
                         in_flight=self.stats.in_flight, draining=self.draining, counters=self.stats.counters(),
                         prefix_cache=self.prefix_cache.report() if self.prefix_cache is not None else PrefixCacheReport())
        frames = encode(beat)
        for peer in list(self.peers):
            self._send_frames(router, peer, frames)

    def activity(self) -> tuple[int, int, int] | None:
        """None while a batch is queued or computing; else a value that changes with every batch
        served or refused (for the background refit to tell whether served work disturbed it)."""
        if self.queue.depth or self.stats.in_flight:
            return None
        counters = self.stats.counters()
        return counters.batches_computed, counters.errors, counters.requests_expired

    def publish_latency(self, latency: dict) -> None:
        """From the refit thread: the Ready that answers every Hello from now on carries the refit
        (one reference swap; gateways already connected keep correcting their model online)."""
        self.ready = msgspec.structs.replace(self.ready, latency=latency)
        self.log.info("profile_adopted")

    def _drained(self) -> bool:
        """Everything accepted is answered and nothing more is on its way: every gateway said Goodbye
        (each pops itself from `peers`; one gone is popped on the first failed send), or the gateways
        that did not were given drain_ack_timeout_ms (protocol 10)."""
        if self.queue.depth or self.stats.in_flight:
            return False
        waited_ms = (time.monotonic() - self.drain_began) * 1000.0
        return not self.peers or waited_ms >= self.config.drain_ack_timeout_ms

    def _begin_drain(self, router: zmq.Socket) -> None:
        self.draining = True
        self.drain_began = time.monotonic()
        self.log.info("draining", queued=self.queue.depth, in_flight=self.stats.in_flight)
        frames = encode(Goodbye(sender_id=self.ready.worker_id, reason="draining"))
        for peer in list(self.peers):
            self._send_frames(router, peer, frames)

    def _send(self, router: zmq.Socket, peer: bytes, message) -> None:
        self._send_frames(router, peer, encode(message))

    def _send_frames(self, router: zmq.Socket, peer: bytes, frames) -> None:
        try:
            router.send_multipart([peer, *frames], zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.log.warning("peer_not_reading", peer=peer.hex())
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                if self.peers.pop(peer, None) is not None:
                    self.log.info("peer_gone", peer=peer.hex())
            else:
                self.log.error("send_failed", peer=peer.hex(), error=str(exc))
