"""The live gateway and the simulator drive one scheduler object, so they make the same decisions.

One arrival sequence with recorded service times goes through the live gateway (real HTTP, real
ZeroMQ, the stand-in worker in manual mode: each batch answered when the test says, with the
service time it says) on virtual time (the `looptime` plugin: the loop's clock moves only when
nothing is left to run, straight to the next timer), and through the simulator (an event heap on a
fake clock). Both keep a DecisionLog: every admit, refusal, drop with its reason and batch with its
requests, at the microsecond it was made. The logs must be identical.

How jitter is kept out without a single sleep: whenever something is in transit over a real socket
(a request on its way in, a batch on its way to the stand-in, an answer on its way back), the test
keeps a task ready to run (`frozen`) until it has arrived, so the virtual clock cannot move; it
moves only when every part of the system waits for a timer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random

import pytest

from loadgen.service import ServiceModel
from loadgen.sim_world import Jitter, Speed
from loadgen.simulator import SimSettings, Simulator
from loadgen.standin_worker import BOUNDS, StandInWorker
from loadgen.trace import TraceRecord, make_trace
from shared.latency_model import LatencyModel
from shared.policy.scheduler import DecisionLog
from tests.gateway.conftest import deployment, endpoint, start_stack

MODEL = LatencyModel(0.0004, 0.0, 0.08, 1.5)
"""What the stand-in announces and (times each batch's recorded factor) takes: ~3 ms a full batch."""
FACTORS = (1.0, 1.37, 0.91, 1.22, 0.83, 1.61, 1.05, 0.97, 1.48, 0.88)
"""The recorded service time of the k-th batch over the model's prediction (cycled)."""
SLOW_SPELLS = (1.0, 2.6, 0.9, 3.1, 0.8, 1.2)
"""Batches that take up to three times their prediction: work queued behind them expires."""
CLOCK_TICKS_US = 10
"""The virtual loop's clock counts whole microseconds: a timer for t fires at t rounded up to one, so
a time derived from an earlier one (a release from a send, a hold's end from a release) may be a tick
later live than in the simulator, and a chain of them a few ticks. The decisions must be identical."""
GATEWAY = dict(worker_timeout_ms=1000, max_inflight_batches_per_worker=2)


def arrivals(count: int = 48, seed: int = 7) -> list[TraceRecord]:
    """A mild overload: about one request a ms, 2-8 samples of 10-40 tokens, deadlines of 6-40 ms."""
    draw = random.Random(seed)
    t_ms, records = 0.0, []
    for _ in range(count):
        t_ms += round(draw.uniform(0.3, 1.5), 3)  # whole microseconds: no arrival on another's deadline
        lengths = tuple(draw.randint(10, 40) for _ in range(draw.randint(2, 8)))
        records.append(TraceRecord(t_ms=t_ms, route="score", sample_tokens=lengths,
                                   deadline_ms=draw.choice((6.0, 12.0, 40.0))))
    return records


def body(record: TraceRecord, index: int) -> dict:
    """Token ids that share no prefix (each sample starts with its own id): the work the record says."""
    samples = [{"input_ids": [100 + 16 * (index % 50) + k] + [7] * (n - 1)} for k, n in enumerate(record.sample_tokens)]
    return {"samples": samples, "label_token_ids": [5], "deadline_ms": int(record.deadline_ms)}


def simulated(records: list[TraceRecord], gateway: dict, factors: tuple[float, ...]) -> list[tuple]:
    config = deployment(["w0"], **gateway)
    settings = dataclasses.replace(SimSettings.from_config(config), bounds=BOUNDS)
    service = ServiceModel({"score": MODEL})
    log = DecisionLog()
    Simulator(settings, service, speeds=[Speed(0.0, service, Jitter(factors, 0, in_order=True))], log=log).run(
        make_trace(records))
    return log.entries


class Live:
    """Drives the live gateway on virtual time: fires each arrival at its time, plays the worker."""

    def __init__(self, stack, worker: StandInWorker, start_s: float, factors: tuple[float, ...] = FACTORS) -> None:
        self.stack, self.worker, self.start_s, self.factors = stack, worker, start_s, factors
        self.loop = asyncio.get_running_loop()
        self.link = stack.gateway.pool.links[0]
        self.free_at = 0.0
        self.batches = 0
        self.pending: set[asyncio.Task] = set()
        self.answers: list[asyncio.Task] = []

    async def frozen(self, arrived) -> None:
        """Keep the loop busy (its clock still) until `arrived()`: something is on a real socket."""
        while not arrived():
            await asyncio.sleep(0)

    def spawn(self, coroutine) -> None:
        task = self.loop.create_task(coroutine)
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    def on_batch(self) -> None:
        """Called inside the scheduler's step, before the send: the clock stays until the stand-in has it."""
        self.spawn(self._received(self.batches))
        self.batches += 1

    async def _received(self, k: int) -> None:
        await self.frozen(lambda: len(self.worker.received) > k)
        batch_id = self.worker.received[k].batch_id
        sent = self.link.in_flight[batch_id]
        start = max(sent.sent_at, self.free_at)
        live = [job for job in sent.jobs.values() if job.deadline > start]
        items = sum(job.batch_items for job in live)
        compute_ms = MODEL.predict_ms(items, sum(job.latency_tokens for job in live) / items) if live else 0.0
        compute_ms *= self.factors[k % len(self.factors)]
        self.free_at = start + compute_ms / 1000.0
        expired = frozenset(job.request_id for job in sent.jobs.values() if job not in live)
        self.loop.call_at(self.free_at, self._release, k, batch_id, compute_ms, (start - sent.sent_at) * 1000.0,
                          expired)

    def _release(self, k: int, batch_id: int, compute_ms: float, queue_ms: float, expired: frozenset[str]) -> None:
        self.worker.release(k, compute_ms, queue_ms, expired)
        self.spawn(self.frozen(lambda: batch_id not in self.link.in_flight))

    async def run(self, records: list[TraceRecord], log: DecisionLog) -> None:
        for index, record in enumerate(records):
            await self.at(self.start_s + record.t_ms / 1000.0)
            key = str(index)
            post = self.loop.create_task(self.stack.post("/v1/score", body(record, index), headers={"X-Request-Id": key}))
            self.answers.append(post)
            await self.frozen(lambda: post.done() or any(e[0] in ("admit", "refuse") and e[2] == key
                                                         for e in log.entries))
            assert not post.done() or post.result()[0] >= 429, post.result()  # a bad body never reached the scheduler
        while self.pending:
            await asyncio.gather(*list(self.pending))
        await asyncio.gather(*self.answers)

    async def at(self, when_s: float) -> None:
        arrived = self.loop.create_future()
        self.loop.call_at(when_s, arrived.set_result, None)
        await arrived


class WatchedLog(DecisionLog):
    """A decision log that tells the live driver when a batch is formed."""

    def __init__(self) -> None:
        super().__init__()
        self.on_batch = lambda: None

    def add(self, kind: str, now_s: float, *what) -> None:
        super().add(kind, now_s, *what)
        if kind == "batch":
            self.on_batch()


def canonical(entries: list[tuple], start_us: int = 0, workers: dict[str, str] | None = None) -> list[tuple]:
    """Entries relative to the run's start, sorted within each microsecond (answers to requests of
    one instant may end in another order on two shells), workers named as the simulator names them."""
    out = []
    for kind, t_us, *what in entries:
        if kind == "batch":
            what = [(workers or {}).get(what[0], what[0]), tuple(sorted(what[1]))]
        out.append((t_us - start_us, kind, *map(str, what)))
    return sorted(out)


CASES = {
    # the product: admits, refusals, predicted-late drops, batches
    "product": ({}, FACTORS, {"admit", "refuse", "batch", "predicted_late"}),
    # no early refusal, no predicted-late drops, slow spells: work expires in the queue and in the worker
    "no_predictions": (dict(admission=False, drop_predicted_late=False), SLOW_SPELLS,
                       {"admit", "batch", "expired_in_queue", "expired_in_worker"}),
}


@pytest.mark.looptime
@pytest.mark.parametrize("case", sorted(CASES))
async def test_the_live_gateway_and_the_simulator_log_identical_decisions(request_tokenizer, case):
    settings, factors, exercised = CASES[case]
    gateway = {**GATEWAY, **settings}
    records = arrivals()
    expected = canonical(simulated(records, gateway, factors))
    kinds = {entry[1] for entry in expected} | {entry[3] for entry in expected if entry[1] in ("drop", "refuse")}
    assert exercised <= kinds, f"the sequence exercises too little: {kinds}"

    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, latency=MODEL, manual=True).start()
    stack = await start_stack(request_tokenizer, [worker], wait=False, **gateway)
    try:
        loop = asyncio.get_running_loop()
        await Live(stack, worker, 0.0).frozen(lambda: stack.gateway.pool.ready_count() == 1)
        log = WatchedLog()
        for batcher in stack.gateway.batchers.values():
            batcher.scheduler.log = log
        start_s = float(int(loop.time()) + 1)  # a whole second: the simulator's times plus it, exactly
        live = Live(stack, worker, start_s, factors)
        log.on_batch = live.on_batch
        await live.run(records, log)
        got = canonical(log.entries, round(start_s * 1e6), {worker.endpoint: "0"})
        assert [entry[1:] for entry in got] == [entry[1:] for entry in expected]
        assert all(abs(a[0] - b[0]) <= CLOCK_TICKS_US for a, b in zip(got, expected)), [
            (a, b) for a, b in zip(got, expected) if abs(a[0] - b[0]) > CLOCK_TICKS_US]
    finally:
        await stack.client.close()
        worker.stop()
