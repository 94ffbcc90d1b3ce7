"""A stand-in worker speaking the real protocol over real ZeroMQ, with made-up but checkable answers.

It measures the gateway alone (bench/gateway_overhead.py, where it answers instantly), and it is
the only fake the gateway tests use.
Answers are pure functions of the inputs (see `expected_*`), so tests can check that every sample
reached the worker and came back in its place. A request sent as a shared prefix plus suffixes is
answered from its whole samples (prefix + suffix), so a wrong split shows in the answers; its
cached_tokens are the submitted tokens less those a worker computes (shared.latency_model); with a
modelled prefix cache (`prefix_cache`) a repeated shared prefix is a hit, as on a real worker.
It drains as a worker does (protocol 10): `drain()` (or SIGTERM to the process) refuses new batches
`draining`, says Goodbye to every gateway, answers what it holds and returns once every gateway has
answered Goodbye (or `drain_ack_timeout_ms` passed).
Runs on a thread, or as a process:
`python -m loadgen.standin_worker --endpoint ipc:///tmp/x [--delay-ms 5]`.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import zmq

from shared import protocol
from shared.bounds import Bounds
from shared.latency_model import LatencyModel
from shared.manifest import Manifest, ModelFacts, NodeFacts, NodeTable
from shared.prefix import prefix_key
from shared.work import StaticPrefix, WorkSize
from loadgen.prefix_model import PrefixCacheModel

HIDDEN = 8
BOUNDS = Bounds(max_samples_per_batch=16, max_tokens_per_sample=512, max_tokens_per_batch=4096, max_labels=32,
                max_top_k=20, max_prompt_tokens=512, max_beam_width=128, max_new_tokens=4,
                max_beam_requests_per_batch=4, max_prefix_tokens=512)


def standin_manifest(vocab_size: int, **nodes: NodeFacts) -> Manifest:
    """A manifest for a gateway in front of the stand-in: its bounds, the vocabulary and, when given,
    the nodes it says the artifacts hold (none: every configured workload)."""
    return Manifest(bounds=BOUNDS, model=ModelFacts(vocab_size=vocab_size), nodes=NodeTable(**nodes) if nodes else None)


def expected_label_logits(ids: list[int], labels: list[int]) -> np.ndarray:
    return np.array([((sum(ids) + 7 * label) % 1000) / 100.0 for label in labels], dtype=np.float32)


def expected_logprobs(logits: np.ndarray) -> np.ndarray:
    return (logits - 20.0).astype(np.float32)


def expected_topk(ids: list[int], k: int, vocab: int) -> list[int]:
    return [(sum(ids) + j) % vocab for j in range(k)]


def expected_beam(prompt: list[int], k: int, steps: int, vocab: int) -> list[list[int]]:
    return [[(sum(prompt) + 3 * i + j) % vocab for j in range(steps)] for i in range(k)]


DRAINED_LINGER_MS = 2000
"""How long a drained stand-in's socket keeps sending what it queued last (as worker/server.py's router)."""


@dataclass
class StandInWorker:
    """Binds a ROUTER, answers Hello with Ready, batches with results after `delay_ms`, heartbeats."""

    endpoint: str
    vocab_size: int = 1000
    delay_ms: float = 0.0
    latency: LatencyModel = field(default_factory=lambda: LatencyModel(0.0, 0.0, 0.01, 0.2))
    heartbeat_ms: int = 50
    seen_request_ids: list[str] = field(default_factory=list)
    batch_sizes: list[int] = field(default_factory=list)
    silent: bool = False
    """When set, stops answering and heartbeating (a hung worker)."""
    refuse: str = ""
    """When set, answers every batch with an Error of this code (a worker that cannot serve)."""
    expire: bool = False
    """When set, answers every request `expired` (a worker that found each past its deadline when
    its batch started), its compute 0."""
    static_prefix_ids: tuple[int, ...] = ()
    """The deployment's static prefix this worker announces and does not count as computed."""
    requests: list[protocol.ScoreRequest] = field(default_factory=list)
    """Every ScoreRequest received, as decoded (to check what went on the wire)."""
    gate: threading.Event | None = None
    """When given, batch answers are held (heartbeats go on) until the test sets it."""
    _held: list[list[bytes]] = field(default_factory=list)
    prefix_cache: PrefixCacheModel | None = None
    """When given, a modelled prefix cache (loadgen/prefix_model.py): shared prefixes are inserted on
    their second sighting, a hit is counted as cached tokens and its heartbeats report what it holds."""
    manual: bool = False
    """When set, no batch is answered by itself: each is kept in `received` (arrival order) until the
    test calls `release` for it with the service it decides (a worker whose times a virtual-time test
    sets: tests/gateway/test_gateway_simulator_decisions.py)."""
    received: list[protocol.ScoreBatch] = field(default_factory=list)
    _manual_peers: list[bytes] = field(default_factory=list)
    _releases: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    spin: bool = False
    """Compute by spinning with the GIL held, as a CPU package loaded by torch's loader does (own process only)."""
    bounds: Bounds = BOUNDS
    """The bounds its Ready announces (a worker of another build: tests/gateway/test_gateway_worker_bounds.py)."""
    drain_ack_timeout_ms: float = 2000.0
    """As [worker] drain_ack_timeout_ms: how long a drain waits for the gateways' Goodbyes."""
    _drain: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> StandInWorker:
        self._thread = threading.Thread(target=self.serve, name="standin-worker", daemon=True)
        self._thread.start()
        return self

    def drain(self) -> None:
        """Drain and return from `serve` (safe from a signal handler or another thread)."""
        self._drain.set()

    def join(self, timeout_s: float) -> bool:
        """Wait for a thread-run stand-in's `serve` to return (a drain ends it); True when it has."""
        assert self._thread is not None
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def release(self, index: int, compute_ms: float, queue_ms: float, expired: frozenset[str] = frozenset()) -> None:
        """Answer the `index`-th batch received (manual mode): the requests named in `expired` as found
        expired at its start, the rest computed, reporting `compute_ms` and `queue_ms` (its wait here)."""
        self._releases.put((index, compute_ms, queue_ms, expired))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def serve(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.endpoint)
        peers: set[bytes] = set()
        next_beat = time.monotonic()
        drain_began: float | None = None
        try:
            while not self._stop.is_set():
                if self._drain.is_set() and drain_began is None:
                    drain_began = time.monotonic()
                    for peer in peers:
                        sock.send_multipart([peer, *protocol.encode(protocol.Goodbye("standin", "draining"))])
                if drain_began is not None and not self._held and (
                        not peers or time.monotonic() - drain_began >= self.drain_ack_timeout_ms / 1000):
                    return
                if sock.poll(10):
                    peer, *frames = sock.recv_multipart()
                    if not self.silent:
                        self._handle(sock, peer, frames, peers)
                while not self._releases.empty():
                    self._answer_released(sock, *self._releases.get())
                if self._held and self.gate is not None and self.gate.is_set():
                    for frames in self._held:
                        sock.send_multipart(frames)
                    self._held.clear()
                if time.monotonic() >= next_beat and not self.silent:
                    report = self.prefix_cache.report() if self.prefix_cache is not None else protocol.PrefixCacheReport()
                    beat = protocol.Heartbeat("standin", 0, 0, drain_began is not None, protocol.WorkerCounters(),
                                              report)
                    for peer in peers:
                        sock.send_multipart([peer, *protocol.encode(beat)])
                    next_beat = time.monotonic() + self.heartbeat_ms / 1000
        finally:
            # a drained stand-in's last answers may still be queued in the socket: flushed as the worker
            # flushes its own (worker/server.py), or the gateway would see the link close before them
            sock.close(DRAINED_LINGER_MS if drain_began is not None and not self._stop.is_set() else 0)
            ctx.term()

    def _handle(self, sock: zmq.Socket, peer: bytes, frames: list[bytes], peers: set[bytes]) -> None:
        message = protocol.decode(frames)
        draining = self._drain.is_set()
        if isinstance(message, protocol.Goodbye):
            peers.discard(peer)
            return
        if isinstance(message, protocol.Hello) and draining:
            reply: protocol.Message = protocol.Error(protocol.ErrorCode.DRAINING, "worker is shutting down")
        elif isinstance(message, protocol.Hello):
            peers.add(peer)
            reply = self._ready()
        elif isinstance(message, (protocol.ScoreBatch, protocol.BeamBatch)) and draining:
            reply = protocol.Error(protocol.ErrorCode.DRAINING, "worker is shutting down and takes no new batches",
                                   message.batch_id)
        elif isinstance(message, (protocol.ScoreBatch, protocol.BeamBatch)) and self.refuse:
            reply = protocol.Error(self.refuse, "the stand-in was told to refuse", message.batch_id)
        elif isinstance(message, protocol.ScoreBatch) and self.manual:
            self._manual_peers.append(peer)
            self.received.append(message)  # after its peer: a reader that sees it can release it
            return
        elif isinstance(message, protocol.ScoreBatch):
            reply = self._score(message)
        elif isinstance(message, protocol.BeamBatch):
            reply = self._beam(message)
        else:
            return
        if self.gate is not None and not self.gate.is_set() and not isinstance(reply, protocol.Ready):
            self._held.append([peer, *protocol.encode(reply)])
            return
        sock.send_multipart([peer, *protocol.encode(reply)])

    def _answer_released(self, sock: zmq.Socket, index: int, compute_ms: float, queue_ms: float,
                         expired: frozenset[str]) -> None:
        batch = self.received[index]
        results = tuple(protocol.ScoreResult(req.request_id, protocol.Status.EXPIRED) if req.request_id in expired
                        else self._score_one(req, batch.token_dtype) for req in batch.requests)
        self.seen_request_ids.extend(req.request_id for req in batch.requests)
        answer = protocol.ScoreResults(batch.batch_id, results, queue_ms, compute_ms)
        sock.send_multipart([self._manual_peers[index], *protocol.encode(answer)])

    def _ready(self) -> protocol.Ready:
        return protocol.Ready(protocol.PROTOCOL_VERSION, "standin", "cpu", os.getpid(), ("score", "beam"),
                       self.bounds, {"vocab_size": self.vocab_size, "hidden_size": HIDDEN},
                       {"score": self.latency, "beam": self.latency})

    def _compute(self, count: int) -> float:
        self.batch_sizes.append(count)
        if self.delay_ms and self.spin:
            _spin_holding_the_gil(self.delay_ms / 1000)
        elif self.delay_ms:
            time.sleep(self.delay_ms / 1000)
        return max(self.delay_ms, 0.01)

    def _score(self, batch: protocol.ScoreBatch) -> protocol.ScoreResults:
        results = []
        for req in batch.requests:
            self.seen_request_ids.append(req.request_id)
            self.requests.append(req)
            results.append(self._score_one(req, batch.token_dtype))
        compute_ms = self._compute(sum(len(r.sample_lens) for r in batch.requests))
        return protocol.ScoreResults(batch.batch_id, tuple(results), 0.0, compute_ms)

    def _score_one(self, req: protocol.ScoreRequest, dtype: str) -> protocol.ScoreResult:
        if req.deadline_ms <= 0 or self.expire:
            return protocol.ScoreResult(req.request_id, protocol.Status.EXPIRED)
        flat = protocol.unpack_ids(req.input_ids, dtype).tolist()
        prefix, start, suffixes = flat[: req.prefix_len], req.prefix_len, []
        for n in req.sample_lens:
            suffixes.append(flat[start:start + n])
            start += n
        samples = [prefix + suffix for suffix in suffixes]
        work = WorkSize.of(samples, req.prefix_len, StaticPrefix(self.static_prefix_ids))
        if self.prefix_cache is not None and req.prefix_len and all(req.sample_lens):
            hit = self.prefix_cache.serve(prefix_key(prefix), req.prefix_len)
            work = WorkSize(work.prefix_len, work.suffix_lens, max(hit, work.reused_tokens))
        cached = work.cached_tokens
        labels = list(req.label_ids)
        logits = np.stack([expected_label_logits(s, labels) for s in samples]) if labels else np.zeros((0,))
        probs = np.exp(logits - logits.max(axis=1, keepdims=True)) if labels else logits
        probs = probs / probs.sum(axis=1, keepdims=True) if labels else probs
        topk = np.array([expected_topk(s, req.top_k, self.vocab_size) for s in samples], dtype="<i4")
        topk_lp = np.tile(-np.arange(1, req.top_k + 1, dtype="<f4"), (len(samples), 1))
        hidden = np.array([[len(s)] * HIDDEN for s in samples], dtype="<f4") if req.return_hidden else None
        f32 = lambda a: np.ascontiguousarray(a, dtype="<f4").tobytes()  # noqa: E731
        return protocol.ScoreResult(req.request_id, protocol.Status.OK, "", len(samples), f32(logits) if labels else b"",
                             f32(expected_logprobs(logits)) if labels else b"", f32(probs) if labels else b"",
                             topk.tobytes() if req.top_k else b"", f32(topk_lp) if req.top_k else b"",
                             f32(hidden) if hidden is not None else b"", cached_tokens=cached)

    def _beam(self, batch: protocol.BeamBatch) -> protocol.BeamResults:
        results = []
        for req in batch.requests:
            self.seen_request_ids.append(req.request_id)
            if req.deadline_ms <= 0 or self.expire:
                results.append(protocol.BeamResult(req.request_id, protocol.Status.EXPIRED))
                continue
            prompt = protocol.unpack_ids(req.prompt_ids, batch.token_dtype).tolist()
            k, steps = batch.num_return_sequences, batch.max_new_tokens
            seqs = np.array(expected_beam(prompt, k, steps, self.vocab_size), dtype="<i4")
            results.append(protocol.BeamResult(req.request_id, protocol.Status.OK, "", seqs.tobytes(),
                                        (-np.arange(k, dtype="<f4")).tobytes(), np.full(k, steps, "<i4").tobytes()))
        compute_ms = self._compute(len(batch.requests))
        return protocol.BeamResults(batch.batch_id, tuple(results), 0.0, compute_ms)


def _spin_holding_the_gil(seconds: float) -> None:
    """Busy for `seconds` without letting another Python thread run (libzmq's threads still do)."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(seconds + 1.0)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
    finally:
        sys.setswitchinterval(switch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--vocab-size", type=int, default=1000)
    parser.add_argument("--spin", action="store_true", help="compute by spinning with the GIL held")
    parser.add_argument("--predicted-ms", type=float, help="the latency profile it announces: this per batch")
    args = parser.parse_args()
    latency = LatencyModel(0.0, 0.0, 0.0, args.predicted_ms) if args.predicted_ms is not None else None
    worker = StandInWorker(args.endpoint, args.vocab_size, args.delay_ms, spin=args.spin)
    if latency is not None:
        worker.latency = latency
    signal.signal(signal.SIGTERM, lambda signum, frame: worker.drain())
    worker.serve()


if __name__ == "__main__":
    main()
