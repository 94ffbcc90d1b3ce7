"""Compute threads: one per lane; take a batch, drop what has expired, run the rest, send the reply.

Replies go to the receive loop over an inproc PUSH socket per thread (ZeroMQ sockets are never
shared between threads); the receive loop forwards them to the gateway that sent the batch.
The deadline check happens here, immediately before compute, so a request that expired while
queued is answered `expired` and never reaches the model.
"""

from __future__ import annotations

import threading
import time

import zmq

from shared.events import BatchDone
from shared.protocol import BeamResults, Error, ErrorCode, ScoreResults, Status, encode
from worker.batch_queue import BatchQueue, PendingBatch
from worker.bounds_check import BatchRefused
from worker.logs import JsonLog
from worker.memory import ResidentLimit
from worker.stats import WorkerStats
from worker.workloads import Workloads


class ComputePool:
    """Owns the compute threads; each batch runs on its workload's runner (worker/workloads.py)."""

    def __init__(self, lanes: list, workloads: Workloads, log: JsonLog, queue: BatchQueue, stats: WorkerStats,
                 context: zmq.Context, outbox: str, resident: ResidentLimit | None = None) -> None:
        self.lanes, self.workloads, self.queue = lanes, workloads, queue
        self.stats, self.log = stats, log
        self.context, self.outbox = context, outbox
        self.resident = resident  # a CPU worker's: checked after each batch, once its reply is sent
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for i, lane in enumerate(self.lanes):
            thread = threading.Thread(target=self._loop, args=(lane,), name=f"compute-{i}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def stop(self) -> None:
        """Let the threads finish what they hold, then join them."""
        self.queue.stop(len(self.threads))
        for thread in self.threads:
            thread.join()

    def _loop(self, lane) -> None:
        push = self.context.socket(zmq.PUSH)
        push.setsockopt(zmq.SNDHWM, 0)  # never block or drop a reply
        push.setsockopt(zmq.LINGER, -1)
        push.connect(self.outbox)
        try:
            while (pending := self.queue.take()) is not None:
                self.stats.start_batch()
                try:
                    push.send_multipart([pending.peer, *self._reply_frames(pending, lane)], copy=False)
                finally:
                    self.stats.end_batch()
                if self.resident is not None:
                    self.resident.after_batch()
        finally:
            push.close()

    def _reply_frames(self, pending: PendingBatch, lane) -> list[bytes]:
        """Encoded answer to one batch; any failure becomes Error(internal), never a dead thread."""
        try:
            return encode(self.serve(pending, lane))
        except Exception as exc:
            self.log.error("reply_failed", batch_id=pending.message.batch_id, error=f"{type(exc).__name__}: {exc}")
            return encode(self._refuse(pending, ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"))

    def serve(self, pending: PendingBatch, lane) -> ScoreResults | BeamResults | Error:
        """Answer one batch: expired requests are never computed; the node runs once for the rest."""
        batch = pending.message
        now = time.monotonic()
        live, expired = pending.split(now)
        queue_ms = (now - pending.received_at) * 1000.0
        outcome, compute_ms = {}, 0.0
        if live:
            started = time.perf_counter()
            try:
                outcome = self.workloads.for_batch(batch).runner.run(batch, live, lane)
            except BatchRefused as exc:
                return self._refuse(pending, exc.code, exc.message)
            except Exception as exc:  # a failing batch must never take the worker down
                self.log.error("batch_failed", batch_id=batch.batch_id, request_ids=pending.request_ids,
                               error=f"{type(exc).__name__}: {exc}")
                return self._refuse(pending, ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}")
            compute_ms = (time.perf_counter() - started) * 1000.0
            self.stats.add(batches_computed=1, requests_computed=len(live))
        self.stats.add(requests_expired=len(expired))
        self.log.emit(BatchDone(
            batch_id=batch.batch_id, request_ids=tuple(pending.request_ids), queue_ms=round(queue_ms, 3),
            compute_ms=round(compute_ms, 3), expired=tuple(batch.requests[i].request_id for i in expired),
            rejected={batch.requests[i].request_id: why for i, why in pending.rejected.items()}))
        return self._results(pending, outcome, set(expired), queue_ms, compute_ms)

    def _results(self, pending: PendingBatch, outcome: dict, expired: set[int], queue_ms: float,
                 compute_ms: float) -> ScoreResults | BeamResults:
        batch = pending.message
        workload = self.workloads.for_batch(batch)
        message_type, result_type = workload.reply_type, workload.result_type
        results = []
        for i, request in enumerate(batch.requests):
            if i in outcome:
                results.append(outcome[i])
            elif i in expired:
                results.append(result_type(request.request_id, Status.EXPIRED))
            else:
                results.append(result_type(request.request_id, Status.ERROR, error=pending.rejected[i]))
        return message_type(batch_id=batch.batch_id, results=tuple(results), queue_ms=queue_ms,
                            compute_ms=compute_ms)

    def _refuse(self, pending: PendingBatch, code: str, message: str) -> Error:
        self.stats.add(errors=1)
        return Error(code=code, message=message, batch_id=pending.message.batch_id)
