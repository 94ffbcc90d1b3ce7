"""The gateway's running parts, wired together once the event loop runs (see app.make_app)."""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gateway.admission import Admission
from gateway.batcher import Batcher
from gateway.catalog_admin import CATALOG_UPDATE_TIMEOUT_S, CatalogAdmin
from gateway.discovery import DnsDiscovery
from gateway.generation import GenerateService
from gateway.limits import Limits
from gateway.loop_lag import LoopLagWatch
from gateway.metrics import Metrics
from gateway.scoring import ScoreService
from gateway.telemetry import OFF, Telemetry
from gateway.tokenizer import RequestTokenizer
from gateway.worker_pool import WorkerPool
from shared.bounds import batch_bounds
from shared import request_ids
from shared.config import DeploymentConfig, GatewayConfig
from shared.policy import AdmissionSettings, BatchBounds, QueueOrder
from shared.policy.scheduler import DecisionLog, Scheduler, SchedulerSettings
from shared.manifest import Manifest


def scheduler(workload: str, bounds: BatchBounds, gw: GatewayConfig, log: DecisionLog | None = None) -> Scheduler:
    """One workload's scheduler under the [gateway] settings; jobs are logged by their caller's request id."""
    settings = SchedulerSettings(bounds, AdmissionSettings(gw.max_queue_tokens, gw.admission_margin_ms, gw.admission,
                                                           gw.shed_by_cost),
                                 gw.max_batch_wait_ms, gw.max_inflight_batches_per_worker, gw.drop_predicted_late,
                                 QueueOrder(gw.queue_order))
    return Scheduler(workload, settings, lambda job: request_ids.client_id(job.request_id), lambda link: link.reuse,
                     log)


@dataclass(frozen=True)
class Settings:
    """What make_app was given: config, artifacts' manifest and tokenizer, and process-level choices."""

    config: DeploymentConfig
    manifest: Manifest
    tokenizer: RequestTokenizer
    auth_token: str | None = None
    span_exporter: Any = None
    """An OpenTelemetry span exporter to trace to instead of [telemetry]'s OTLP endpoint (tests)."""


@dataclass
class Gateway:
    """Pool, batchers, admission and the two services; owns their tasks and closes them."""

    settings: Settings
    limits: Limits
    metrics: Metrics
    pool: WorkerPool
    batchers: dict[str, Batcher]
    admission: Admission
    scoring: ScoreService
    generation: GenerateService
    executor: ThreadPoolExecutor
    draining: bool = False
    requests_in_progress: int = 0
    """/v1 requests taken (before a drain began) whose handlers have not returned: reading their bodies,
    tokenizing, queued or computing. A drain waits for them."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    lag_watch: LoopLagWatch | None = None
    _wire_ids: Any = field(default_factory=lambda: itertools.count(1))
    telemetry: Any = OFF
    """gateway/telemetry.py's Telemetry ([telemetry] enabled), else OFF."""
    catalogs: CatalogAdmin | None = None
    """POST /admin/constraints: catalogue updates sent to the workers."""

    @classmethod
    def build(cls, settings: Settings) -> Gateway:
        """Wire the parts (no I/O yet; `start` connects and starts the loops)."""
        config, gw = settings.config, settings.config.gateway
        vocab = settings.manifest.model.vocab_size or settings.tokenizer.vocab_size
        limits = Limits.of(config, settings.manifest, vocab)
        metrics = Metrics()
        discovery = DnsDiscovery.of(config.worker)  # None: the static endpoints list
        pool = WorkerPool(config.worker.endpoints if discovery is None else (), gw.worker_timeout_ms,
                          gw.max_inflight_batches_per_worker, metrics.observe_answer, limits.static_prefix, discovery,
                          limits.bounds)
        bounds = {workload: batch_bounds(limits.bounds, workload) for workload in ("score", "beam")}
        admission = Admission(pool)
        batchers = {w: Batcher(scheduler(w, b, gw), pool, gw.worker_timeout_ms, metrics) for w, b in bounds.items()}
        executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tokenize")
        score = ScoreService(settings.tokenizer, limits, batchers["score"], admission, metrics, executor,
                             gw.tokenize_offload_chars, pool.expected_reuse)
        generate = GenerateService(settings.tokenizer, limits, batchers["beam"], admission, metrics)
        telemetry = Telemetry.of(config.telemetry, settings.span_exporter)
        for link in pool.links:
            link.telemetry = telemetry
        catalogs = CatalogAdmin(lambda: pool.links, CATALOG_UPDATE_TIMEOUT_S)
        gateway = cls(settings, limits, metrics, pool, batchers, admission, score, generate, executor,
                      telemetry=telemetry, catalogs=catalogs)
        gateway._register_gauges()
        return gateway

    def _register_gauges(self) -> None:
        """The gauges read live state at each scrape."""
        m = self.metrics
        for workload, batcher in self.batchers.items():
            m.queue_jobs.labels(workload).set_function(lambda b=batcher: b.queued_jobs)
            m.queue_tokens.labels(workload).set_function(lambda b=batcher: b.queued_tokens)
            m.lateness.labels(workload).set_function(lambda b=batcher: b.lateness.value / 1000.0)
            m.loop_lag.labels(workload).set_function(lambda b=batcher: b.lateness.lag.ms(b.now()) / 1000.0)
        m.workers_ready.set_function(lambda: self.pool.ready_count())
        m.batches_in_flight.set_function(self.pool.in_flight_batches)
        m.desired_workers.set_function(lambda: m.demand.desired_workers(self.pool.clock(), self.pool.model))
        m.watch_prefix_caches(lambda: [(link.endpoint, link.prefix_cache) for link in self.pool.links])

    async def start(self) -> None:
        for batcher in self.batchers.values():
            self.pool.on_change(batcher.wake)
        self.pool.on_returned(lambda jobs: self.batchers[jobs[0].workload].requeue_returned(jobs))
        self.telemetry.start()  # the trace exporter process, when tracing is on
        await self.pool.start()
        self.tasks += [asyncio.create_task(b.run(), name=f"batcher {w}") for w, b in self.batchers.items()]
        self.lag_watch = LoopLagWatch([b.lateness.lag for b in self.batchers.values()])
        self.lag_watch.start()

    async def stop(self) -> None:
        if self.lag_watch is not None:
            self.lag_watch.stop()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.pool.stop()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.telemetry.shutdown()

    def wire_id(self, request_id: str) -> str:
        """A protocol-unique id that still shows the caller's id (callers may reuse theirs)."""
        return request_ids.wire_id(request_id, next(self._wire_ids))

    def idle(self) -> bool:
        """No request in progress, nothing queued and nothing in flight (drain is complete)."""
        return (self.requests_in_progress == 0 and all(b.queued_jobs == 0 for b in self.batchers.values())
                and self.pool.in_flight_batches() == 0)
