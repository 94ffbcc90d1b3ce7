"""What the simulator puts around the gateway's policy: jobs cut from trace records, and workers.

Jobs are the gateway's own type (shared/policy/job.py), sized by a WorkSize as the gateway's are: a score request shares the prefix its trace record names by the
gateway's rule (shared/prefix.SharingRule), is cut into chunks by the same rule
(WorkSize.chunk_bounds) and reuses the deployment's static prefix as the gateway's jobs do
(shared/work.StaticPrefix); beam B = beams, one job per request. A record's context id is its
jobs' routing key; on a worker whose modelled prefix cache (loadgen/prefix_model.py) holds that
context, a job reuses the whole shared prefix.
A worker computes its batches one after another; it drops the members whose deadline passed before
their batch starts (as worker/compute.py does) and takes service(route, B, L) for the rest; a fixed
overhead per batch delays each batch on its way there and back without keeping the worker busy; the
worker's own work per batch beyond the compute, where measured, keeps it busy after each batch.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from shared.latency_correction import CorrectedModel
from loadgen.service import ServiceFn
from loadgen.trace import TraceRecord
from shared.latency_model import LatencyModel
from shared.policy import BatchBounds, busy_ms
from shared.policy.job import Job
from shared.prefix import NEVER_SHARE, SharingRule
from shared.prefix import prefix_key
from shared.request_ids import chunk_id
from shared.work import StaticPrefix, WorkSize
from loadgen.machine_pace import MachinePace
from loadgen.prefix_model import PrefixCacheModel

ROUTE_WORKLOAD = {"score": "score", "generate": "beam"}


@dataclass
class SimTag:
    """What the simulator keeps with a job (shared/policy/job.py's Job, the one job type), in its `handle`."""

    request: int
    """Index of the trace record."""
    split: bool = False
    """Its request was cut into several jobs (a worker's cache inserts their prefix at once)."""
    static_reused: int = 0
    """Tokens the static prefix alone saves it (what it reuses on a worker whose cache misses)."""


def tag(job: Job) -> SimTag:
    return job.handle


def cached_size(job: Job, reuse: StaticPrefix | PrefixCacheModel | None) -> WorkSize:
    """A simulated job's size: by the static prefix when it is made (as the gateway's), then on a
    worker whose modelled cache is `reuse` (None: none): the whole shared prefix when the cache holds
    its context (a sample ending with the prefix computes its last token: the model holds whole
    prefixes), else what the static prefix saves."""
    if isinstance(reuse, StaticPrefix):
        return WorkSize.of(job.token_ids, job.prefix_len, reuse)
    work = job.work
    held = reuse.holds(job.prefix_key) if reuse is not None and job.prefix_key is not None else 0
    if held and not all(work.suffix_lens):
        held = 0
    reused = max(held, tag(job).static_reused)
    return work if reused == work.reused_tokens else WorkSize(work.prefix_len, work.suffix_lens, reused)


def context_key(context: int, prefix_tokens: int) -> int:
    """Routing's key of a trace context (its prefix's tokens are stand-ins: the context names them)."""
    return prefix_key((-1 - context, prefix_tokens))


def jobs_of(index: int, record: TraceRecord, deadline_s: float, bounds: BatchBounds, default_beam_width: int,
            sharing: SharingRule = NEVER_SHARE, static_prefix_tokens: int = 0) -> list[Job]:
    """The jobs the gateway would queue for this record, on a deployment whose score node holds a
    static prefix of `static_prefix_tokens` tokens (0: none).

    A trace's samples are whole (the prompt template's header included), so each sample at least
    that long is taken to start with the static prefix: the samples' common prefix is then at least
    as long, and the gateway's own WorkSize.of and StaticPrefix count what each job reuses, on
    stand-in ids (sample i is 0, 1, ..., len - 1; the static prefix 0 .. n - 1)."""
    if record.route == "generate":
        beams, prompt = record.shape(default_beam_width)
        key = (beams, record.max_new_tokens or 0, record.num_return_sequences or 1)
        return [Job(str(index), "beam", deadline_s, [range(int(prompt))], beam_key=key, priority=record.priority,
                    handle=SimTag(index))]
    lengths = record.sample_tokens or _lengths(record)
    common = record.common_prefix_tokens()
    if static_prefix_tokens and min(lengths) >= static_prefix_tokens:
        common = max(common, static_prefix_tokens)
    prefix_len = sharing.prefix_len(common, len(lengths))
    samples = [range(n) for n in lengths]
    reuse = StaticPrefix(tuple(range(static_prefix_tokens)))
    whole = WorkSize.of(samples, prefix_len)
    cuts = whole.chunk_bounds(bounds.max_items_per_batch, bounds.max_tokens_per_batch)
    key = context_key(record.context, prefix_len) if record.context is not None and prefix_len else None
    jobs = [Job(str(index) if len(cuts) == 1 else chunk_id(str(index), k), "score", deadline_s, samples[start:end],
                prefix_len=prefix_len, reuse=reuse, prefix_key=key, priority=record.priority, sizer=cached_size,
                handle=SimTag(index, len(cuts) > 1)) for k, (start, end) in enumerate(cuts)]
    for job in jobs:
        tag(job).static_reused = job.work.reused_tokens
    return jobs


def _lengths(record: TraceRecord) -> tuple[int, ...]:
    size, mean = record.shape()
    return (max(1, round(mean)),) * size


@dataclass
class SimBatch:
    """A batch sent to a simulated worker: what was sent, and what the worker will do with it."""

    batch_id: int
    workload: str
    jobs: list[Job]
    sent_at: float
    predicted_ms: float
    expired: list[Job] = field(default_factory=list)
    """Members whose deadline had passed when the batch started: dropped uncomputed."""
    started_at: float = 0.0
    compute_ms: float = 0.0
    finish_at: float = 0.0


@dataclass
class SimWorker:
    """One worker: the gateway's corrected latency model of it, and its batches in flight (FIFO)."""

    index: int
    models: dict[str, CorrectedModel]
    in_flight: dict[int, SimBatch] = field(default_factory=dict)
    free_at: float = 0.0
    """When it will have computed everything it was sent (simulated seconds)."""
    overhead_ms: float = 0.0
    """Per batch, on the way there and back (half each way)."""
    after_ms: float = 0.0
    """Per batch, the worker's own work beyond the compute that keeps it busy (SimSettings.worker_ms_per_batch)."""
    compute_factor: float = 1.0
    """Every batch's compute is service x this (SimSettings.compute_factor)."""
    answered_at: float = -math.inf
    """When the gateway got its last answer (simulated seconds)."""
    cache: PrefixCacheModel | None = None
    """Its prefix cache (None: off); the gateway sees what it holds at once (a heartbeat's view)."""

    def busy_ms(self, now_s: float) -> float:
        """As the gateway predicts it (policy.busy_ms over what is in flight)."""
        batches = ((b.sent_at, b.predicted_ms, self.models[b.workload].overhead_ms) for b in self.in_flight.values())
        return busy_ms(batches, now_s, self.answered_at)

    def run(self, batch: SimBatch, route: str, service: ServiceFn, jitter: Jitter | None = None) -> None:
        """Accept `batch` at its send time. The overhead is time on the way there and back (messages,
        packing, waking up), half each way; the worker is busy while it computes, one batch after
        another, and for its own work after each (after_ms), and drops the members whose deadline
        passed before theirs starts."""
        start = batch.started_at = max(batch.sent_at + self.overhead_ms / 2000.0, self.free_at)
        live = [j for j in batch.jobs if j.deadline > start]
        batch.expired = [j for j in batch.jobs if j.deadline <= start]
        if self.cache is not None:
            for job in live:  # its prefix is read (a hit) or computed, then maybe inserted
                if job.prefix_key is not None and all(job.work.suffix_lens):
                    self.cache.serve(job.prefix_key, job.work.prefix_len, tag(job).split)
        items = sum(j.batch_items for j in live)
        batch.compute_ms = (self.compute_factor * service(route, items, sum(j.latency_tokens for j in live) / items)
                            if live else 0.0)
        if jitter is not None:
            batch.compute_ms = jitter.compute_ms(start * 1000.0, batch.compute_ms)
        batch.finish_at = start + (batch.compute_ms + self.overhead_ms / 2.0) / 1000.0
        self.free_at = start + (batch.compute_ms + self.after_ms) / 1000.0
        self.in_flight[batch.batch_id] = batch

    def finish(self, batch: SimBatch) -> None:
        """The answer is back: teach the model what the gateway would learn from it."""
        del self.in_flight[batch.batch_id]
        self.answered_at = batch.finish_at
        model = self.models[batch.workload]
        items = sum(j.batch_items for j in batch.jobs)
        if batch.compute_ms > 0:  # the gateway's service time: the round trip less the wait in the worker
            waited_ms = (batch.started_at - batch.sent_at) * 1000.0 - self.overhead_ms / 2.0
            model.observe(items, sum(j.latency_tokens for j in batch.jobs) / items, batch.compute_ms,
                          (batch.finish_at - batch.sent_at) * 1000.0 - waited_ms)


class Jitter:
    """Factors from measured ratios; always 1 when there are none. `in_order`: the k-th batch takes
    the k-th measured factor (cycling), so a slow spell of the machine lasts as it did live (the
    factors of consecutive live batches were correlated); otherwise factors are drawn at random
    (seeded). Not by time for measured sequences: a batch starting at a random moment falls more
    often inside a slow live batch than a fast one, which would bias the factors up.
    `slot_ms` > 0: by time instead (loadgen/machine_pace.py: slot n of slot_ms runs at a factor
    drawn for it alone), so that the service times are the same for every schedule and a
    clairvoyant bound can know them."""

    def __init__(self, ratios: tuple[float, ...], seed: int, in_order: bool = False, slot_ms: float = 0.0) -> None:
        self.ratios = ratios
        self.in_order = in_order
        self._random = random.Random(seed)
        self._next = 0
        self.pace = MachinePace(ratios, seed, slot_ms) if ratios and slot_ms > 0 else None
        if self.pace is not None and in_order:
            raise ValueError("Jitter: in_order (a measured sequence by batch) and slot_ms (factors by time) "
                             "exclude each other")

    def compute_ms(self, start_ms: float, model_ms: float) -> float:
        """A batch's compute started at `start_ms` (simulated ms) that the model puts at `model_ms`."""
        if self.pace is not None:
            return self.pace.finish_ms(start_ms, model_ms) - start_ms
        return model_ms * self.draw()

    def draw(self) -> float:
        if not self.ratios:
            return 1.0
        if self.in_order:
            self._next += 1
            return self.ratios[(self._next - 1) % len(self.ratios)]
        return self._random.choice(self.ratios)


@dataclass(frozen=True)
class Speed:
    """How fast the workers compute from `start_s` (simulated seconds) on: a service function and the
    jitter around it; and, if measured apart, the overhead per request around the gateway's queue.
    One speed serves a whole run unless the run's periods were measured apart (loadgen/validate.py
    measures each replayed segment's)."""

    start_s: float
    service: ServiceFn
    jitter: Jitter
    request_overhead_ms: float | None = None
    """HTTP, JSON and tokenizing per request in this period (None: the settings')."""


def speed_at(speeds: list[Speed], now_s: float) -> Speed:
    """The speed in force at now_s: the last one started by then (the first before any has)."""
    current = speeds[0]
    for speed in speeds:
        if speed.start_s <= now_s:
            current = speed
    return current


class ServiceCurve:
    """A service-time function seen as one workload's latency model (what CorrectedModel wraps)."""

    def __init__(self, route: str, service: ServiceFn) -> None:
        self.route = route
        self.service = service

    def predict_ms(self, batch_items: float, tokens_per_item: float) -> float:
        return self.service(self.route, batch_items, tokens_per_item)


def initial_model(route: str, service: ServiceFn) -> LatencyModel | ServiceCurve:
    """The start-up profile the worker would report: its fitted model when the service has one."""
    models = getattr(service, "models", None)
    if models is not None and ROUTE_WORKLOAD[route] in models:
        return models[ROUTE_WORKLOAD[route]]
    return ServiceCurve(route, service)
