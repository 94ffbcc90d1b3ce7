"""The gateway's Prometheus metrics (prometheus_client), one registry per gateway.

Exposed on GET /metrics: requests by route and outcome, the time from a work request's body read to
its answer written by outcome (how fast a refusal is answered), latency per stage in seconds (admission,
tokenize, queue, worker, total), queue depth, the workers the offered load needs (desired_workers,
gateway/demand.py), batch fill, workers ready, batches in flight, drops
by reason, the workers' compute (as they report it per batch) and the share of it wasted on answers
not delivered in time, predicted against measured batch service time, the learnt lateness (the
slack of admission and of the predicted-late drops), the prompt tokens of answered scoring requests
with those the workers reused instead of computing (shared prefixes, the static prefix), each
worker's prefix cache (hits, misses, insertions, evictions, hit tokens, bytes held and budget, from
its heartbeats), and the process's own CPU, memory and file descriptors. Gauges read the gateway's
state when scraped (`Gauge.set_function`), so nothing is updated per request for them. Each gateway has its own registry (never prometheus_client's global
one), so several gateways can live in one process (tests).

A drop is work the gateway took and then did not serve, counted once per request by the policy's
reason (shared.policy.DropReason); client errors (400, 401, 413, ...) are only
requests by outcome. Wasted compute is compute a worker spent on a request whose answer was not
delivered in time: `late` (answered after its deadline) or `dropped` (it failed after compute: the
answer came after the gateway gave up on it, or a sibling chunk failed); a batch's compute is shared
among its requests by the tokens each computed. Work dropped before compute wastes none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import prometheus_client
from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               PlatformCollector, ProcessCollector, generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.demand import WINDOW_S, Demand
from gateway.telemetry import stage_ended
from gateway.worker_link import Answered
from shared import protocol
from shared.policy import DropReason
from shared.policy.admission import LAG_HALF_LIFE_MS

BODY_TO_ANSWER_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.02, 0.05,
                            0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
"""Fine below 10 ms, where refusals land (the goal: <= 2 ms at p99), coarse up to the longest deadlines."""
ANSWER_OUTCOMES = ("ok", "deadline_unmeetable", "queue_full", "deadline_exceeded", "rejected", "failed")
"""How a request whose body was read was answered: served (ok), refused by admission (503
deadline_unmeetable, 429 queue_full), expired (504 deadline_exceeded), rejected (another 4xx: the
request's own fault) or failed (another 5xx: the gateway's or a worker's)."""
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
FILL_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
STAGES = ("admission", "tokenize", "queue", "worker", "total")
WORKLOADS = ("score", "beam")
DROP_REASONS = tuple(DropReason)
WASTE_REASONS = ("late", "dropped")
DEADLINE_CLASSES_MS = (10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 30_000)
"""Upper bounds of the deadline classes goodput is counted by: a request is in the smallest class at or
above its budget (as left when its service began), "+Inf" beyond the last."""


def deadline_class(budget_ms: float) -> str:
    """The label of the deadline class of a request with `budget_ms` (DEADLINE_CLASSES_MS)."""
    return next((str(bound) for bound in DEADLINE_CLASSES_MS if budget_ms <= bound), "+Inf")
CONTENT_TYPE = CONTENT_TYPE_LATEST

# `*_created` series (one timestamp per labelled counter) double the page for nothing a dashboard uses
prometheus_client.disable_created_metrics()


def drop_reason(code: str, reason: str | None) -> str | None:
    """The drop reason of an answer with error `code` (None: not a drop). `reason` is the one the
    failing part named; a 504 without one is the worker's own expiry (it answered `expired`)."""
    if reason is not None:
        return reason
    if code == "deadline_exceeded":
        return DropReason.EXPIRED_IN_WORKER
    return code if code in DROP_REASONS else None


PREFIX_CACHE_COUNTERS = {
    "hits": "Batch groups whose shared prefix (or a leading part of it) the worker's prefix cache held.",
    "misses": "Batch groups whose shared prefix the worker's prefix cache did not hold.",
    "insertions": "Prefixes the worker's prefix cache took in (on a second sighting, or a split request).",
    "evictions": "Prefixes the worker's prefix cache let go to stay within its budget.",
    "hit_tokens": "Prompt tokens read from the worker's prefix cache instead of computed.",
}
PREFIX_CACHE_GAUGES = {
    "bytes": ("bytes_held", "Bytes the worker's prefix cache holds (keys, values, token ids)."),
    "budget_bytes": ("budget_bytes", "The worker's prefix cache budget ([score] prefix_cache_mb; 0: off)."),
}


class PrefixCacheCollector:
    """Each worker's prefix cache as its latest heartbeat reported it (label `worker`: its endpoint);
    the counters are the worker's own, monotone while its process lives (a restart starts them at 0)."""

    def __init__(self, reports: Callable[[], Iterable[tuple[str, protocol.PrefixCacheReport]]]) -> None:
        self._reports = reports

    def collect(self) -> Iterator[Metric]:
        counters = {name: CounterMetricFamily(f"boundserve_prefix_cache_{name}", text, labels=("worker",))
                    for name, text in PREFIX_CACHE_COUNTERS.items()}
        gauges = {name: GaugeMetricFamily(f"boundserve_prefix_cache_{name}", text, labels=("worker",))
                  for name, (_, text) in PREFIX_CACHE_GAUGES.items()}
        for worker, report in self._reports():
            for name, family in counters.items():
                family.add_metric((worker,), getattr(report, name))
            for name, family in gauges.items():
                family.add_metric((worker,), getattr(report, PREFIX_CACHE_GAUGES[name][0]))
        yield from counters.values()
        yield from gauges.values()


class Metrics:
    """All gateway metrics on one registry; `render()` gives the text exposition (bytes)."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        self.requests = Counter("boundserve_requests", "HTTP requests by route and outcome (ok or error code).",
                                ("route", "outcome"), registry=registry)
        self.drops = Counter("boundserve_drops", "Requests taken and not served, by reason, once each: refused by "
                             "admission, expired in the queue or at the worker, predicted late, overdue, worker lost.",
                             ("reason",), registry=registry)
        stage = Histogram("boundserve_stage_latency_seconds", "Seconds spent per request in each stage.",
                          ("stage",), registry=registry, buckets=LATENCY_BUCKETS_S)
        fill = Histogram("boundserve_batch_fill_ratio", "Fraction of the compiled batch bound a sent batch used.",
                         ("workload",), registry=registry, buckets=FILL_BUCKETS)
        after_body = Histogram(
            "boundserve_body_to_answer_seconds", "Seconds from a work request's body fully read to its answer "
            "written, by outcome: ok, deadline_unmeetable / queue_full (refused by admission), deadline_exceeded, "
            "rejected (other 4xx), failed (other 5xx). Requests answered before their body was read are not in it.",
            ("outcome",), registry=registry, buckets=BODY_TO_ANSWER_BUCKETS_S)
        self._after_body = {name: after_body.labels(name) for name in ANSWER_OUTCOMES}
        self._stage = {name: stage.labels(name) for name in STAGES}  # children looked up once, not per request
        self._fill = {name: fill.labels(name) for name in WORKLOADS}
        self._requests: dict[tuple[str, str], Counter] = {}
        for reason in DROP_REASONS:
            self.drops.labels(reason)  # every reason shows from the start, at 0
        self._declare_score_tokens()
        self._declare_compute()
        self._declare_gauges()
        self.demand = Demand()
        """The recent arrivals, read by the desired_workers gauge (gateway/wiring.py sets its function)."""

    def _declare_score_tokens(self) -> None:
        self.score_prompt_tokens = Counter(
            "boundserve_score_prompt_tokens", "Prompt tokens of answered scoring requests (samples whole).",
            registry=self.registry)
        self.score_cached_tokens = Counter(
            "boundserve_score_cached_tokens", "Tokens of answered scoring requests whose keys/values the workers "
            "reused instead of computing (a shared prefix after its first use, the static prefix).",
            registry=self.registry)
        shared = Counter("boundserve_score_shared_requests", "Answered scoring requests, by whether their samples "
                         "were sent as one shared prefix plus suffixes.", ("shared",), registry=self.registry)
        self._shared = {True: shared.labels("true"), False: shared.labels("false")}

    def _declare_compute(self) -> None:
        r = self.registry
        compute = Counter("boundserve_worker_compute_seconds", "Seconds the workers computed answered batches, as "
                          "they reported them (their busy time).", ("workload",), registry=r)
        wasted = Counter("boundserve_wasted_compute_seconds", "Worker compute spent on requests whose answer was not "
                         "delivered in time: answered after the deadline (late) or failed after compute (dropped).",
                         ("workload", "reason"), registry=r)
        predicted = Counter("boundserve_batch_predicted_seconds", "Service time predicted for answered batches when "
                            "they were sent.", ("workload",), registry=r)
        service = Counter("boundserve_batch_service_seconds", "Measured service time of answered batches: send to "
                          "answer, less the wait in the worker's queue.", ("workload",), registry=r)
        answered = Counter("boundserve_answered", "Requests answered with a result, by whether the answer was ready by "
                           "its deadline (in_time) or after it (late): the in-time rate is the goodput.",
                           ("workload", "timing"), registry=r)
        self._answered = {(w, t): answered.labels(w, t) for w in WORKLOADS for t in ("in_time", "late")}
        self.answered_by_class = Counter(
            "boundserve_answered_by_class", "Requests answered with a result, by priority, deadline class (the "
            "smallest of " + ", ".join(map(str, DEADLINE_CLASSES_MS)) + " ms at or above the request's budget, "
            "else +Inf) and whether by the deadline (in_time) or after it (late): each class's in-time rate is "
            "its goodput.", ("workload", "priority", "deadline_class", "timing"), registry=r)
        self._compute = {w: compute.labels(w) for w in WORKLOADS}
        self._wasted = {(w, why): wasted.labels(w, why) for w in WORKLOADS for why in WASTE_REASONS}
        self._predicted = {w: predicted.labels(w) for w in WORKLOADS}
        self._service = {w: service.labels(w) for w in WORKLOADS}

    def _declare_gauges(self) -> None:
        r = self.registry
        self.queue_jobs = Gauge("boundserve_queue_jobs", "Jobs waiting in a workload's queue.", ("workload",),
                                registry=r)
        self.queue_tokens = Gauge("boundserve_queue_tokens", "Tokens waiting in a workload's queue.", ("workload",),
                                  registry=r)
        self.lateness = Gauge(
            "boundserve_lateness_seconds", "Learnt 98th percentile of how much later than predicted when their "
            "batch was sent requests are answered, beyond the event loop's present lag; added to predictions by "
            "admission and by the predicted-late drops.", ("workload",), registry=r)
        self.loop_lag = Gauge(
            "boundserve_loop_lag_seconds", "The gateway event loop's present lag (the largest sampled, halved every "
            f"{LAG_HALF_LIFE_MS:g} ms since); added to predictions with the learnt lateness.", ("workload",), registry=r)
        self.workers_ready = Gauge("boundserve_workers_ready", "Workers ready to take batches.", registry=r)
        self.batches_in_flight = Gauge("boundserve_batches_in_flight", "Batches sent and not yet answered.",
                                       registry=r)
        self.desired_workers = Gauge(
            "boundserve_desired_workers", "Workers this gateway's offered load needs to meet its deadlines "
            "(fractional, this gateway's share: sum over gateways and round up), from the workers' fitted latency "
            "model and the "
            f"last {WINDOW_S:g} s of arrivals: gateway/demand.py, the model of `loadgen tune --capacity`.", registry=r)

    def count_request(self, route: str, outcome: str, drop: str | None = None) -> None:
        """One answered HTTP request; `drop` names its drop reason when it was one."""
        child = self._requests.get((route, outcome))
        if child is None:  # labels() takes a lock and builds a key: once per (route, outcome), not per request
            child = self._requests[(route, outcome)] = self.requests.labels(route, outcome)
        child.inc()
        if drop is not None:
            self.drops.labels(drop).inc()

    def observe_stage(self, stage: str, ms: float) -> None:
        """Time one request spent in `stage`, in milliseconds (kept in seconds)."""
        self._stage[stage].observe(ms / 1000.0)
        stage_ended(stage, ms)  # a span of the request's trace, when tracing is on

    def observe_body_to_answer(self, code: str, status: int, seconds: float) -> None:
        """A work request answered `seconds` after its body was read, with error `code` ("ok": served)
        and HTTP `status`."""
        outcome = code if code in self._after_body else "rejected" if status < 500 else "failed"
        self._after_body[outcome].observe(seconds)

    def observe_batch(self, workload: str, fill: float) -> None:
        self._fill[workload].observe(fill)

    def observe_answer(self, answer: Answered) -> None:
        """A batch a worker answered: its round trip, compute, prediction and compute already wasted."""
        self._stage["worker"].observe(answer.round_trip_ms / 1000.0)
        self._compute[answer.workload].inc(answer.compute_ms / 1000.0)
        self._predicted[answer.workload].inc(answer.predicted_ms / 1000.0)
        self._service[answer.workload].inc(max(0.0, answer.service_ms) / 1000.0)
        if answer.dropped_ms:
            self.count_wasted(answer.workload, "dropped", answer.dropped_ms)

    def count_answer(self, workload: str, in_time: bool, priority: int = 0, budget_ms: float | None = None) -> None:
        """A request answered with a result, by its deadline or after it; by its priority and deadline
        class when its budget is given."""
        timing = "in_time" if in_time else "late"
        self._answered[(workload, timing)].inc()
        if budget_ms is not None:
            self.answered_by_class.labels(workload, str(priority), deadline_class(budget_ms), timing).inc()

    def count_wasted(self, workload: str, reason: str, compute_ms: float) -> None:
        """Compute spent on a request whose answer was not delivered in time (reason: late, dropped)."""
        self._wasted[(workload, reason)].inc(compute_ms / 1000.0)

    def count_score_tokens(self, prompt: int, cached: int, shared: bool) -> None:
        """An answered scoring request: tokens submitted, tokens reused, and whether it was sent shared."""
        self.score_prompt_tokens.inc(prompt)
        self.score_cached_tokens.inc(cached)
        self._shared[shared].inc()

    def watch_prefix_caches(self, reports: Callable[[], Iterable[tuple[str, protocol.PrefixCacheReport]]]) -> None:
        """Export the workers' prefix caches, read from `reports` (worker, latest report) at each scrape."""
        self.registry.register(PrefixCacheCollector(reports))

    def value(self, name: str, **labels: str) -> float:
        """The current value of one sample, 0 when it was never set (e.g. value("boundserve_drops_total",
        reason="queue_full"))."""
        return self.registry.get_sample_value(name, labels) or 0.0

    def render(self) -> bytes:
        return generate_latest(self.registry)
