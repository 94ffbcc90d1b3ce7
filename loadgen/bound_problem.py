"""The clairvoyant scheduling problem of a trace: each request's window and the least its work costs.

What a schedule is (what loadgen/simulator.py's workers do, and the gateway's): a worker runs
batches one after another, never preempted; a batch starts once every member has arrived and takes
T = (alpha*B + beta)*L + gamma*B + delta ms (shared/latency_model.py, B items, L mean computed
tokens per item) of the members it computes; a request counts (goodput) when all its jobs (the
chunks the gateway cuts it into: loadgen/sim_world.jobs_of) finish by its deadline.

Properties of T this module relies on, with N = B*L (the batch's computed tokens):
  T = alpha*N + beta*N/B + gamma*B + delta. alpha*N and gamma*B add up over members; delta is paid
  once per batch; beta*N/B is beta x the batch's mean tokens per item. With every coefficient >= 0
  (what LatencyModel.fit returns; checked here), T is subadditive (T(S + S') <= T(S) + T(S'): delta
  is paid once, and a weighted mean N/B is at most the sum of the parts' means) but NOT monotone:
  a short member lowers the mean L, so beta*N/B can fall when it joins.
A batch holds at most `max_items` items (score: samples) and `max_tokens` sent tokens (beam: at
most `max_requests` requests, no token bound). So, for any batch S within the bounds, with each
member's share s_j = lam*items_j/max_items + (1 - lam)*tokens_j/max_tokens (or requests_j/
max_requests), any lam in [0, 1]: sum_j s_j <= 1, and
  T(S) >= sum_j least_j,  least_j = alpha*n_j + gamma*b_j + beta*n_j/max_items + delta*s_j
(beta*N/B >= beta*N/max_items as B <= max_items; delta >= delta*sum_j s_j). `least_j` is the job's
cheapest possible cost under perfect batching; a batch holding job j takes at least
  alone_j = alpha*n_j + gamma*b_j + beta*n_j/max_items + delta.
A job's computed tokens are taken at their fewest: with a modelled prefix cache, its whole shared
prefix reused (a cache can do no better). Arrivals and answers are taken at the gateway's own
overheads (request_overhead_ms, batch_overhead_ms: they only shrink the window). Compute: with the
machine's jitter by time (SimSettings.jitter_slot_ms > 0, loadgen/machine_pace.py) the problem
knows the realised speed of every instant (`pace`: a batch of W model-ms started at t ends at
pace.finish_ms(t, W), whatever the schedule); with a jitter drawn per batch in send order, which
batch is slowed depends on the schedule, so compute is taken at the fastest the jitter ever runs
(its smallest factor: provable, and loose by that factor).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from loadgen.machine_pace import MachinePace
from loadgen.service import ServiceModel
from loadgen.sim_world import ROUTE_WORKLOAD, jobs_of
from loadgen.simulator import SimSettings
from loadgen.trace import Trace, TraceRecord
from shared.bounds import Bounds
from shared.latency_model import COEFFICIENTS, LatencyModel
from shared.work import WorkSize


@dataclass(frozen=True)
class JobWork:
    """One job of a request, as the latency model and the batch bounds count it."""

    workload: str
    items: int
    """B's share: samples (score) or beams (beam)."""
    computed_tokens: int
    """N's share: the latency model's tokens (computed tokens, or prompt x beams)."""
    sent_tokens: int
    """What max_tokens_per_batch counts."""


@dataclass(frozen=True)
class BatchLimits:
    """What one batch of a workload may hold, and how fast it runs: the latency model x `speed`
    (the fastest factor compute ever runs at against the model; 1: exactly the model)."""

    model: LatencyModel
    max_items: int
    max_tokens: int | None = None
    """score: sent tokens per batch; None for beam, whose second bound is requests."""
    max_requests: int | None = None
    """beam: requests per batch; None for score."""
    speed: float = 1.0

    def __post_init__(self) -> None:
        bad = [name for name in COEFFICIENTS if getattr(self.model, name) < 0]
        if bad:
            raise ValueError(f"the bound needs every latency model coefficient >= 0 (what LatencyModel.fit "
                             f"returns); {', '.join(bad)} < 0 in {self.model.to_dict()}")
        if self.max_items < 1 or (self.max_tokens is None) == (self.max_requests is None):
            raise ValueError(f"BatchLimits: max_items >= 1 and exactly one of max_tokens, max_requests; got "
                             f"{self.max_items}, {self.max_tokens}, {self.max_requests}")
        if not 0 < self.speed <= 1:
            raise ValueError(f"BatchLimits.speed must be in (0, 1], got {self.speed}")

    def batch_ms(self, jobs: Sequence[JobWork]) -> float:
        """The time a batch of `jobs` really takes (the simulator's service time, x speed)."""
        items = sum(j.items for j in jobs)
        tokens = sum(j.computed_tokens for j in jobs)
        return self.speed * self.model.predict_ms(items, tokens / items) if items else 0.0

    def fits(self, jobs: Sequence[JobWork]) -> bool:
        """Whether `jobs` fit one batch (the bounds the least costs count; labels and beam shapes are
        left out, which only lets more batches fit)."""
        if sum(j.items for j in jobs) > self.max_items:
            return False
        if self.max_tokens is not None:
            return sum(j.sent_tokens for j in jobs) <= self.max_tokens or len(jobs) == 1
        return len(jobs) <= self.max_requests

    def least_ms(self, job: JobWork, lam: float) -> float:
        """The cheapest a job can cost in a full batch (module docstring), delta shared by `lam`."""
        m = self.model
        second = (job.sent_tokens / self.max_tokens) if self.max_tokens is not None else 1.0 / self.max_requests
        share = lam * job.items / self.max_items + (1.0 - lam) * second
        return self.speed * (self._variable_ms(job) + m.delta * min(1.0, share))

    def alone_ms(self, job: JobWork) -> float:
        """The least time of any batch that holds `job`."""
        return self.speed * (self._variable_ms(job) + self.model.delta)

    def _variable_ms(self, job: JobWork) -> float:
        m = self.model
        return m.alpha * job.computed_tokens + m.gamma * job.items + m.beta * job.computed_tokens / self.max_items


@dataclass(frozen=True)
class Request:
    """One request of the problem: its window (ms on the trace's clock), its jobs and its class."""

    index: int
    release_ms: float
    """The earliest a batch holding it can start."""
    due_ms: float
    """The latest its batches may finish for its answer to be in time."""
    jobs: tuple[JobWork, ...]
    klass: str
    """The class its goodput is reported under (its deadline in ms, e.g. "50")."""


@dataclass(frozen=True)
class Problem:
    """A trace as the bound sees it: the requests and each workload's batch limits."""

    requests: tuple[Request, ...]
    limits: dict[str, BatchLimits]
    workers: int = 1
    pace: MachinePace | None = None
    """The machine's speed by time (None: constant, the limits' `speed`)."""

    def finish_ms(self, start_ms: float, model_ms: float) -> float:
        """When a batch whose time at the limits' speed is `model_ms`, started at `start_ms`, ends."""
        return start_ms + model_ms if self.pace is None else self.pace.finish_ms(start_ms, model_ms)

    def work_ms(self, starts_ms: np.ndarray, ends_ms: np.ndarray) -> np.ndarray:
        """What the workers can compute (ms at the limits' speed) in each [starts_ms[a], ends_ms[b]]:
        shape [len(starts), len(ends)]; negative where the end comes first."""
        if self.pace is None:
            return self.workers * (ends_ms[None, :] - starts_ms[:, None])
        return self.workers * self.pace.work_ms(starts_ms, ends_ms)

    def least_ms(self, request: Request, lam: float) -> float:
        return sum(self.limits[j.workload].least_ms(j, lam) for j in request.jobs)

    def alone_ms(self, request: Request) -> float:
        """The longest of its jobs' least batch times: no schedule serves it in a shorter window."""
        return max(self.limits[j.workload].alone_ms(j) for j in request.jobs)


def limits_of(settings: SimSettings, service: ServiceModel) -> dict[str, BatchLimits]:
    """Each workload's limits under the simulator's settings (its bounds, its jitter's fastest factor)."""
    bounds: Bounds = settings.bounds
    speed = 1.0 if settings.jitter_slot_ms > 0 else min((1.0, *settings.compute_jitter))
    if speed <= 0:
        raise ValueError(f"compute_jitter holds a factor {speed} <= 0; compute cannot take no time")
    limits = {}
    for workload, model in service.models.items():
        if workload == "score":
            limits[workload] = BatchLimits(model, bounds.max_samples_per_batch, max_tokens=bounds.max_tokens_per_batch,
                                           speed=speed)
        elif workload == "beam":
            limits[workload] = BatchLimits(model, bounds.max_beam_requests_per_batch * bounds.max_beam_width,
                                           max_requests=bounds.max_beam_requests_per_batch, speed=speed)
    return limits


def deadline_class(record: TraceRecord, budget_ms: float) -> str:
    """The default class of a request: its deadline in ms ("50"), as bench/overload_sim.py keys it."""
    return f"{budget_ms:g}"


def problem_of(trace: Trace, settings: SimSettings, service: ServiceModel,
               klass: Callable[[TraceRecord, float], str] = deadline_class) -> Problem:
    """The problem of replaying `trace` under `settings` (loadgen/simulator.py's world): each record's
    jobs as the gateway cuts them (jobs_of), deadlines as the simulator gives them, each request in
    the class `klass(record, deadline budget in ms)` names (a priority, once traces carry one)."""
    limits = limits_of(settings, service)
    inward_ms = settings.request_overhead_ms / 2.0 + settings.batch_overhead_ms / 2.0
    requests = []
    for index, record in enumerate(trace.records):
        workload = ROUTE_WORKLOAD[record.route]
        if workload not in limits:
            raise ValueError(f"trace record {index} is a {record.route!r} request; the latency model has no "
                             f"{workload!r} model (have {sorted(limits)})")
        budget_ms = record.deadline_ms if record.deadline_ms is not None else settings.deadline_ms(record.route)
        jobs = jobs_of(index, record, math.inf, settings.batch_bounds(workload), settings.default_beam_width,
                       settings.sharing(), settings.static_prefix_tokens)
        works = tuple(JobWork(workload, j.batch_items, _fewest_computed(j.work, j.prefix_key, settings), j.tokens)
                      for j in jobs)
        requests.append(Request(index, record.t_ms + inward_ms, record.t_ms + budget_ms - inward_ms, works,
                                klass(record, budget_ms)))
    widest = max((j.items for r in requests for j in r.jobs if j.workload == "beam"), default=0)
    if "beam" in limits and widest > settings.bounds.max_beam_width:  # the simulator does not refuse it: B may be more
        beam = limits["beam"]
        limits["beam"] = dataclasses.replace(beam, max_items=beam.max_requests * widest)
    pace = (MachinePace(settings.compute_jitter, settings.seed, settings.jitter_slot_ms)
            if settings.jitter_slot_ms > 0 and settings.compute_jitter else None)
    return Problem(tuple(requests), limits, settings.workers, pace)


def _fewest_computed(work: WorkSize, prefix_key: int | None, settings: SimSettings) -> int:
    """The latency model's tokens at their fewest: with a modelled prefix cache, a routed context's
    whole shared prefix reused (when every sample goes on after it, as the cache model requires)."""
    cached = settings.prefix_cache_tokens and prefix_key is not None and work.prefix_len
    if work.beams or not (cached and all(work.suffix_lens)):
        return work.latency_tokens
    return WorkSize(work.prefix_len, work.suffix_lens, max(work.reused_tokens, work.prefix_len)).latency_tokens
