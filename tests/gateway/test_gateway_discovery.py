"""Worker discovery by DNS (`[worker] discovery = "dns"`) against a real DNS server on loopback.

The server (dnslib, over UDP) answers the service name with records a test changes as it goes;
the workers are stand-ins speaking the real protocol on 127.0.0.x addresses, one port for all (as pods
behind a headless Service). Under a steady stream of requests, workers join (their records appear)
and leave (their records go); every request is answered 200: a worker whose record went is routed
nothing more, its batches in flight are answered, then its link is closed. A lookup that fails keeps
the workers known; a lost worker makes the gateway look again at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import threading

import pytest
from aiohttp.test_utils import TestClient, TestServer
from dnslib import AAAA, QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer

from gateway.app import GATEWAY, make_app
from gateway.discovery import endpoint_of
from gateway.wiring import Settings
from loadgen.standin_worker import StandInWorker, standin_manifest
from shared.config import DeploymentConfig, GatewayConfig, WorkerConfig
from tests.gateway.waiting import until
from tests.gateway.conftest import GENEROUS_DEADLINES

SERVICE = "workers.boundserve.test"
BODY = {"samples": ["red running shoe", "blue phone case"], "labels": ["yes", "no"]}
WAIT_S = 15.0
HOURLY_MS = 3_600_000  # a resolve interval no test outlives: a lookup seen was asked for


class Records(BaseResolver):
    """The DNS server's zone: SERVICE -> the addresses set now; `failing` answers SERVFAIL."""

    def __init__(self) -> None:
        self.addresses: list[str] = []
        self.failing = False
        self.queries = 0
        self._lock = threading.Lock()

    def set(self, *addresses: str) -> None:
        with self._lock:
            self.addresses = list(addresses)

    def resolve(self, request, handler):
        reply = request.reply()
        with self._lock:
            self.queries += 1
            if self.failing:
                reply.header.rcode = RCODE.SERVFAIL
                return reply
            if str(request.q.qname).rstrip(".") != SERVICE:
                reply.header.rcode = RCODE.NXDOMAIN
                return reply
            for address in self.addresses:
                if request.q.qtype == QTYPE.A and ":" not in address:
                    reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(address), ttl=0))
                elif request.q.qtype == QTYPE.AAAA and ":" in address:
                    reply.add_answer(RR(request.q.qname, QTYPE.AAAA, rdata=AAAA(address), ttl=0))
        return reply


@pytest.fixture
def dns_server():
    records = Records()
    server = DNSServer(records, port=0, address="127.0.0.1", logger=DNSLogger(logf=lambda line: None))
    server.start_thread()
    yield records, server.server.server_address[1]
    server.stop()


def shared_port(addresses: list[str]) -> int:
    """A port free on every one of `addresses` (the workers' pods all listen on the same one)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((addresses[0], 0))
            port = probe.getsockname()[1]
        try:
            with contextlib.ExitStack() as stack:
                for address in addresses[1:]:
                    sock = stack.enter_context(socket.socket())
                    sock.bind((address, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on every loopback address")


class Fleet:
    """Stand-in workers on 127.0.0.2, .3, ... at one port."""

    def __init__(self, vocab_size: int, count: int) -> None:
        self.addresses = [f"127.0.0.{2 + i}" for i in range(count)]
        self.port = shared_port(self.addresses)
        self.vocab_size = vocab_size
        self.running: list[StandInWorker] = []

    def worker(self, i: int, **options) -> StandInWorker:
        worker = StandInWorker(endpoint_of(self.addresses[i], self.port), self.vocab_size, **options).start()
        self.running.append(worker)
        return worker

    def stop(self) -> None:
        for worker in self.running:
            worker.stop()


async def start_gateway(request_tokenizer, fleet: Fleet, dns_port: int, interval_ms: int) -> TestClient:
    worker = WorkerConfig(discovery="dns", service=SERVICE, service_port=fleet.port, resolve_interval_ms=interval_ms,
                          nameservers=(f"127.0.0.1:{dns_port}",), heartbeat_interval_ms=50)
    config = DeploymentConfig(worker=worker, gateway=dataclasses.replace(GatewayConfig(), access_log=False,
                                                                        **GENEROUS_DEADLINES))
    app = make_app(Settings(config, standin_manifest(request_tokenizer.vocab_size), request_tokenizer))
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


def ready(pool) -> set[str]:
    return {endpoint for endpoint in pool.serving("score")}


class Stream:
    """Open-loop requests, one every `gap_s` whatever came back before, until stopped; every answer kept."""

    def __init__(self, client: TestClient, gap_s: float = 0.01) -> None:
        self.client, self.gap_s, self.answers, self.running = client, gap_s, [], True
        self.sent: list[asyncio.Task] = []
        self.task = asyncio.create_task(self._send())

    async def _send(self) -> None:
        while self.running:
            self.sent.append(asyncio.create_task(self._one()))
            await asyncio.sleep(self.gap_s)

    async def _one(self) -> None:
        response = await self.client.post("/v1/score", json=BODY)
        self.answers.append((response.status, await response.json()))

    async def stop(self) -> list:
        self.running = False
        await self.task
        await asyncio.gather(*self.sent)
        return self.answers


async def test_workers_join_and_leave_by_dns_under_load_and_nothing_is_unanswered(request_tokenizer, dns_server):
    records, dns_port = dns_server
    fleet = Fleet(request_tokenizer.vocab_size, 3)
    gate = threading.Event()
    first = fleet.worker(0, gate=gate)  # holds its answers until the gate opens
    records.set(fleet.addresses[0])
    client = await start_gateway(request_tokenizer, fleet, dns_port, interval_ms=100)
    pool = client.app[GATEWAY].pool
    stream = None
    try:
        await until(lambda: ready(pool) == {first.endpoint}, WAIT_S, "the first worker found")
        stream = Stream(client)
        await until(lambda: first.seen_request_ids, WAIT_S, "requests held on the first worker")
        # The joining workers hold their answers too until both have been routed work: an idle stand-in
        # answers at once, so with free ones the least-busy rule could keep choosing the same worker.
        joined = threading.Event()
        joining = [fleet.worker(1, gate=joined), fleet.worker(2, gate=joined)]
        records.set(*fleet.addresses)
        await until(lambda: ready(pool) == {w.endpoint for w in [first, *joining]}, WAIT_S, "two workers joining")
        await until(lambda: all(w.seen_request_ids for w in joining), WAIT_S, "the new workers serving")
        joined.set()
        records.set(*fleet.addresses[1:])  # the first one leaves while it holds batches
        await until(lambda: first.endpoint not in ready(pool), WAIT_S, "the first worker retired")
        held = len(first.seen_request_ids)
        link = next(link for link in pool.links if link.endpoint == first.endpoint)
        assert link.in_flight, "the retired worker should still hold the batches it was sent"
        answered = len(stream.answers)
        await until(lambda: len(stream.answers) >= answered + 20, WAIT_S, "requests served by the remaining workers")
        assert len(first.seen_request_ids) == held  # routed nothing more
        gate.set()
        await until(lambda: all(l.endpoint != first.endpoint for l in pool.links), WAIT_S, "the retired link closed")
        answers = await stream.stop()
        stream = None
        assert answers and all(status == 200 for status, _ in answers), [a for a in answers if a[0] != 200][:3]
        assert all(len(body["scores"]) == 2 for _, body in answers)
    finally:
        if stream is not None:
            await stream.stop()
        await client.close()
        fleet.stop()


async def test_a_failed_lookup_keeps_the_workers_known(request_tokenizer, dns_server):
    records, dns_port = dns_server
    fleet = Fleet(request_tokenizer.vocab_size, 1)
    worker = fleet.worker(0)
    records.set(fleet.addresses[0])
    client = await start_gateway(request_tokenizer, fleet, dns_port, interval_ms=100)
    pool = client.app[GATEWAY].pool
    try:
        await until(lambda: ready(pool) == {worker.endpoint}, WAIT_S, "the worker found")
        records.failing = True
        asked = records.queries
        await until(lambda: records.queries >= asked + 4, WAIT_S, "lookups answered SERVFAIL")
        assert ready(pool) == {worker.endpoint}
        status, _ = await post(client)
        assert status == 200
        records.failing, records.addresses = False, []  # an answer without it: it leaves
        await until(lambda: not pool.links, WAIT_S, "the worker retired once the name has no address")
    finally:
        await client.close()
        fleet.stop()


async def test_a_lost_worker_makes_the_gateway_look_again_at_once(request_tokenizer, dns_server):
    records, dns_port = dns_server
    fleet = Fleet(request_tokenizer.vocab_size, 2)
    old = fleet.worker(0)
    records.set(fleet.addresses[0])
    client = await start_gateway(request_tokenizer, fleet, dns_port, interval_ms=HOURLY_MS)
    pool = client.app[GATEWAY].pool
    try:
        await until(lambda: ready(pool) == {old.endpoint}, WAIT_S, "the worker found")
        moved = fleet.worker(1)  # the pod rescheduled on another address
        records.set(fleet.addresses[1])
        old.stop()
        # The next interval is an hour away: only the lost worker can have made the gateway look again.
        await until(lambda: ready(pool) == {moved.endpoint}, WAIT_S, "the moved worker found")
        status, _ = await post(client)
        assert status == 200
    finally:
        await client.close()
        fleet.stop()


async def post(client: TestClient):
    response = await client.post("/v1/score", json=BODY)
    return response.status, await response.json()
