"""Offline discrete-event simulator of the gateway's admission and batching over N workers.

It mirrors the gateway's policy (gateway/admission.py, gateway/batcher.py), driven by a
service-time function T(route, B, L) (loadgen/service.py) and a trace's arrivals:
  admission  queue_full (429) when the route's queue is not empty and its tokens plus this request's
             would pass max_queue_tokens; deadline_unmeetable (503) when
             soonest worker free + backlog(queued work)/workers + backlog(this request) + margin
             is past the deadline. backlog(work) = T of that work cut into full batches.
  queue      one earliest-deadline-first queue per route; a request still queued at its deadline is
             answered deadline_exceeded (504) then.
  batching   when a worker has a free slot (max_inflight_batches per worker), a batch is filled in
             deadline order up to the caps and sent if it is full, if its oldest request has waited
             max_batch_wait_ms, or if waiting longer would make its earliest deadline unmeetable
             (deadline - T(batch) - margin). Members predicted to finish past their deadline with this
             batch are answered deadline_exceeded instead of being sent.
  workers    run their batches one after another (FIFO); a score request larger than a batch's caps
             runs alone, as k equal consecutive batches. An answer that arrives after its deadline is
             still a success, just a late one (it counts against the SLO).
Routes share workers; each route's backlog estimate counts only its own queue, like the gateway's
per-workload batchers. Results have the same shape as live ones (loadgen/result.py).
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
from dataclasses import dataclass
from typing import Any

from loadgen.result import RequestResult
from loadgen.service import ServiceFn
from loadgen.trace import Trace, TraceRecord

FILL_SCAN_LIMIT = 64
"""Queued jobs looked at (in deadline order) when filling one batch, as the gateway's SCAN_LIMIT."""
KNOBS = ("max_batch_wait_ms", "max_queue_tokens", "admission_margin_ms", "score_deadline_ms",
         "generate_deadline_ms", "max_batch_tokens", "max_batch_samples", "max_beam_requests", "workers",
         "max_inflight_batches", "max_batch_requests", "request_overhead_ms")


@dataclass(frozen=True)
class SimSettings:
    """The gateway settings the simulator honours ([gateway] names; caps from [bounds])."""

    max_batch_wait_ms: float = 2.0
    max_queue_tokens: int = 65536
    admission_margin_ms: float = 1.0
    score_deadline_ms: float = 100.0
    generate_deadline_ms: float = 200.0
    max_batch_tokens: int = 4096
    """[bounds].max_tokens_per_batch: tokens in one score batch."""
    max_batch_samples: int = 16
    """[bounds].max_samples_per_batch."""
    max_beam_requests: int = 4
    """[bounds].max_beam_requests_per_batch."""
    workers: int = 1
    max_inflight_batches: int = 2
    """Batches sent to one worker before its answer ([gateway].max_inflight_batches_per_worker)."""
    max_batch_requests: int = 0
    """Requests in one batch, 0 = no limit besides the caps (1 disables batching: Kingman's G/G/1)."""
    request_overhead_ms: float = 0.0
    """Fixed time outside the worker (HTTP, JSON, tokenization, transport) added to every answer.
    Calibrate it as a live replay's p50 at low load minus T of one request."""
    default_beam_width: int = 16

    def with_knobs(self, knobs: dict[str, Any]) -> SimSettings:
        unknown = sorted(set(knobs) - set(KNOBS))
        if unknown:
            raise ValueError(f"unknown setting(s) {unknown}; the simulator knows {', '.join(KNOBS)}")
        return dataclasses.replace(self, **knobs)

    def deadline_ms(self, route: str) -> float:
        return self.score_deadline_ms if route == "score" else self.generate_deadline_ms


@dataclass
class _Job:
    index: int
    route: str
    arrival: float
    deadline: float
    size: int
    """score: samples; generate: beams."""
    tokens: int
    """score: all tokens; generate: prompt tokens."""
    alone_ms: float


class _RouteQueue:
    """Queued jobs of one route: a deadline-sorted list, and lazy-deleted arrival and deadline heaps."""

    def __init__(self) -> None:
        self.jobs: dict[int, _Job] = {}
        self.by_deadline: list[tuple[float, int]] = []
        self.by_arrival: list[tuple[float, int]] = []
        self.by_expiry: list[tuple[float, int]] = []
        self.size = 0
        self.tokens = 0

    def push(self, job: _Job) -> None:
        self.jobs[job.index] = job
        bisect.insort(self.by_deadline, (job.deadline, job.index))
        heapq.heappush(self.by_arrival, (job.arrival, job.index))
        heapq.heappush(self.by_expiry, (job.deadline, job.index))
        self.size += job.size
        self.tokens += job.tokens

    def remove(self, job: _Job) -> None:
        del self.jobs[job.index]
        del self.by_deadline[bisect.bisect_left(self.by_deadline, (job.deadline, job.index))]
        self.size -= job.size
        self.tokens -= job.tokens

    def head(self, heap: list[tuple[float, int]]) -> tuple[float, int] | None:
        if heap is self.by_deadline:
            return heap[0] if heap else None
        while heap and heap[0][1] not in self.jobs:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def in_deadline_order(self, limit: int) -> list[_Job]:
        return [self.jobs[i] for _, i in self.by_deadline[:limit]]


class Simulator:
    """Runs a trace through the policy above; `run` returns one RequestResult per record."""

    def __init__(self, settings: SimSettings, service: ServiceFn) -> None:
        self.settings = settings
        self.service = service

    def run(self, trace: Trace) -> list[RequestResult]:
        workers = self.settings.workers
        self.now = 0.0
        self.queues = {"score": _RouteQueue(), "generate": _RouteQueue()}
        self.free_at = [0.0] * workers
        self.inflight = [0] * workers
        self.running: list[tuple[float, int, int, list[_Job]]] = []
        self.results = [RequestResult(i, r.route, r.t_ms, sent_ms=r.t_ms) for i, r in enumerate(trace.records)]
        records, nxt, batch_ids = trace.records, 0, 0
        while nxt < len(records) or self.running or any(q.jobs for q in self.queues.values()):
            arrival = records[nxt].t_ms if nxt < len(records) else math.inf
            self.now = min(arrival, self._next_internal_event())
            if math.isinf(self.now):
                break
            self._complete()
            while nxt < len(records) and records[nxt].t_ms <= self.now:
                self._admit(nxt, records[nxt])
                nxt += 1
            self._expire()
            batch_ids = self._dispatch(batch_ids)
        return self.results

    # -- events -------------------------------------------------------------------------------
    def _next_internal_event(self) -> float:
        times = [self.running[0][0]] if self.running else []
        slot = self._free_worker() is not None
        for route, queue in self.queues.items():
            if queue.jobs:
                times.append(queue.head(queue.by_expiry)[0])
                if slot:
                    times.append(max(self.now, self._send_at(route, queue)))
        return min(times, default=math.inf)

    def _send_at(self, route: str, queue: _RouteQueue) -> float:
        batch = self._fill(route, queue)
        if self._is_full(route, queue, batch):
            return self.now
        oldest = min(j.arrival for j in batch)
        urgent = min(j.deadline for j in batch)
        return min(oldest + self.settings.max_batch_wait_ms,
                   urgent - self._time(route, batch) - self.settings.admission_margin_ms)

    def _complete(self) -> None:
        while self.running and self.running[0][0] <= self.now:
            finish, _, worker, jobs = heapq.heappop(self.running)
            self.inflight[worker] -= 1
            for job in jobs:
                self._answer(job.index, finish, 200, "ok")

    def _expire(self) -> None:
        for queue in self.queues.values():
            while (head := queue.head(queue.by_expiry)) is not None and head[0] <= self.now:
                job = queue.jobs[head[1]]
                queue.remove(job)
                self._answer(job.index, self.now, 504, "deadline_exceeded")

    def _dispatch(self, batch_id: int) -> int:
        while (worker := self._free_worker()) is not None:
            ready = [(q.head(q.by_deadline)[0], route) for route, q in self.queues.items()
                     if q.jobs and self._send_at(route, q) <= self.now + 1e-9]
            if not ready:
                break
            route = min(ready)[1]
            batch = self._take_batch(route, self.queues[route])
            if not batch:
                continue
            finish = max(self.now, self.free_at[worker]) + self._time(route, batch)
            self.free_at[worker] = finish
            self.inflight[worker] += 1
            batch_id += 1
            heapq.heappush(self.running, (finish, batch_id, worker, batch))
        return batch_id

    def _free_worker(self) -> int | None:
        slots = [w for w in range(self.settings.workers) if self.inflight[w] < self.settings.max_inflight_batches]
        return min(slots, key=lambda w: self.free_at[w]) if slots else None

    # -- policy -------------------------------------------------------------------------------
    def _admit(self, index: int, record: TraceRecord) -> None:
        job = self._job(index, record)
        settings = self.settings
        queue = self.queues[record.route]
        if queue.jobs and queue.tokens + job.tokens > settings.max_queue_tokens:
            return self._answer(index, self.now, 429, "queue_full")
        soonest = min(max(0.0, t - self.now) for t in self.free_at)
        wait = soonest + self._backlog_ms(record.route, queue.size, queue.tokens, len(queue.jobs)) / settings.workers
        if self.now + wait + job.alone_ms + settings.admission_margin_ms > job.deadline:
            return self._answer(index, self.now, 503, "deadline_unmeetable")
        queue.push(job)

    def _backlog_ms(self, route: str, size: int, tokens: int, requests: int) -> float:
        """T of this much queued work cut into full batches (the gateway's backlog_ms)."""
        if requests == 0:
            return 0.0
        if route == "score":
            batches = max(1, math.ceil(size / self.settings.max_batch_samples),
                          math.ceil(tokens / self.settings.max_batch_tokens))
            return batches * self.service(route, size / batches, tokens / max(size, 1))
        batches = max(1, math.ceil(requests / self.settings.max_beam_requests))
        return batches * self.service(route, size / batches, tokens / requests)

    def _take_batch(self, route: str, queue: _RouteQueue) -> list[_Job]:
        """Take the batch out of the queue; members predicted late are answered 504 instead."""
        batch = self._fill(route, queue)
        finish = self.now + self._time(route, batch)
        live = []
        for job in batch:
            queue.remove(job)
            if finish > job.deadline:
                self._answer(job.index, self.now, 504, "deadline_exceeded")
            else:
                live.append(job)
        return live

    def _fill(self, route: str, queue: _RouteQueue) -> list[_Job]:
        batch: list[_Job] = []
        for job in queue.in_deadline_order(FILL_SCAN_LIMIT):
            if self._fits_batch(route, batch + [job]):
                batch.append(job)
            elif route == "generate" or sum(j.size for j in batch) >= self.settings.max_batch_samples:
                break
        return batch

    def _fits_batch(self, route: str, jobs: list[_Job]) -> bool:
        if len(jobs) == 1:
            return True  # a request larger than a batch runs alone, split (see _time)
        if 0 < self.settings.max_batch_requests < len(jobs):
            return False
        if route == "score":
            return (sum(j.size for j in jobs) <= self.settings.max_batch_samples
                    and sum(j.tokens for j in jobs) <= self.settings.max_batch_tokens)
        return len(jobs) <= self.settings.max_beam_requests

    def _is_full(self, route: str, queue: _RouteQueue, batch: list[_Job]) -> bool:
        """Full when a queued job did not fit, or the batch reached a cap."""
        if len(batch) < len(queue.jobs):
            return True
        if 0 < self.settings.max_batch_requests <= len(batch):
            return True
        if route == "score":
            return (sum(j.size for j in batch) >= self.settings.max_batch_samples
                    or sum(j.tokens for j in batch) >= self.settings.max_batch_tokens)
        return len(batch) >= self.settings.max_beam_requests

    def _time(self, route: str, jobs: list[_Job]) -> float:
        if not jobs:
            return 0.0
        size = sum(j.size for j in jobs)
        if route == "score":
            tokens = sum(j.tokens for j in jobs)
            splits = max(1, math.ceil(size / self.settings.max_batch_samples),
                         math.ceil(tokens / self.settings.max_batch_tokens))
            return splits * self.service(route, size / splits, tokens / size)
        return self.service(route, size, sum(j.tokens for j in jobs) / len(jobs))

    def _job(self, index: int, record: TraceRecord) -> _Job:
        size, mean_tokens = record.shape(self.settings.default_beam_width)
        tokens = record.total_tokens() if record.route == "score" else int(mean_tokens)
        deadline_ms = record.deadline_ms if record.deadline_ms is not None else self.settings.deadline_ms(record.route)
        alone = self._backlog_ms(record.route, size, tokens, 1)
        return _Job(index, record.route, record.t_ms, record.t_ms + deadline_ms, size, tokens, alone)

    def _answer(self, index: int, done_ms: float, status: int, outcome: str) -> None:
        result = self.results[index]
        result.done_ms, result.status, result.outcome = done_ms + self.settings.request_overhead_ms, status, outcome


def simulate(trace: Trace, settings: SimSettings, service: ServiceFn) -> list[RequestResult]:
    """Convenience: one simulator run."""
    return Simulator(settings, service).run(trace)
