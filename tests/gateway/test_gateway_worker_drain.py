"""A draining worker (protocol 10's drain handshake) against the real gateway over real ZeroMQ: the
gateway routes around it at once, answers its Goodbye so it can exit, and queues again the requests
of a batch it refused `draining` (never computed) for another worker: nothing is lost."""

from __future__ import annotations

import asyncio
import threading

from gateway.worker_link import DRAINING, READY
from loadgen.standin_worker import StandInWorker
from tests.gateway.waiting import until
from tests.gateway.conftest import endpoint, start_stack, wait_ready

BODY = {"samples": ["red running shoe", "blue phone case"], "labels": ["yes", "no"]}
WAIT_S = 10.0
NEVER_MS = 600_000.0  # a drain ack timeout no test outlives: a stand-in that returns was answered Goodbye


def link_state(stack, worker: StandInWorker) -> str:
    return next(link.state for link in stack.gateway.pool.links if link.endpoint == worker.endpoint)


PATIENT = {"worker_timeout_ms": 30_000}
"""Liveness far beyond these tests (ZMTP heartbeats time out after it): a loaded machine must not make a
held worker look lost; what is tested is the drain, not the liveness."""

async def test_a_draining_worker_is_routed_around_at_once_finishes_what_it_holds_and_is_let_go(request_tokenizer):
    gate = threading.Event()
    leaving = StandInWorker(endpoint(), request_tokenizer.vocab_size, gate=gate, drain_ack_timeout_ms=NEVER_MS).start()
    staying = StandInWorker(endpoint(), request_tokenizer.vocab_size)
    stack = await start_stack(request_tokenizer, [leaving, staying], wait=False, **PATIENT)
    try:
        await wait_ready(stack, 1)
        held = asyncio.create_task(stack.post("/v1/score", BODY))  # the only ready worker: the gate holds it
        await until(lambda: leaving.seen_request_ids, WAIT_S, "the held request reaching the leaving worker")
        staying.start()
        await wait_ready(stack, 2)
        leaving.drain()
        await until(lambda: link_state(stack, leaving) == DRAINING, WAIT_S, "the gateway seeing the drain")
        assert link_state(stack, staying) == READY
        status, body, _ = await stack.post("/v1/score", BODY)  # served elsewhere while the held one waits
        assert status == 200, body
        assert len(leaving.seen_request_ids) == 1 and staying.seen_request_ids
        gate.set()
        # The loop is held (a blocking join) until the stand-in has sent its answer and closed its
        # socket, so the answer and the connection's close reach the gateway together: the answer must
        # be read first. The stand-in returns only once the gateway said Goodbye (its ack timeout is
        # far beyond this test).
        assert leaving.join(WAIT_S)
        status, body, _ = await held
        assert status == 200, body
    finally:
        await stack.client.close()
        for worker in (leaving, staying):
            worker.stop()


async def test_a_batch_refused_draining_is_queued_again_and_answered_by_another_worker(request_tokenizer):
    refusing = StandInWorker(endpoint(), request_tokenizer.vocab_size, refuse="draining").start()
    serving = StandInWorker(endpoint(), request_tokenizer.vocab_size)
    stack = await start_stack(request_tokenizer, [refusing, serving], wait=False, **PATIENT)
    try:
        await wait_ready(stack, 1)
        first = asyncio.create_task(stack.post("/v1/score", BODY))  # only the refusing worker is ready
        await until(lambda: link_state(stack, refusing) == DRAINING, WAIT_S, "the refusal reaching the gateway")
        assert not first.done()  # queued again, not failed
        serving.start()
        status, body, _ = await first
        assert status == 200, body
        assert len(body["scores"]) == 2
        assert refusing.seen_request_ids == [] and serving.seen_request_ids  # refused uncomputed, then served
        answers = await asyncio.gather(*(stack.post("/v1/score", BODY) for _ in range(5)))
        assert [status for status, _, _ in answers] == [200] * 5
        assert refusing.seen_request_ids == []  # routed around from the refusal on
    finally:
        await stack.client.close()
        for worker in (refusing, serving):
            worker.stop()
