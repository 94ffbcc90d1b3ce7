"""Offline discrete-event replay of a trace through the gateway's own scheduling policy.

Every decision and every state change around it is made by the object the gateway drives, one
Scheduler per workload (shared/policy/scheduler.py: precheck and admit with probes and learnt
lateness, the deadline-ordered queue, routing, holds, predicted-late drops and shedding, the batch
resized for its worker with its prediction, expiry, what answers and drops teach); this module
keeps only an event heap and a fake clock around it. Predictions come from the gateway's CorrectedModel (shared/latency_correction.py),
fed each simulated batch as the gateway feeds it the workers' answers. Only the world around the
gateway is simulated (loadgen/sim_world.py):
  clients   a request reaches the gateway request_overhead_ms / 2 after its scheduled time and its
            answer reaches the client as long after the gateway answers (HTTP, JSON, tokenizing);
  the loop  with gateway_ms_per_request, each arrival keeps the gateway's event loop busy that long:
            in a burst the loop runs late and every answer waits for it on its way back;
  workers   each computes its batches one after another (up to max_inflight_batches sent to it) for
            service(route, B, L) each, times a measured jitter if given (`speeds` may change both
            by period) and compute_factor; batch_overhead_ms delays a batch on its way there and back
            without keeping the worker busy, worker_ms_per_batch keeps it busy after each (the
            gateway's predictions start from `profile`, what the workers reported at start-up, and
            learn the rest); members whose deadline passed before it starts are dropped there
            (expired_in_worker); no answer within worker_timeout_ms after a deadline is answered
            504 (worker_overdue), as the gateway's timer does.
Batches are routed as the gateway routes them (shared/policy/routing.py: a record's `context` id is
its prefix's key), and each worker's prefix cache is modelled (loadgen/prefix_model.py, sized by
[score] prefix_cache_mb): a context it holds is not computed, and the predictions know it.
An answer after the deadline is still a success, only a late one. Results have the shape of live
ones (loadgen/result.py); `drops` counts the policy's drop reasons.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections import Counter
from dataclasses import dataclass
from typing import Any

from shared.bounds import Bounds, batch_bounds, batch_capacity
from shared.latency_correction import CorrectedModel
from shared.manifest import Manifest
from shared.prefix import SharingRule
from loadgen.result import RequestResult
from loadgen.service import ServiceFn
from loadgen.sim_world import (ROUTE_WORKLOAD, Jitter, SimBatch, SimWorker, Speed, initial_model, jobs_of, tag,
                               speed_at)
from loadgen.trace import Trace
from loadgen.prefix_model import PrefixCacheModel
from shared.policy import AdmissionSettings, BatchBounds, DeadlineQueue, DropReason, Hold, Lateness, PoolView, \
    Prediction, QueueOrder, Refusal
from shared.policy.routing import Placement, RecentHolders
from shared.policy.job import DONE, Job
from shared.policy.scheduler import Batch, DecisionLog, Drops, Scheduler, SchedulerSettings

STATUS = {"ok": 200, "queue_full": 429, "deadline_unmeetable": 503, "deadline_exceeded": 504}
WORKLOAD_ROUTE = {w: r for r, w in ROUTE_WORKLOAD.items()}


@dataclass(frozen=True)
class SimSettings:
    """The deployment the simulator replays: its Bounds, [gateway] names, and the world. Knobs
    (`with_knobs`) name these fields or a Bounds field (e.g. max_samples_per_batch)."""

    max_batch_wait_ms: float = 2.0
    max_queue_tokens: int = 65536
    admission_margin_ms: float = 1.0
    admission: bool = True
    """[gateway].admission: refuse at once a request predicted to finish past its deadline."""
    drop_predicted_late: bool = True
    """[gateway].drop_predicted_late: drop, before compute, queued work predicted to finish late."""
    shed_by_cost: bool = True
    """[gateway].shed_by_cost: under overload, refuse and drop the costliest per answer first."""
    queue_order: str = "deadline"
    """[gateway].queue_order: deadline (earliest deadline first) or arrival (first come, first served)."""
    score_deadline_ms: float = 100.0
    generate_deadline_ms: float = 200.0
    bounds: Bounds = Bounds(max_beam_width=128)
    """[bounds] (shared/bounds.py): what one batch may hold, as the gateway packs it."""
    min_shared_prefix_tokens: int = 4
    """[score]: a record's samples share their common prefix (TraceRecord.prefix_tokens) from this long."""
    static_prefix_tokens: int = 0
    """The score node's static prefix in tokens (its manifest's nodes.score.static_prefix_ids; 0:
    none): every sample at least this long starts with it and reuses its keys/values, as on the
    gateway (loadgen/sim_world.jobs_of)."""
    prefix_cache_tokens: int = 0
    """Each worker's prefix cache in tokens of keys/values ([score] prefix_cache_mb over the bytes
    per token: `cache_tokens`; 0: off): a record's context (its `context` id) is routed to the
    worker that holds it and, once held, not computed (loadgen/prefix_model.py)."""
    workers: int = 1
    max_inflight_batches: int = 2
    """Batches sent to one worker before its answer ([gateway].max_inflight_batches_per_worker)."""
    max_batch_requests: int = 0
    """Requests in one batch, 0 = no limit besides the caps (1 disables batching: Kingman's G/G/1)."""
    worker_timeout_ms: float = 1000.0
    """[gateway].worker_timeout_ms: the grace after a deadline before a missing answer is given up."""
    request_overhead_ms: float = 0.0
    """Time outside the gateway's queue and the workers (HTTP, JSON, tokenizing), half on the way in."""
    gateway_ms_per_request: float = 0.0
    """The gateway's one event loop's work per arrival (HTTP, JSON, tokenizing, admission; 0: none
    modelled): arrivals faster than it takes them make it run late, and an answer reaches the
    client, and the gateway's learnt lateness, only when the loop gets to it. Its lag is sampled
    into the learnt lateness's present lag at each arrival and answer, as the gateway's timer does."""
    batch_overhead_ms: float = 0.0
    """Time per batch around the compute (messages, packing, waking the worker), half each way."""
    worker_ms_per_batch: float = 0.0
    """The worker's own time per batch beyond its compute (receiving, decoding, answering) where that
    work shares the worker's cores with the compute: it keeps the worker busy after each batch."""
    compute_factor: float = 1.0
    """Every batch's compute is the service's time x this (x the jitter): how far the machine computes
    from a model fitted before the run (measured live: compute over the fitted model's prediction)."""
    compute_jitter: tuple[float, ...] = ()
    """Measured compute / the model's prediction, one value per measured batch: each simulated batch
    takes the model's time x one of these, drawn at random (seeded); empty = exactly the model's."""
    jitter_slot_ms: float = 0.0
    """0: each batch takes its own draw of compute_jitter (in send order, so which batch is slowed
    depends on the schedule). > 0: the jitter is the machine's by time (loadgen/machine_pace.py):
    every slot of this many ms runs at its own draw, whatever the schedule, which lets the
    clairvoyant bound (loadgen/bound.py) know every service time."""
    seed: int = 0
    default_beam_width: int = 16

    def with_knobs(self, knobs: dict[str, Any]) -> SimSettings:
        unknown = sorted(set(knobs) - set(KNOBS))
        if unknown:
            raise ValueError(f"unknown setting(s) {unknown}; the simulator knows {', '.join(KNOBS)}")
        bounds = {k: int(v) for k, v in knobs.items() if k in BOUND_KNOBS}
        settings = {k: v for k, v in knobs.items() if k not in BOUND_KNOBS}
        return dataclasses.replace(self, bounds=dataclasses.replace(self.bounds, **bounds), **settings)

    def deadline_ms(self, route: str) -> float:
        return self.score_deadline_ms if route == "score" else self.generate_deadline_ms

    def batch_bounds(self, workload: str) -> BatchBounds:
        return batch_bounds(self.bounds, workload, self.max_batch_requests)

    def sharing(self) -> SharingRule:
        """The gateway's sharing rule under these settings."""
        return SharingRule(self.min_shared_prefix_tokens, self.bounds.limit("max_prefix_tokens"))

    @classmethod
    def from_config(cls, config, manifest: Manifest | None = None, **world: Any) -> SimSettings:
        """From a shared.config.DeploymentConfig and, when given, its artifacts' manifest (the score
        node's static prefix), plus settings of the world (overheads, beam width)."""
        score = manifest.node_table().score if manifest is not None else None
        if score is not None:
            world = {"static_prefix_tokens": len(score.static_prefix_ids), **world}
        if manifest is not None:
            world = {"prefix_cache_tokens": cache_tokens(config.score.prefix_cache_mb, manifest), **world}
        g = config.gateway
        return cls(bounds=config.build_bounds, min_shared_prefix_tokens=config.score.min_shared_prefix_tokens,
                   max_batch_wait_ms=g.max_batch_wait_ms, max_queue_tokens=g.max_queue_tokens,
                   admission_margin_ms=g.admission_margin_ms, admission=g.admission,
                   drop_predicted_late=g.drop_predicted_late, shed_by_cost=g.shed_by_cost, queue_order=g.queue_order,
                   score_deadline_ms=g.score_deadline_ms, generate_deadline_ms=g.generate_deadline_ms,
                   workers=len(config.worker.endpoints),
                   max_inflight_batches=g.max_inflight_batches_per_worker,
                   worker_timeout_ms=g.worker_timeout_ms, **world)


def cache_tokens(prefix_cache_mb: int, manifest: Manifest) -> int:
    """Tokens of keys/values a worker's prefix cache of `prefix_cache_mb` MiB holds: per token, each
    layer's keys and values (kv heads x head dim at the packages' dtype) and its id (8 bytes)."""
    m = manifest.model
    if not (m.num_layers and m.num_kv_heads and m.head_dim):
        return 0  # a manifest that does not say the model's shapes (a stand-in's): no cache modelled
    per_token = m.num_layers * 2 * m.num_kv_heads * m.head_dim * DTYPE_BYTES.get(manifest.dtype, 4) + 8
    return prefix_cache_mb * (1 << 20) // per_token


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
BOUND_KNOBS = tuple(f.name for f in dataclasses.fields(Bounds))
KNOBS = tuple(f.name for f in dataclasses.fields(SimSettings) if f.name != "bounds") + BOUND_KNOBS


@dataclass
class _Request:
    jobs: list[Job]
    open_jobs: int
    prediction: Prediction
    done: bool = False


class Simulator:
    """Runs a trace through the policy above; `run` returns one RequestResult per record."""

    def __init__(self, settings: SimSettings, service: ServiceFn, profile: ServiceFn | None = None,
                 speeds: list[Speed] | None = None, log: DecisionLog | None = None) -> None:
        self.settings = settings
        self.log = log
        """When given, every scheduler decision is logged in it (the gateway's can keep the same log)."""
        self.service = service
        self.profile = profile or service
        """What the workers report at start-up, where the gateway's predictions start (default: the
        service time itself, an exact profile)."""
        self.speeds = speeds or [Speed(0.0, service, Jitter(settings.compute_jitter, settings.seed,
                                                                    slot_ms=settings.jitter_slot_ms))]
        """How fast the workers really compute, by period (default: `service` x the settings' jitter)."""
        self.drops: Counter[str] = Counter()
        self.reasons: dict[int, str] = {}
        """Trace index -> the drop reason it was answered for (requests not dropped are absent)."""
        self.compute_ms: Counter[int] = Counter()
        """Trace index -> the worker compute its jobs took (each job's share of its batch, by items)."""
        self.batch_fill: list[float] = []
        """Per batch sent: its samples (score) or requests (beam) over what one batch may hold."""
        self.computing: list[tuple[int, float, float]] = []
        """Per batch sent: (worker index, start, end of its compute), simulated seconds."""
        self.computed: list[tuple[float, float, float]] = []
        """Per batch computed, when it ends: (items, tokens per item, compute ms) of the members it computed,
        what a worker's batch_done line gives of it."""

    def run(self, trace: Trace) -> list[RequestResult]:
        s = self.settings
        self.now, self.records, self._ids = 0.0, trace.records, itertools.count(1)
        self.results = [RequestResult(i, r.route, r.t_ms, sent_ms=r.t_ms) for i, r in enumerate(trace.records)]
        self.requests: dict[int, _Request] = {}
        admission = AdmissionSettings(s.max_queue_tokens, s.admission_margin_ms, s.admission, s.shed_by_cost)
        self.schedulers = {w: Scheduler(w, SchedulerSettings(s.batch_bounds(w), admission, s.max_batch_wait_ms,
                                                             s.max_inflight_batches, s.drop_predicted_late,
                                                             QueueOrder(s.queue_order)),
                                        lambda job: str(tag(job).request), lambda worker: worker.cache, self.log)
                           for w in WORKLOAD_ROUTE}
        self.queues: dict[str, DeadlineQueue[Job]] = {w: sch.queue for w, sch in self.schedulers.items()}
        self.lateness: dict[str, Lateness] = {w: sch.lateness for w, sch in self.schedulers.items()}
        """The learnt lateness per workload: the slack of its drops and of admission."""
        self.workers = [SimWorker(i, {w: self._model(w) for w in WORKLOAD_ROUTE}, overhead_ms=s.batch_overhead_ms,
                                  after_ms=s.worker_ms_per_batch, compute_factor=s.compute_factor,
                                  cache=PrefixCacheModel(s.prefix_cache_tokens) if s.prefix_cache_tokens else None)
                        for i in range(s.workers)]
        self.recent = RecentHolders()
        """Which worker each context was last sent to (routing's memory, as the gateway's pool keeps it)."""
        self._events: list[tuple[float, int, str, Any]] = []
        self._loop_free_at = 0.0
        """When the gateway's event loop has done the work of every arrival so far (gateway_ms_per_request)."""
        self._wake_at: dict[str, float] = {}
        for i, record in enumerate(trace.records):
            self._at(record.t_ms / 1000.0 + self._request_overhead_ms(record.t_ms / 1000.0) / 2000.0, "arrive", i)
        while self._events:
            self.now, _, kind, payload = heapq.heappop(self._events)
            getattr(self, f"_on_{kind}")(payload)
            for workload in self.queues:
                self._dispatch(workload)
        return self.results

    def _request_overhead_ms(self, now_s: float) -> float:
        measured = speed_at(self.speeds, now_s).request_overhead_ms
        return self.settings.request_overhead_ms if measured is None else measured

    def _model(self, workload: str) -> CorrectedModel:
        items, tokens = batch_capacity(self.settings.bounds, workload)
        return CorrectedModel(initial_model(WORKLOAD_ROUTE[workload], self.profile), items, tokens)

    def _at(self, when_s: float, kind: str, payload: Any) -> None:
        heapq.heappush(self._events, (when_s, next(self._ids), kind, payload))

    # -- requests: the gateway's scoring/generation services -------------------------------------
    def _loop_lag_s(self) -> float:
        """How late the gateway's event loop runs now; sampled into every workload's present lag."""
        lag_s = max(0.0, self._loop_free_at - self.now)
        for lateness in self.lateness.values():  # as the gateway's timer: when the loop gets to it, how late
            lateness.lag.sample(self.now + lag_s, lag_s * 1000.0)
        return lag_s

    def _on_arrive(self, index: int) -> None:
        record = self.records[index]
        if self.settings.gateway_ms_per_request:
            self._loop_lag_s()
            self._loop_free_at = max(self._loop_free_at, self.now) + self.settings.gateway_ms_per_request / 1000.0
        workload = ROUTE_WORKLOAD[record.route]
        budget_ms = record.deadline_ms if record.deadline_ms is not None else self.settings.deadline_ms(record.route)
        deadline = self.now + budget_ms / 1000.0
        jobs = jobs_of(index, record, deadline, self.settings.batch_bounds(workload), self.settings.default_beam_width,
                       self.settings.sharing(), self.settings.static_prefix_tokens)
        if jobs[0].prefix_key is not None:  # sized for its context's home worker, as the gateway's jobs
            home = self._placement().home(jobs[0].prefix_key)
            for job in jobs:
                job.resize(self._by_name()[home].cache if home else None)
        scheduler, view, model = self.schedulers[workload], self._view(), self._admission_model(workload)
        decision = scheduler.precheck(str(index), deadline, sum(j.batch_items for j in jobs), self.now, view, model,
                                      record.priority)
        if decision is None:
            decision = scheduler.submit(jobs, self.now, view, model)
        if isinstance(decision, Refusal):
            self.drops[decision.reason] += 1
            self.reasons[index] = decision.reason
            self._answer(index, decision.code)
            return
        self.requests[index] = _Request(jobs, len(jobs), decision)
        for job in jobs:
            self._at(job.deadline, "expire", (workload, job))

    def _fail(self, job: Job, reason: str, code: str = "deadline_exceeded") -> None:
        job.state = DONE
        request = self.requests[tag(job).request]
        if request.done:
            return
        request.done = True
        # as the gateway's request end: the other chunks leave the queue, sent work that missed is learnt
        index = tag(job).request
        self.schedulers[ROUTE_WORKLOAD[self.records[index].route]].on_failed(request.jobs, reason, self.now)
        self.drops[reason] += 1
        self.reasons[index] = reason
        self._answer(index, code)

    def _succeed(self, job: Job) -> None:
        job.state = DONE
        index = tag(job).request
        request = self.requests[index]
        request.open_jobs -= 1
        if request.open_jobs == 0 and not request.done:
            request.done = True
            workload = ROUTE_WORKLOAD[self.records[index].route]
            answered_at = self.now + (self._loop_lag_s() if self.settings.gateway_ms_per_request else 0.0)
            self.schedulers[workload].on_answer(request.jobs, answered_at)
            self._answer(index, "ok", answered_at)

    def _answer(self, index: int, code: str, at_s: float | None = None) -> None:
        """The client gets the answer the gateway gives at `at_s` (default: now) half the overhead later."""
        result = self.results[index]
        at_s = self.now if at_s is None else at_s
        result.done_ms = at_s * 1000.0 + self._request_overhead_ms(self.now) / 2.0
        result.status, result.outcome = STATUS[code], code

    # -- timers and answers ------------------------------------------------------------------------
    def _on_expire(self, item: tuple[str, Job]) -> None:
        workload, job = item
        if job in self.queues[workload]:
            for expired in self.schedulers[workload].expire(max(self.now, job.deadline)):
                self._fail(expired, DropReason.EXPIRED_IN_QUEUE)

    def _on_overdue(self, job: Job) -> None:
        if job.state != DONE:
            self._fail(job, DropReason.WORKER_OVERDUE)

    def _on_wake(self, workload: str) -> None:
        self._wake_at.pop(workload, None)

    def _on_done(self, item: tuple[SimWorker, SimBatch]) -> None:
        worker, batch = item
        worker.finish(batch)
        computed = [j for j in batch.jobs if j not in batch.expired]
        items = sum(j.batch_items for j in computed)
        for job in computed:
            self.compute_ms[tag(job).request] += batch.compute_ms * job.batch_items / items
        if computed:
            self.computed.append((items, sum(j.latency_tokens for j in computed) / items, batch.compute_ms))
        for job in batch.jobs:
            if job.state == DONE:
                continue
            if job in batch.expired:
                self._fail(job, DropReason.EXPIRED_IN_WORKER)
            else:
                self._succeed(job)

    # -- the batcher -------------------------------------------------------------------------------
    def _dispatch(self, workload: str) -> None:
        scheduler = self.schedulers[workload]
        while True:
            decision = scheduler.step(self.now, self._by_name(), lambda w: w.models[workload], self.recent)
            if decision is None:
                return  # an answer (a freed slot) or an arrival triggers the next look
            if isinstance(decision, Hold):
                self._wake(workload, self.now + decision.wait_ms / 1000.0)
                return
            for job in decision.jobs if isinstance(decision, Drops) else decision.dropped:
                self._fail(job, DropReason.PREDICTED_LATE)
            if isinstance(decision, Batch):
                self._send(decision.worker, workload, decision.jobs, decision.predicted_ms)

    def _send(self, worker: SimWorker, workload: str, jobs: list[Job], predicted_ms: float) -> None:
        """Send a batch the scheduler formed (out of its queue, resized for `worker`, its prediction recorded)."""
        batch = SimBatch(next(self._ids), workload, jobs, self.now, predicted_ms)
        bounds = self.settings.batch_bounds(workload)
        self.batch_fill.append((sum(j.samples for j in jobs) if workload == "score" else len(jobs)) / bounds.max_items_per_batch)
        speed = speed_at(self.speeds, self.now)
        worker.run(batch, WORKLOAD_ROUTE[workload], speed.service, speed.jitter)
        self.computing.append((worker.index, batch.started_at, batch.started_at + batch.compute_ms / 1000.0))
        self._at(batch.finish_at, "done", (worker, batch))
        grace_s = self.settings.worker_timeout_ms / 1000.0
        for job in jobs:
            if batch.finish_at > job.deadline + grace_s:
                self._at(job.deadline + grace_s, "overdue", job)

    def _wake(self, workload: str, when_s: float) -> None:
        if when_s < self._wake_at.get(workload, float("inf")):
            self._wake_at[workload] = when_s
            self._at(when_s, "wake", workload)

    # -- the pool ----------------------------------------------------------------------------------
    def _by_name(self) -> dict[str, SimWorker]:
        """The workers by name, as routing names them (the gateway names them by endpoint)."""
        return {str(w.index): w for w in self.workers}

    def _placement(self) -> Placement:
        return Placement(self._by_name(), self.now, self.settings.max_inflight_batches, self.recent)

    def prefix_cache_hits(self) -> dict[str, int]:
        """The workers' modelled prefix caches, summed: hits, misses, insertions, evictions, hit tokens."""
        caches = [w.cache for w in self.workers if w.cache is not None]
        return {name: sum(getattr(c, name) for c in caches)
                for name in ("hits", "misses", "insertions", "evictions", "hit_tokens")}

    def _view(self) -> PoolView:
        return PoolView(len(self.workers), min(w.busy_ms(self.now) for w in self.workers),
                        sum(len(w.in_flight) for w in self.workers))

    def _admission_model(self, workload: str) -> CorrectedModel:
        """The fastest worker's model, as the gateway's admission uses."""
        return min((w.models[workload] for w in self.workers), key=lambda m: m.predict_ms(1, 64))


def simulate(trace: Trace, settings: SimSettings, service: ServiceFn,
             profile: ServiceFn | None = None) -> list[RequestResult]:
    """Convenience: one simulator run."""
    return Simulator(settings, service, profile).run(trace)
