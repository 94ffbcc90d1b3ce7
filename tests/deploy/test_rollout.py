"""A rolling update under open-loop load loses nothing: every worker, then every gateway, is given
SIGTERM, drains, exits 0 and is started again, one at a time, while requests keep coming.

Two `python -m gateway` processes sit behind a round-robin proxy written here (the Service a cluster
puts in front of them, with the gateway pod's preStop pause of deploy/k8s/base/gateway.yaml: it takes a
gateway out of rotation, lets the requests already sent to it come back, and only then is the gateway
given SIGTERM; it puts it back in once it is ready, and sends a request the gateway refused `draining`,
or whose connection was refused, to the next one: neither was computed). Without that pause a connection
opened just before the SIGTERM can still sit in the listener's backlog when an idle gateway closes it,
and is reset with its request unread: the load balancer cannot tell that from a request lost
mid-computation, so a cluster waits for the endpoint's removal to spread first. Three workers, each a
stand-in process speaking the real protocol (loadgen/standin_worker.py: compiled workers would take
minutes to start on a 2-core machine; the stand-in drains as worker/server.py does, protocol 10's
handshake). All on loopback.

Asserted: every request got an HTTP answer (no reset, no refused connection, no hang); every answer
is 200 or a deadline refusal the admission model made (429 queue_full, 503 deadline_unmeetable,
504 deadline_exceeded); every process exited 0 when rolled; goodput (answers in time per request
sent) during the roll is at least 0.9 of that before it. The ratio is printed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from loadgen.processes import free_port, stop_all, tail
from loadgen.standin_worker import standin_manifest
from shared.manifest import manifest_json
from tests.chaos.openloop import OpenLoop
from tests.deploy.stack import start

RATE_PER_S, DEADLINE_MS = 25, 2000
BEFORE_REQUESTS = 100  # the baseline: 4 s of load before the roll
WORKERS, GATEWAYS = 3, 2
STANDIN_DELAY_MS = 5
STEP_TIMEOUT_S = 60.0
MIN_GOODPUT_RATIO = 0.9
ALLOWED = {200: {"ok"}, 429: {"queue_full"}, 503: {"deadline_unmeetable"}, 504: {"deadline_exceeded"}}


class RoundRobin:
    """The Service in front of the gateways: round-robin over those in rotation; a request refused
    uncomputed (503 draining, connection refused) goes to the next one."""

    def __init__(self) -> None:
        self.rotation: list[str] = []
        self.retried = 0
        self._next = 0
        self._session: aiohttp.ClientSession | None = None
        self._open: dict[str, int] = {}  # gateway url -> requests sent to it and not yet answered
        self._changed = asyncio.Condition()

    async def take_out(self, url: str) -> None:
        """Send nothing more to `url`; return once every request already sent to it has come back."""
        self.rotation = [u for u in self.rotation if u != url]
        async with self._changed:
            await self._changed.wait_for(lambda: not self._open.get(url))

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        assert self._session is not None
        for _ in range(2 * GATEWAYS + 1):
            if not self.rotation:
                break
            url = self.rotation[self._next % len(self.rotation)]
            self._next += 1
            self._open[url] = self._open.get(url, 0) + 1
            try:
                async with self._session.post(url + request.path, data=body,
                                              headers={"Content-Type": "application/json"}) as answer:
                    payload = await answer.read()
                    if answer.status == 503 and _code(payload) == "draining":
                        self.retried += 1
                        continue
                    return web.Response(status=answer.status, body=payload, content_type="application/json")
            # never reached the gateway, nothing computed: no connection, or one the gateway closed before the
            # request was written (a load balancer retries both: Envoy's connect-failure, reset-before-request)
            except (aiohttp.ClientConnectorError, aiohttp.ClientConnectionResetError):
                self.retried += 1
            finally:
                self._open[url] -= 1
                async with self._changed:
                    self._changed.notify_all()
        return web.json_response({"error": {"code": "no_gateway", "message": "no gateway took it",
                                            "request_id": "-"}}, status=502)

    async def start(self, port: int) -> web.AppRunner:
        # A fresh connection per request: a pooled one to a gateway that just closed would be reset.
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        app = web.Application()
        app.router.add_post("/v1/score", self.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _code(payload: bytes) -> str:
    try:
        return json.loads(payload)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return ""


class Fleet:
    """The processes: stand-in workers and gateways, each restartable with its own command."""

    def __init__(self, folder: Path, vocab_size: int) -> None:
        self.folder = folder
        self.worker_ports = [free_port() for _ in range(WORKERS)]
        self.gateway_ports = [free_port() for _ in range(GATEWAYS)]
        self.config = folder / "rollout.toml"
        endpoints = json.dumps([f"tcp://127.0.0.1:{p}" for p in self.worker_ports])
        self.config.write_text(f'name = "rollout"\n\n[worker]\nendpoints = {endpoints}\n'
                               f"devices = {json.dumps(['cpu'] * WORKERS)}\nheartbeat_interval_ms = 50\n\n"
                               "[gateway]\naccess_log = false\nworker_timeout_ms = 1000\n")
        self.vocab_size = vocab_size
        self.workers: list = [None] * WORKERS
        self.gateways: list = [None] * GATEWAYS
        self.started: list = []

    def log(self, name: str) -> Path:
        return self.folder / f"{name}.log"

    def start_worker(self, i: int) -> None:
        argv = [sys.executable, "-m", "loadgen.standin_worker", "--endpoint", f"tcp://127.0.0.1:{self.worker_ports[i]}",
                "--delay-ms", str(STANDIN_DELAY_MS), "--predicted-ms", str(STANDIN_DELAY_MS),
                "--vocab-size", str(self.vocab_size)]
        self.workers[i] = start(argv, self.log(f"worker-{i}"))
        self.started.append(self.workers[i])

    def start_gateway(self, i: int) -> None:
        argv = [sys.executable, "-m", "gateway", "--config", str(self.config), "--artifacts", str(self.folder),
                "--port", str(self.gateway_ports[i])]
        self.gateways[i] = start(argv, self.log(f"gateway-{i}"))
        self.started.append(self.gateways[i])

    def url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.gateway_ports[i]}"


@pytest.fixture
def fleet(tmp_path, tokenizer):
    tokenizer.save(str(tmp_path / "tokenizer.json"))  # a gateway needs the manifest and the tokenizer alone
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    (tmp_path / "manifest.json").write_bytes(manifest_json(standin_manifest(vocab_size)))
    fleet = Fleet(tmp_path, vocab_size)
    yield fleet
    stop_all(fleet.started, timeout_s=10)


async def ready_pids(session: aiohttp.ClientSession, url: str) -> dict[str, int]:
    """endpoint -> pid of each worker the gateway at `url` serves with now (empty: not up or not ready)."""
    try:
        async with session.get(url + "/readyz") as response:
            body = await response.json(content_type=None)
    except (aiohttp.ClientError, ValueError):
        return {}
    return {w["endpoint"]: w["pid"] for w in body.get("workers", []) if w["state"] == "ready"}


async def until(fleet: Fleet, condition, what: str) -> None:
    """Poll `condition()` until it holds; every process that should run must run meanwhile."""
    end = time.monotonic() + STEP_TIMEOUT_S
    while not await condition():
        for kind, group in (("worker", fleet.workers), ("gateway", fleet.gateways)):
            for i, process in enumerate(group):
                assert process.poll() is None, f"{kind}-{i} exited while waiting for {what}:\n" + tail(
                    fleet.log(f"{kind}-{i}"))
        assert time.monotonic() < end, f"{what} never happened"
        await asyncio.sleep(0.02)


async def all_ready(fleet: Fleet, session: aiohttp.ClientSession, gateways=range(GATEWAYS)) -> bool:
    """Every gateway in `gateways` serves with every worker process running now."""
    want = {f"tcp://127.0.0.1:{p}": w.pid for p, w in zip(fleet.worker_ports, fleet.workers)}
    return all([await ready_pids(session, fleet.url(i)) == want for i in gateways])


async def roll(fleet: Fleet, group: list, i: int, what: str) -> None:
    """SIGTERM one process, wait for it to exit 0 after its drain."""
    process = group[i]
    process.terminate()
    code = await asyncio.to_thread(process.wait, STEP_TIMEOUT_S)
    assert code == 0, f"{what} exited {code} after SIGTERM:\n{tail(fleet.log(what))}"


def goodput(outcomes) -> float:
    """Answers within their deadline per request sent."""
    good = sum(1 for o in outcomes if o.status == 200 and o.waited_s <= o.deadline_ms / 1000.0)
    return good / len(outcomes)


async def test_rolling_every_worker_then_every_gateway_under_load_loses_nothing(fleet):
    for i in range(WORKERS):
        fleet.start_worker(i)
    for i in range(GATEWAYS):
        fleet.start_gateway(i)
    proxy, proxy_port = RoundRobin(), free_port()
    runner = await proxy.start(proxy_port)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as probe, \
            aiohttp.ClientSession() as clients:
        try:
            await until(fleet, lambda: all_ready(fleet, probe), "every gateway serving with every worker")
            proxy.rotation = [fleet.url(i) for i in range(GATEWAYS)]
            load = OpenLoop(clients, f"http://127.0.0.1:{proxy_port}", RATE_PER_S, DEADLINE_MS)
            sending = asyncio.create_task(load.run())
            await until(fleet, lambda: _true(len(load.outcomes) >= BEFORE_REQUESTS), "the baseline load")
            rolled_from = len(load.outcomes)
            for i in range(WORKERS):
                await roll(fleet, fleet.workers, i, f"worker-{i}")
                fleet.start_worker(i)
                await until(fleet, lambda: all_ready(fleet, probe), f"every gateway serving with worker {i} again")
            for i in range(GATEWAYS):
                await proxy.take_out(fleet.url(i))  # the Service drops it first, the preStop pause lets it settle
                await roll(fleet, fleet.gateways, i, f"gateway-{i}")
                fleet.start_gateway(i)
                await until(fleet, lambda: all_ready(fleet, probe, [i]), f"gateway {i} serving again")
                proxy.rotation = [fleet.url(j) for j in range(GATEWAYS)]
            rolled_to = len(load.outcomes)
            load.sending = False
            await asyncio.wait_for(sending, DEADLINE_MS / 1000.0 + 30.0)
        finally:
            await runner.cleanup()
            await proxy.close()
    unanswered = [o for o in load.outcomes if o.failure or not o.status]
    assert not unanswered, unanswered[:5]
    wrong = [(o.status, o.code) for o in load.outcomes if o.code not in ALLOWED.get(o.status, ())]
    assert not wrong, wrong[:10]
    before, during = load.outcomes[:rolled_from], load.outcomes[rolled_from:rolled_to]
    assert during, "the roll sent no request"
    ratio = goodput(during) / goodput(before)
    print(f"\nrollout: {len(before)} requests before, {len(during)} during the roll of {WORKERS} workers and "
          f"{GATEWAYS} gateways; goodput before {goodput(before):.3f}, during {goodput(during):.3f}, "
          f"ratio {ratio:.3f}; {proxy.retried} sent to the next gateway (refused uncomputed)")
    assert ratio >= MIN_GOODPUT_RATIO


async def _true(value: bool) -> bool:
    return value
