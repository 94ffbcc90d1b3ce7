"""Cache-aware routing, the cost model of cache hits and the prefix-cache metrics, through the real
HTTP stack and real ZeroMQ to two stand-in workers that model a prefix cache (loadgen/prefix_model.py).

Nothing is ordered by sleeping: answers are held by a gate until the test releases them, and state
changes (a heartbeat's report) are waited for."""

from __future__ import annotations

import asyncio
import contextlib
import threading

from loadgen.prefix_model import PrefixCacheModel
from loadgen.standin_worker import StandInWorker
from shared.latency_model import LatencyModel
from shared.policy.routing import Ring
from shared.prefix import prefix_key
from tests.gateway.conftest import endpoint, start_stack
from tests.gateway.metrics_page import sample, scrape
from tests.gateway.test_gateway_shared_prefix import ids_body, until, want_logits, wire_samples

import numpy as np


CONTEXTS = 12  # the ring spreads them over both workers (all on one: a chance of 2^-11 per run)


def context(c: int) -> list[int]:
    """Context c's 40 shared tokens (distinct per context)."""
    return [100 + c] + list(range(200 + 40 * c, 239 + 40 * c))


def request(c: int, page: int = 0) -> list[list[int]]:
    """Page `page` of 3 items over context c: the items' first tokens differ, so the shared prefix is
    the context's 40 tokens exactly (its key is the same on every page)."""
    return [context(c) + [10 + 3 * page + i, 20 + i, 30 + i] for i in range(3)]


@contextlib.asynccontextmanager
async def two_workers(request_tokenizer, gated=False, per_batch_ms=None, **gateway):
    """A gateway in front of two stand-ins with a modelled prefix cache of 10,000 tokens each."""
    gates = [threading.Event() if gated else None for _ in range(2)]
    latency = {"latency": LatencyModel(0.0, 0.0, 0.0, per_batch_ms)} if per_batch_ms is not None else {}
    workers = [StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=gate, heartbeat_ms=20,
                             prefix_cache=PrefixCacheModel(10_000, bytes_per_token=64), **latency).start()
               for gate in gates]
    stack = await start_stack(request_tokenizer, workers, **gateway)
    try:
        yield stack, workers, gates
    finally:
        for gate in gates:
            if gate is not None:
                gate.set()
        await stack.client.close()
        for worker in workers:
            worker.stop()


def served_by(workers: list[StandInWorker], c: int) -> dict[int, int]:
    """Which worker (index) got each page of context c so far: {page: worker}."""
    return {(wire_samples(r)[0][40] - 10) // 3: i for i, w in enumerate(workers) for r in w.requests
            if wire_samples(r)[0][:40] == context(c)}


async def test_a_context_goes_back_to_its_worker_and_hits_its_cache(request_tokenizer):
    async with two_workers(request_tokenizer) as (stack, workers, _):
        for page in range(4):
            for c in range(CONTEXTS):
                status, answer, _ = await stack.post("/v1/score", ids_body(request(c, page)))
                assert status == 200, answer
                np.testing.assert_allclose(answer["scores"], want_logits(request(c, page)), rtol=1e-6)
        homes = {c: set(served_by(workers, c).values()) for c in range(CONTEXTS)}
        assert all(len(home) == 1 for home in homes.values()), homes  # every page of a context on one worker
        assert {next(iter(h)) for h in homes.values()} == {0, 1}  # and the contexts spread over both
        # first sighting, second (inserted), then two hits per context
        assert sum(w.prefix_cache.hits for w in workers) == CONTEXTS * 2
        assert sum(w.prefix_cache.insertions for w in workers) == CONTEXTS


async def test_a_hit_is_reported_as_cached_tokens(request_tokenizer):
    async with two_workers(request_tokenizer) as (stack, workers, _):
        answers = [(await stack.post("/v1/score", ids_body(request(0, page))))[1] for page in range(3)]
    prompt = [a["usage"]["prompt_tokens"] for a in answers]
    cached = [a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers]
    assert prompt == [3 * 43] * 3
    # the prefix's two repeats within a request, then also its first copy once the cache holds it
    assert cached == [2 * 40, 2 * 40, 3 * 40]


async def test_admission_and_batching_size_a_job_by_what_its_worker_holds(request_tokenizer):
    async with two_workers(request_tokenizer, gated=True) as (stack, workers, gates):
        for page in range(2):  # seen twice: the worker inserts the context
            for gate in gates:
                gate.set()
            assert (await stack.post("/v1/score", ids_body(request(0, page))))[0] == 200
        home = served_by(workers, 0)[0]
        link = next(link for link in stack.gateway.pool.links if link.endpoint == workers[home].endpoint)
        await until(lambda: (prefix_key(context(0)), 40) in link.prefix_cache.held)
        pool = stack.gateway.pool
        assert pool.expected_reuse(prefix_key(context(0))).reused(context(0), True) == 40
        for gate in gates:
            gate.clear()
        pending = asyncio.ensure_future(stack.post("/v1/score", ids_body(request(0, 2))))
        await until(lambda: link.in_flight)
        batch = next(iter(link.in_flight.values()))
        job = next(iter(batch.jobs.values()))
        assert job.work.computed_tokens == 3 * 3  # the suffixes only: the held context is not computed
        assert batch.items * batch.tokens_per_item == 3 * 3
        for gate in gates:
            gate.set()
        status, answer, _ = await pending
        assert status == 200 and answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 3 * 40


async def test_a_holder_that_would_finish_late_loses_the_context_to_another_worker(request_tokenizer):
    # every batch is predicted to take 2 s; answers are held, so the holder stays busy
    async with two_workers(request_tokenizer, gated=True, per_batch_ms=2000.0, max_batch_wait_ms=10_000,
                           max_inflight_batches_per_worker=4) as (stack, workers, gates):
        first = asyncio.ensure_future(stack.post("/v1/score", ids_body(request(0, 0))))
        await until(lambda: 0 in served_by(workers, 0))
        holder = served_by(workers, 0)[0]
        # a loose deadline: the context waits for its busy holder although the other worker is idle
        loose = asyncio.ensure_future(stack.post("/v1/score", ids_body(request(0, 1), deadline_ms=30_000)))
        await until(lambda: 1 in served_by(workers, 0))
        assert served_by(workers, 0)[1] == holder
        # 3 s: behind the holder's 4 s of predicted work it would be late; the idle worker is in time
        tight = asyncio.ensure_future(stack.post("/v1/score", ids_body(request(0, 2), deadline_ms=3_000)))
        await until(lambda: 2 in served_by(workers, 0))
        assert served_by(workers, 0)[2] == 1 - holder
        for gate in gates:
            gate.set()
        assert [(await f)[0] for f in (first, loose)] == [200, 200]
        assert (await tight)[0] in (200, 504)  # 504 only if this machine stalled past its 3 s


async def test_metrics_export_each_workers_prefix_cache(request_tokenizer):
    async with two_workers(request_tokenizer) as (stack, workers, _):
        for page in range(3):
            assert (await stack.post("/v1/score", ids_body(request(0, page))))[0] == 200
        home = workers[served_by(workers, 0)[0]]
        link = next(link for link in stack.gateway.pool.links if link.endpoint == home.endpoint)
        await until(lambda: link.prefix_cache.hits == 1)
        page = await scrape(stack)
    labels = {"worker": home.endpoint}
    assert sample(page, "boundserve_prefix_cache_hits_total", **labels) == 1
    assert sample(page, "boundserve_prefix_cache_misses_total", **labels) == 2
    assert sample(page, "boundserve_prefix_cache_insertions_total", **labels) == 1
    assert sample(page, "boundserve_prefix_cache_evictions_total", **labels) == 0
    assert sample(page, "boundserve_prefix_cache_hit_tokens_total", **labels) == 40
    assert sample(page, "boundserve_prefix_cache_bytes", **labels) == 40 * 64
    assert sample(page, "boundserve_prefix_cache_budget_bytes", **labels) == 10_000 * 64
    other = next(w for w in workers if w is not home)
    assert sample(page, "boundserve_prefix_cache_hits_total", worker=other.endpoint) == 0


async def test_a_full_holder_in_time_keeps_its_context_while_the_other_worker_serves_its_own(request_tokenizer):
    async with two_workers(request_tokenizer, gated=True, max_inflight_batches_per_worker=1) as (
            stack, workers, gates):
        first = asyncio.ensure_future(stack.post("/v1/score", ids_body(request(0, 0))))
        await until(lambda: 0 in served_by(workers, 0))
        holder = served_by(workers, 0)[0]  # its one slot is taken until its gate opens
        again = asyncio.ensure_future(stack.post("/v1/score", ids_body(request(0, 1))))
        await until(lambda: stack.gateway.batchers["score"].queued_jobs == 1)
        endpoints = tuple(sorted(w.endpoint for w in workers))
        other = next(c for c in range(1, 64)
                     if Ring.of(endpoints).owners(prefix_key(context(c)))[0] == workers[1 - holder].endpoint)
        elsewhere = asyncio.ensure_future(stack.post("/v1/score", ids_body(request(other, 0))))
        await until(lambda: 0 in served_by(workers, other))  # the batcher has looked at the queue since
        assert served_by(workers, other)[0] == 1 - holder
        assert 1 not in served_by(workers, 0)  # the context waits for its holder, in time there
        gates[holder].set()
        await until(lambda: 1 in served_by(workers, 0))
        assert served_by(workers, 0)[1] == holder
        for gate in gates:
            gate.set()
        assert [(await f)[0] for f in (first, again, elsewhere)] == [200, 200, 200]
