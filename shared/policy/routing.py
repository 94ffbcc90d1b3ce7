"""Cache-aware placement: a batch goes where its prefix's keys/values already are, unless that misses
its deadline.

Each worker keeps the prefixes it computed lately (worker/prefix_cache.py), so a repeated context is
only cheap on the worker that saw it. `route` chooses, in order:
  1. the worker that most recently got this prefix (`RecentHolders`), if its predicted finish is in
     time (with every slot taken, the batch waits for one);
  2. else the prefix's owners on a consistent-hash ring over the workers (`Ring`: 64 points each),
     clockwise from the prefix's point, skipping those that would finish late and those with more
     batches in flight than the least loaded free worker (consistent hashing with the tightest load
     bound): no worker holds the prefix yet, so a busier owner would gain nothing by it while the
     other idles (a looser bound let an owner with a batch in flight take a second one while the
     other worker had none). Adding or losing a worker moves only the prefixes it owns;
  3. else the usual least-busy worker (batching.least_busy).
Pure: the caller passes the time and the deadline test, as for every policy here.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Generic, Protocol, TypeVar

from shared.policy.batching import BatchBounds, Hold, Send, FinishEstimate, Worker, dispatch, least_busy
from shared.policy.cost import CostModel
from shared.prefix import hash64
from shared.policy.deadline_queue import DeadlineQueue, W

K = TypeVar("K", bound=Worker)

RING_POINTS = 64
"""Points per worker on the ring: each owns about 1/n of the prefixes, give or take ~10 %."""


@dataclass(frozen=True)
class Ring:
    """Points of the workers named `names`, sorted; a key belongs to the first point at or after it."""

    points: tuple[tuple[int, str], ...]

    @staticmethod
    @lru_cache(maxsize=64)
    def of(names: tuple[str, ...], points_each: int = RING_POINTS) -> Ring:
        return Ring(tuple(sorted((hash64(f"{name}#{i}".encode()), name) for name in names for i in range(points_each))))

    def owners(self, key: int) -> list[str]:
        """Every worker once, in ring order clockwise from `key` (its owner first)."""
        start = bisect.bisect_left(self.points, (key, "")) % max(1, len(self.points))
        seen: dict[str, None] = {}
        for i in range(len(self.points)):
            seen.setdefault(self.points[(start + i) % len(self.points)][1])
        return list(seen)


@dataclass
class RecentHolders:
    """Which worker got each prefix last: at most `capacity` prefixes, each for `memory_s` seconds."""

    capacity: int = 65536
    memory_s: float = 600.0
    _sent: OrderedDict[int, tuple[str, float]] = field(default_factory=OrderedDict)

    def get(self, key: int, now_s: float) -> str | None:
        held = self._sent.get(key)
        if held is None or now_s - held[1] > self.memory_s:
            return None
        return held[0]

    def record(self, key: int, name: str, now_s: float) -> None:
        self._sent[key] = (name, now_s)
        self._sent.move_to_end(key)
        while len(self._sent) > self.capacity:
            self._sent.popitem(last=False)


class Placement(Generic[K]):
    """The routing rule evaluated for many prefixes at one instant (the batcher asks it for every job
    it looks at): the free workers, the load bound and the ring are computed once. `choose` records
    nothing; `route` is `choose`, then the choice recorded in `recent`."""

    def __init__(self, workers: Mapping[str, K], now_s: float, max_inflight_batches: int,
                 recent: RecentHolders) -> None:
        self.now_s, self.recent, self.max_inflight_batches = now_s, recent, max_inflight_batches
        self.workers = dict(workers)
        self.free = {name: w for name, w in workers.items() if len(w.in_flight) < max_inflight_batches}
        self.fewest = min((len(w.in_flight) for w in self.free.values()), default=0)  # the ring owners' load bound
        self.ring = Ring.of(tuple(sorted(workers)))

    def home(self, key: int) -> str:
        """Where the prefix would go with every worker in time: its recent holder (even with every
        slot taken: the batch would wait for one), else its first ring owner among the least loaded
        free workers, else "" (no such worker)."""
        return next(iter(self._preferred(key)), "")

    def choose(self, key: int | None, in_time: Callable[[K], bool]) -> K | None:
        """The module's order for a batch whose prefix is `key` (None: least busy); None when every
        slot is taken. The recent holder is chosen while in time even when its slots are all taken
        (the batch waits for one: the caller sends nothing now), other owners only with a free slot."""
        if not self.free:
            return None
        if key is not None:
            name = next((n for n in self._preferred(key) if in_time(self.workers[n])), None)
            if name is not None:
                return self.workers[name]
        return least_busy(self.free.values(), self.now_s, self.max_inflight_batches)

    def _preferred(self, key: int) -> list[str]:
        holder = self.recent.get(key, self.now_s)
        preferred = [holder] if holder in self.workers else []
        return preferred + [name for name in self.ring.owners(key) if name in self.free and name != holder
                            and len(self.free[name].in_flight) <= self.fewest]

    def name_of(self, worker: K) -> str:
        return next(n for n, w in self.workers.items() if w is worker)


def route(key: int | None, workers: Mapping[str, K], now_s: float, max_inflight_batches: int,
          in_time: Callable[[K], bool], recent: RecentHolders) -> K | None:
    """Where a batch whose prefix is `key` goes (None: every slot is taken, or its holder's are and it
    is in time there: the batch waits for it); see the module's order.
    `in_time(worker)`: the batch sent there now would finish by its deadline. A keyless batch (no
    shared prefix) goes to the least busy worker. The choice is recorded in `recent`."""
    placement = Placement(workers, now_s, max_inflight_batches, recent)
    chosen = placement.choose(key, in_time)
    if chosen is None or len(chosen.in_flight) >= max_inflight_batches:
        return None  # every slot taken, or the prefix's holder is full and still in time: wait for it
    if key is not None:
        recent.record(key, placement.name_of(chosen), now_s)
    return chosen


class RoutedWork(Protocol):
    """What routing reads of a queued job besides the policy's counts: its prefix's key (None: no
    shared prefix)."""

    prefix_key: int | None
    deadline: float
    batch_items: int
    latency_tokens: int


def dispatch_routed(queue: DeadlineQueue[W], workload: str, bounds: BatchBounds, workers: Mapping[str, K],
                    model_of: Callable[[K], CostModel], now_s: float, max_inflight_batches: int,
                    recent: RecentHolders, lead_ms: float, drop_late: bool = True,
                    slack_ms: float = 0.0, shed_by_cost: bool = False) -> tuple[K, Send[W]] | Hold | None:
    """One batching decision over several workers, routing each queued job by its prefix.

    How routing meets batching: a batch goes to one worker, so each batch is formed FOR a worker.
    The workers with a free slot are tried least busy first; each gets `dispatch` over the jobs
    placed on it (`Placement.choose` on the job's prefix key, its in-time test the job alone
    behind that worker's work in flight): its own contexts, those whose home would finish them
    late, and jobs without a shared prefix (anyone's). The others stay queued for their own worker
    (a holder with every slot taken included, while it is in time: its answer frees one),
    so requests of one context land in batches for their worker, and a worker never idles behind a
    queue head that belongs elsewhere. The first worker with something to send gets its batch
    (returned with the worker; its jobs' keys are recorded as sent there); else the shortest Hold;
    None: nothing to send (every slot taken, or nothing placed on a free worker: an answer or a new
    job wakes the caller)."""
    placement = Placement(workers, now_s, max_inflight_batches, recent)
    estimates = {name: FinishEstimate(model_of(w), now_s, w.busy_ms(now_s), slack_ms) for name, w in placement.workers.items()}
    chosen: dict[int, str] = {}

    def home(job: RoutedWork) -> str:
        if job.prefix_key is None:
            return ""
        if id(job) not in chosen:
            in_time = lambda w: estimates[placement.name_of(w)].in_time(job.batch_items, job.latency_tokens,  # noqa: E731
                                                                        job.deadline)
            worker = placement.choose(job.prefix_key, in_time)
            chosen[id(job)] = placement.name_of(worker) if worker is not None else ""
        return chosen[id(job)]

    hold: Hold | None = None
    for name in sorted(placement.free, key=lambda n: (estimates[n].busy_ms, len(placement.free[n].in_flight))):
        worker = placement.free[name]
        plan = dispatch(queue, workload, bounds, model_of(worker), estimates[name].busy_ms, lead_ms, now_s,
                        drop_late, slack_ms, shed_by_cost, len(workers),
                        accept=lambda job, name=name: home(job) in ("", name))
        if isinstance(plan, Hold):
            hold = plan if hold is None or plan.wait_ms < hold.wait_ms else hold
        elif plan.live or plan.late:
            for job in plan.live:
                if job.prefix_key is not None:
                    recent.record(job.prefix_key, name, now_s)
            return worker, plan
    return hold
