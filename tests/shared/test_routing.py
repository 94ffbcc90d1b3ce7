"""Cache-aware routing (shared/policy/routing.py), on a fake clock: a prefix returns to the worker
that got it, unless that worker is full, over the load bound or would finish late; the ring moves
only a lost worker's share."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.policy import Hold
from shared.policy.routing import RecentHolders, Ring, dispatch_routed, route
from shared.prefix import prefix_key

MAX_INFLIGHT = 4


@dataclass
class FakeWorker:
    """What placement reads of a worker: its batches in flight and their predicted remaining ms."""

    name: str
    in_flight: list = field(default_factory=list)
    remaining_ms: float = 0.0

    def busy_ms(self, now_s: float) -> float:
        return self.remaining_ms


def pool(n: int) -> dict[str, FakeWorker]:
    return {f"w{i}": FakeWorker(f"w{i}") for i in range(n)}


def always(_worker) -> bool:
    return True


def test_a_prefix_goes_back_to_the_worker_that_got_it():
    workers, recent = pool(4), RecentHolders()
    key = prefix_key([1, 2, 3, 4])
    first = route(key, workers, 0.0, MAX_INFLIGHT, always, recent)
    first.in_flight.append("batch")  # busier than the idle others: least-busy would go elsewhere
    first.remaining_ms = 30.0
    assert route(key, workers, 1.0, MAX_INFLIGHT, always, recent) is first


def test_a_holder_that_would_finish_late_loses_the_prefix_to_the_next_owner_in_time():
    workers, recent = pool(3), RecentHolders()
    key = prefix_key([9, 9, 9])
    holder = route(key, workers, 0.0, MAX_INFLIGHT, always, recent)
    holder.remaining_ms = 500.0
    ring_order = [n for n in Ring.of(tuple(sorted(workers))).owners(key) if n != holder.name]
    workers[ring_order[0]].remaining_ms = 200.0  # late too
    late = route(key, workers, 1.0, MAX_INFLIGHT, lambda w: w.remaining_ms < 100.0, recent)
    assert late is workers[ring_order[1]]
    # the new holder is remembered: the prefix now follows it
    assert route(key, workers, 2.0, MAX_INFLIGHT, always, recent) is late


def test_no_one_in_time_falls_back_to_least_busy():
    workers, recent = pool(2), RecentHolders()
    workers["w0"].remaining_ms, workers["w1"].remaining_ms = 50.0, 10.0
    assert route(prefix_key([5]), workers, 0.0, MAX_INFLIGHT, lambda w: False, recent) is workers["w1"]


def test_a_full_holder_in_time_keeps_its_prefix_and_none_when_every_slot_is_taken():
    workers, recent = pool(2), RecentHolders()
    key = prefix_key([1, 1])
    holder = route(key, workers, 0.0, MAX_INFLIGHT, always, recent)
    holder.in_flight.extend(["b"] * MAX_INFLIGHT)
    assert route(key, workers, 1.0, MAX_INFLIGHT, always, recent) is None  # in time there: wait for a slot
    other = route(key, workers, 1.0, MAX_INFLIGHT, lambda w: w is not holder, recent)  # late there: move
    assert other is not None and other is not holder
    other.in_flight.extend(["b"] * MAX_INFLIGHT)
    assert route(key, workers, 2.0, MAX_INFLIGHT, always, recent) is None


def test_a_new_prefix_goes_to_its_ring_owner_only_when_no_worker_is_less_loaded():
    workers = pool(2)
    key = prefix_key([7, 7, 7])
    owner_name, other_name = Ring.of(("w0", "w1")).owners(key)
    owner, other = workers[owner_name], workers[other_name]
    # equal loads: the ring decides, the same way for every gateway and every time
    assert route(key, workers, 0.0, MAX_INFLIGHT, always, RecentHolders()) is owner
    owner.in_flight.append("b")
    owner.remaining_ms = 5.0
    other.in_flight.append("b")
    other.remaining_ms = 50.0
    assert route(key, workers, 0.0, MAX_INFLIGHT, always, RecentHolders()) is owner
    # one batch more on the owner: nobody holds the prefix yet, so the less loaded worker takes it
    # rather than idle (the ring's plain load bound let one of two workers idle at zero reuse)
    owner.in_flight.append("b")
    assert route(key, workers, 0.0, MAX_INFLIGHT, always, RecentHolders()) is other


def test_a_prefix_sent_before_stays_with_its_holder_though_another_worker_is_idle():
    workers, recent = pool(2), RecentHolders()
    key = prefix_key([3, 1, 4])
    holder = route(key, workers, 0.0, MAX_INFLIGHT, always, recent)
    holder.in_flight.extend(["b", "b"])
    holder.remaining_ms = 40.0
    assert route(key, workers, 1.0, MAX_INFLIGHT, always, recent) is holder


def test_holders_are_forgotten_after_memory_s_and_beyond_capacity():
    recent = RecentHolders(capacity=2, memory_s=10.0)
    recent.record(1, "w0", 0.0)
    assert recent.get(1, 10.0) == "w0" and recent.get(1, 10.5) is None
    recent.record(2, "w1", 0.0)
    recent.record(3, "w1", 0.0)
    assert recent.get(1, 1.0) is None and recent.get(3, 1.0) == "w1"


def test_losing_a_worker_moves_only_its_share_of_prefixes():
    keys = [prefix_key([i, i + 1, i + 2]) for i in range(2000)]
    before = Ring.of(("w0", "w1", "w2", "w3"))
    after = Ring.of(("w0", "w1", "w3"))
    owner_before = [before.owners(k)[0] for k in keys]
    owner_after = [after.owners(k)[0] for k in keys]
    moved = [b for b, a in zip(owner_before, owner_after) if a != b]
    assert moved and set(moved) == {"w2"}
    shares = {name: owner_before.count(name) / len(keys) for name in ("w0", "w1", "w2", "w3")}
    assert all(0.1 < share < 0.4 for share in shares.values()), shares


def test_a_batch_without_a_prefix_goes_to_the_least_busy():
    workers = pool(3)
    workers["w0"].remaining_ms, workers["w1"].remaining_ms, workers["w2"].remaining_ms = 9.0, 1.0, 5.0
    assert route(None, workers, 0.0, MAX_INFLIGHT, always, RecentHolders()) is workers["w1"]


@dataclass
class QueueWorker:
    """A worker serving batches one after another: in_flight holds their finish times (s)."""

    name: str
    contexts: int  # how many contexts its cache holds (least recently used evicted)
    in_flight: list = field(default_factory=list)
    cache: dict = field(default_factory=dict)

    def busy_ms(self, now_s: float) -> float:
        self.in_flight[:] = [t for t in self.in_flight if t > now_s]
        return max(self.in_flight, default=now_s) * 1000.0 - now_s * 1000.0

    def serve(self, context: int, now_s: float, service_ms: float) -> bool:
        hit = context in self.cache
        self.cache.pop(context, None)
        self.cache[context] = None
        while len(self.cache) > self.contexts:
            self.cache.pop(next(iter(self.cache)))
        self.in_flight.append(now_s + (self.busy_ms(now_s) + service_ms) / 1000.0)
        return hit


def hit_rate(workers: dict[str, QueueWorker], choose, requests: int = 6000, seed: int = 1) -> float:
    """Zipf(1.0) contexts over 400, Poisson arrivals at ~60 % of the workers' capacity, 10 ms each."""
    import random

    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) for rank in range(400)]
    service_ms, now, hits = 10.0, 0.0, 0
    rate_per_s = 0.6 * len(workers) * 1000.0 / service_ms
    for context in rng.choices(range(400), weights, k=requests):
        now += rng.expovariate(rate_per_s)
        for w in workers.values():
            w.busy_ms(now)  # batches done by now leave in_flight
        worker = choose(context, workers, now)
        hits += worker.serve(context, now, service_ms)
    return hits / requests


def test_routing_keeps_nine_tenths_of_a_single_workers_hit_rate_where_least_busy_does_not():
    recent = RecentHolders()

    def routed(context, workers, now):
        in_time = lambda w: w.busy_ms(now) + 10.0 <= 50.0  # a 50 ms deadline  # noqa: E731
        return route(prefix_key([context]), workers, now, 64, in_time, recent)

    def least(context, workers, now):
        return route(None, workers, now, 64, always, recent)

    single = hit_rate({"w0": QueueWorker("w0", 100)}, least)  # one worker, both caches' room (and queue)
    two = hit_rate({"w0": QueueWorker("w0", 50), "w1": QueueWorker("w1", 50)}, routed)
    spread = hit_rate({"w0": QueueWorker("w0", 50), "w1": QueueWorker("w1", 50)}, least)
    assert two >= 0.9 * single
    assert spread < 0.9 * single


@dataclass(eq=False)
class RoutedJob:
    """A queued job as routing reads it (shared/policy's Work plus its prefix key)."""

    prefix_key: int | None
    deadline: float = 10.0
    samples: int = 1
    tokens: int = 10
    batch_items: int = 1
    latency_tokens: int = 10
    label_ids: tuple = ()
    beam_key: None = None
    priority: int = 0


class FixedModel:
    verified = False

    def predict_ms(self, batch_items, tokens_per_item):
        return 5.0

    def backlog_ms(self, items, tokens):
        return 5.0


def routed(queue, workers, recent, now=0.0, lead_ms=2.0):
    from shared.policy import BatchBounds

    return dispatch_routed(queue, "score", BatchBounds(max_items_per_batch=8, max_tokens_per_batch=1000, max_labels=4), workers,
                           lambda w: FixedModel(), now, MAX_INFLIGHT, recent, lead_ms)


def queue_of(jobs):
    from shared.policy import DeadlineQueue

    queue = DeadlineQueue()
    for job in jobs:
        queue.push(job)
    return queue


def test_a_batch_is_formed_for_a_worker_from_the_jobs_placed_on_it():
    workers, recent = pool(2), RecentHolders()
    a, b = prefix_key([1, 2, 3]), prefix_key([4, 5, 6])
    recent.record(a, "w0", 0.0)
    recent.record(b, "w1", 0.0)
    jobs = [RoutedJob(b, 1.0), RoutedJob(a, 2.0), RoutedJob(None, 3.0), RoutedJob(b, 4.0), RoutedJob(a, 5.0)]
    queue = queue_of(jobs)
    worker, plan = routed(queue, workers, recent)
    # both idle: w0 is tried first and takes its own context and the keyless job; b's stay for w1
    assert worker is workers["w0"] and plan.live == [jobs[1], jobs[2], jobs[4]]


def test_a_queue_head_placed_on_a_busy_worker_does_not_idle_the_other():
    workers, recent = pool(2), RecentHolders()
    a, b = prefix_key([1]), prefix_key([2])
    recent.record(a, "w1", 0.0)
    recent.record(b, "w0", 0.0)
    workers["w1"].in_flight.append("batch")
    workers["w1"].remaining_ms = 50.0  # busy past max_batch_wait_ms: its batch is held, in time (10 s deadline)
    jobs = [RoutedJob(a, 1.0), RoutedJob(b, 2.0)]
    worker, plan = routed(queue_of(jobs), workers, recent)
    assert worker is workers["w0"] and plan.live == [jobs[1]]
    # with only w1's job queued: a Hold for w1, nothing for the idle w0
    assert isinstance(routed(queue_of([jobs[0]]), workers, recent), Hold)


def test_a_job_whose_home_would_finish_late_goes_to_the_worker_in_time():
    workers, recent = pool(2), RecentHolders()
    a = prefix_key([1])
    recent.record(a, "w1", 0.0)
    workers["w1"].in_flight.append("batch")
    workers["w1"].remaining_ms = 50.0
    job = RoutedJob(a, deadline=0.030)  # 30 ms: w1 finishes at 55 ms, w0 at 5 ms
    worker, plan = routed(queue_of([job]), workers, recent)
    assert worker is workers["w0"] and plan.live == [job]
    assert recent.get(a, 0.0) == "w0"  # the context now follows its new holder
