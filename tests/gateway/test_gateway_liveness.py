"""Worker liveness through the real gateway and real ZeroMQ (gateway/liveness.py).

A worker is lost when its connection closes or its ZMTP heartbeats go unanswered (a frozen process),
stalled when a batch runs far past its prediction; a busy worker (a long batch, no application
heartbeat) and a busy gateway (its Python held for seconds) are never declared lost. A link whose
reader stops gets a new socket and the worker back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from gateway.worker_link import READY, STALLED
from tests.gateway.conftest import endpoint, start_stack, wait_ready
from loadgen.standin_worker import StandInWorker
from tests.gateway.test_gateway_rejections import assert_error
from tests.gateway.waiting import until

ROOT = Path(__file__).resolve().parents[2]
BODY = {"samples": ["x"], "labels": ["yes"], "deadline_ms": 10_000}


def lower_stall_floor(stack, floor_s: float) -> None:
    """Only the multiple of the prediction is left to protect a batch (the floor is 10 s)."""
    pool = stack.gateway.pool
    pool.liveness = dataclasses.replace(pool.liveness, stall_floor_s=floor_s)


async def test_a_worker_whose_connection_closes_fails_its_batch_at_once(request_tokenizer):
    gate = threading.Event()
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=gate).start()
    stack = await start_stack(request_tokenizer, [worker])
    try:
        asked = asyncio.create_task(stack.post("/v1/score", BODY))
        await until(lambda: worker.requests, what="the worker holding the batch")
        worker.stop()  # its socket closes: the gateway's connection sees it at once
        status, body, _ = await asked
        assert_error(status, body, 503, "worker_lost", "connection closed")
        assert stack.gateway.pool.ready_count() == 0
    finally:
        await stack.client.close()


async def test_a_frozen_worker_process_is_lost_then_rejoins_when_resumed(request_tokenizer, tmp_path):
    """SIGSTOP freezes the process and its libzmq threads: its ZMTP heartbeats go unanswered."""
    address = f"ipc://{tmp_path}/frozen"
    process = subprocess.Popen([sys.executable, "-m", "loadgen.standin_worker", "--endpoint", address,
                                "--vocab-size", str(request_tokenizer.vocab_size), "--delay-ms", "500"], cwd=ROOT)
    stack = await start_stack(request_tokenizer, [StandInWorker(address)], wait=False, worker_timeout_ms=400)
    try:
        await wait_ready(stack, 1, timeout_s=30)
        link = stack.gateway.pool.links[0]
        asked = asyncio.create_task(stack.post("/v1/score", BODY))
        await until(lambda: link.in_flight, what="a batch in flight")
        pool = stack.gateway.pool
        pool.liveness = dataclasses.replace(pool.liveness, stuck_restart_s=0.5)  # a supervisor's patience (5 s)
        process.send_signal(signal.SIGSTOP)
        status, body, _ = await asked  # deadline 10 s: only the lost connection can answer this
        assert_error(status, body, 503, "worker_lost", "heartbeats went unanswered")
        await until(lambda: pool.stuck_pid(address) == process.pid, what="the frozen worker reported stuck")
        process.send_signal(signal.SIGCONT)
        await wait_ready(stack, 1, timeout_s=30)
        assert pool.stuck_pid(address) is None
        status, body, _ = await stack.post("/v1/score", BODY)
        assert status == 200, body
    finally:
        await stack.client.close()
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait()


async def test_a_stalled_worker_is_taken_out_then_rejoins_once_idle(request_tokenizer):
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size).start()
    stack = await start_stack(request_tokenizer, [worker])
    try:
        lower_stall_floor(stack, 0.3)
        worker.silent = True  # hung inside a call: libzmq still answers PINGs, nothing else comes back
        status, body, _ = await stack.post("/v1/score", BODY)
        assert_error(status, body, 503, "worker_lost", "no answer to a batch")
        assert stack.gateway.pool.links[0].state == STALLED
        worker.silent = False  # its heartbeat shows it idle again: Hello, Ready, back in service
        await wait_ready(stack)
        status, body, _ = await stack.post("/v1/score", BODY)
        assert status == 200, body
    finally:
        await stack.client.close()
        worker.stop()


async def test_a_cpu_batch_ten_times_longer_than_predicted_is_answered_not_lost(request_tokenizer, tmp_path):
    """A worker process computes a batch for 2 s, spinning with its GIL held (no heartbeat leaves it,
    as with a compiled call on a CPU), while its profile predicts 200 ms; worker_timeout_ms is 200 and
    the 10 s floor is lowered, so only libzmq's heartbeats and the 20x multiple stand between it and
    being declared lost."""
    address = f"ipc://{tmp_path}/busy"
    process = subprocess.Popen([sys.executable, "-m", "loadgen.standin_worker", "--endpoint", address,
                                "--vocab-size", str(request_tokenizer.vocab_size), "--delay-ms", "2000", "--spin",
                                "--predicted-ms", "200"], cwd=ROOT)
    stack = await start_stack(request_tokenizer, [StandInWorker(address)], wait=False, worker_timeout_ms=200)
    try:
        await wait_ready(stack, 1, timeout_s=30)
        lower_stall_floor(stack, 0.5)
        status, body, _ = await stack.post("/v1/score", BODY)
        assert status == 200, body
        assert stack.gateway.pool.links[0].state == READY
    finally:
        await stack.client.close()
        process.kill()
        process.wait()


async def test_a_gateway_whose_python_is_held_for_seconds_keeps_its_workers(request_tokenizer):
    """The event loop holds the GIL for 6x worker_timeout_ms: the stand-in's Python cannot run either,
    but both sides' libzmq threads keep exchanging heartbeats, so nobody is declared lost."""
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size).start()
    stack = await start_stack(request_tokenizer, [worker], worker_timeout_ms=200)
    try:
        switch = sys.getswitchinterval()
        sys.setswitchinterval(30.0)  # no other Python thread gets the GIL while we spin
        try:
            end = time.monotonic() + 1.2
            while time.monotonic() < end:
                pass
        finally:
            sys.setswitchinterval(switch)
        status, body, _ = await stack.post("/v1/score", BODY)
        assert status == 200, body
        assert stack.gateway.pool.links[0].state == READY
    finally:
        await stack.client.close()
        worker.stop()


async def test_a_link_whose_reader_stops_fails_its_batch_says_why_and_reconnects(request_tokenizer, caplog):
    gate = threading.Event()
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=gate).start()
    stack = await start_stack(request_tokenizer, [worker])
    try:
        link = stack.gateway.pool.links[0]
        asked = asyncio.create_task(stack.post("/v1/score", BODY))
        await until(lambda: worker.requests, what="the worker holding the batch")
        with caplog.at_level(logging.ERROR, logger="gateway.pool"):
            link._socket.close(linger=0)  # the reader's socket fails under it
            status, body, _ = await asked
        assert_error(status, body, 503, "worker_lost", "link to it stopped")
        assert any("reconnecting with a new socket" in r.getMessage() for r in caplog.records)
        gate.set()
        await wait_ready(stack)
        status, body, _ = await stack.post("/v1/score", BODY)
        assert status == 200, body
    finally:
        await stack.client.close()
        worker.stop()
