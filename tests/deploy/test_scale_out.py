"""Scale-out on loopback: two gateways share two workers over tcp://; a worker killed and restarted under load.

configs/multi.toml (ports swapped for free ones) is the layout: every gateway connects to every
worker. Under steady load on both gateways, worker 0 is SIGKILLed and then started again with the
same command. Every request gets an answer: a result, or a clear JSON error (worker_lost for what
was in flight on the killed worker, or a deadline/queue refusal), never a hang. Both gateways take
the restarted worker back and serve with it.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import sys
import time

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadgen.processes import free_port, stop_all, tail
from tests.builds import without_bounds
from tests.deploy.stack import ROOT, start

pytestmark = pytest.mark.slow  # needs the compiled demo artifacts (built once, cached)
READY_TIMEOUT_S = 240.0
CLIENT_TIMEOUT_S = 30.0  # far beyond the 5 s request deadline: hitting it means a request hung
ALLOWED_ERRORS = {503: {"worker_lost", "no_workers", "deadline_unmeetable", "worker_error"},
                  504: {"deadline_exceeded"}, 429: {"queue_full"}}
BODY = {"samples": ["red running shoe", "blue phone case", "cheap coffee"], "labels": ["yes", "no"],
        "deadline_ms": 5000}


def multi_config(tmp_path, worker_ports: list[int]) -> str:
    text = (ROOT / "configs/multi.toml").read_text()
    for old, new in zip((5601, 5602), worker_ports):
        assert f"tcp://127.0.0.1:{old}" in text
        text = text.replace(f"tcp://127.0.0.1:{old}", f"tcp://127.0.0.1:{new}")
    path = tmp_path / "multi.toml"
    path.write_text(without_bounds(text))  # the suite's demo build is smaller than multi.toml's bounds
    return str(path)


async def workers_ready(session: aiohttp.ClientSession, url: str) -> int:
    try:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as response:
            text = await response.text()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return -1
    for family in text_string_to_metric_families(text):
        if family.name == "boundserve_workers_ready":
            return int(family.samples[0].value)
    return -1


async def wait_workers(session, urls, count: int, processes, logs, timeout_s: float = READY_TIMEOUT_S) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        for process, log in zip(processes, logs):
            assert process.poll() is None, f"{process.args[2:4]} exited:\n{tail(log)}"
        if all([await workers_ready(session, url) == count for url in urls]):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"gateways never saw {count} ready workers:\n" + "\n".join(tail(log) for log in logs))


async def one_request(session, url: str) -> tuple[int, str]:
    """(status, error code or 'ok'); a missing answer within CLIENT_TIMEOUT_S fails the test."""
    async with session.post(url + "/v1/score", json=BODY, timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)) as r:
        body = await r.json()
    if r.status == 200:
        assert len(body["scores"]) == len(BODY["samples"]), body
        return 200, "ok"
    assert body["error"]["message"], body  # a clear error: code and message
    return r.status, body["error"]["code"]


async def load(session, url: str, stop_event: asyncio.Event, outcomes: list) -> None:
    while not stop_event.is_set():
        sent = time.monotonic()
        outcomes.append((url, sent, *await one_request(session, url)))


async def served(outcomes: list, urls, since: float, count: int, what: str) -> None:
    """Wait until every gateway answered `count` requests sent after `since` with 200."""
    end = time.monotonic() + READY_TIMEOUT_S
    while any(sum(1 for u, t, s, _ in outcomes if u == url and t > since and s == 200) < count for url in urls):
        assert time.monotonic() < end, f"fewer than {count} answers per gateway {what}"
        await asyncio.sleep(0.02)


async def test_two_gateways_share_workers_and_survive_a_worker_restart(demo_artifacts, tmp_path):
    worker_ports, http_ports = [free_port(), free_port()], [free_port(), free_port()]
    config = multi_config(tmp_path, worker_ports)
    common = ["--config", config, "--artifacts", str(demo_artifacts)]
    worker_argv = [[sys.executable, "-m", "worker", *common, "--index", str(i), "--worker-id", f"w{i}"] for i in (0, 1)]
    gateway_argv = [[sys.executable, "-m", "gateway", *common, "--port", str(p)] for p in http_ports]
    logs = [tmp_path / n for n in ("w0.log", "w1.log", "g0.log", "g1.log")]
    processes = [start(argv, log) for argv, log in zip(worker_argv + gateway_argv, logs)]
    urls = [f"http://127.0.0.1:{p}" for p in http_ports]
    outcomes: list = []
    try:
        async with aiohttp.ClientSession() as session:
            await wait_workers(session, urls, 2, processes, logs)
            stop_event = asyncio.Event()
            loops = [asyncio.create_task(load(session, url, stop_event, outcomes)) for url in urls for _ in range(3)]
            await served(outcomes, urls, 0.0, 10, "before the kill")
            killed_at = time.monotonic()
            os.kill(processes[0].pid, signal.SIGKILL)
            processes[0].wait()
            await served(outcomes, urls, killed_at, 10, "by the other worker")
            processes[0] = start(worker_argv[0], logs[0])
            await wait_workers(session, urls, 2, processes, logs)
            restarted_at = time.monotonic()
            await served(outcomes, urls, restarted_at, 10, "after the restart")
            stop_event.set()
            await asyncio.gather(*loops)  # a hung request fails here with its client timeout
            for url in urls:  # both gateways serve after the restart
                assert await one_request(session, url) == (200, "ok")
    finally:
        stop_all([processes[2], processes[3]])
        stop_all([processes[0], processes[1]])
    counts = collections.Counter((status, code) for _, _, status, code in outcomes)
    print(f"scale-out outcomes (status, code): {dict(counts)}")
    unexpected = {k: n for k, n in counts.items() if k[0] != 200 and k[1] not in ALLOWED_ERRORS.get(k[0], ())}
    assert not unexpected, f"unclear answers {unexpected}; all: {counts}"
    for url in urls:
        mine = [(t, s) for u, t, s, _ in outcomes if u == url]
        assert any(s == 200 for t, s in mine if t < killed_at), f"{url}: nothing served before the kill: {counts}"
        assert any(s == 200 for t, s in mine if t > restarted_at), f"{url}: nothing served after the restart: {counts}"
