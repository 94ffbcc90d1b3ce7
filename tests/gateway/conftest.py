"""Gateway fixtures: the real app over real HTTP, talking real ZeroMQ to a stand-in worker."""

from __future__ import annotations

import dataclasses
import itertools
import os
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from gateway.app import GATEWAY, make_app
from gateway.wiring import Settings
from gateway.tokenizer import RequestTokenizer
from shared.config import DeploymentConfig, GatewayConfig, WorkerConfig
from loadgen.standin_worker import StandInWorker, standin_manifest

_ids = itertools.count()


@pytest.fixture(scope="session")
def tokenizer_dir(tokenizer, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tok")
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="session")
def request_tokenizer(tokenizer_dir) -> RequestTokenizer:
    return RequestTokenizer.from_artifacts(tokenizer_dir)


def endpoint() -> str:
    return f"ipc:///tmp/boundserve-gw-test-{os.getpid()}-{next(_ids)}"


# Route defaults far above any answer time on a loaded 2-core machine: a test about deadlines sets its own
# (in the body, a header or these settings), every other test must not depend on how busy the machine is.
GENEROUS_DEADLINES = {"score_deadline_ms": 30_000, "generate_deadline_ms": 30_000}


def deployment(endpoints: list[str], **gateway) -> DeploymentConfig:
    gw = dataclasses.replace(GatewayConfig(), access_log=False, **{**GENEROUS_DEADLINES, **gateway})
    worker = WorkerConfig(endpoints=tuple(endpoints), devices=tuple("cpu" for _ in endpoints),
                          heartbeat_interval_ms=50)
    return DeploymentConfig(worker=worker, gateway=gw)


class Stack:
    """A running gateway (HTTP client attached) and its stand-in workers."""

    def __init__(self, client: TestClient, workers: list[StandInWorker]) -> None:
        self.client = client
        self.workers = workers

    @property
    def gateway(self):
        return self.client.app[GATEWAY]

    async def post(self, path: str, body: object, **kwargs):
        response = await self.client.post(path, json=body, **kwargs)
        return response.status, await response.json(), response.headers


async def start_stack(request_tokenizer: RequestTokenizer, workers: list[StandInWorker], auth_token=None,
                      wait=True, score=None, manifest=None, **gateway) -> Stack:
    """`score`: a [score] section (ScoreConfig); `manifest`: the artifacts' manifest (default: the
    stand-in's bounds)."""
    config = deployment([w.endpoint for w in workers], **gateway)
    config = config if score is None else config.replace(score=score)
    manifest = manifest or standin_manifest(request_tokenizer.vocab_size)
    app = make_app(Settings(config, manifest, request_tokenizer, auth_token))
    client = TestClient(TestServer(app))
    await client.start_server()
    stack = Stack(client, workers)
    if wait:
        await wait_ready(stack)
    return stack


async def wait_ready(stack: Stack, count: int | None = None, timeout_s: float = 5.0) -> None:
    import asyncio

    want = len(stack.workers) if count is None else count
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while stack.gateway.pool.ready_count() < want:
        assert loop.time() < end, "workers did not become ready"
        await asyncio.sleep(0.01)


@pytest_asyncio.fixture(loop_scope="function")
async def stack(request_tokenizer):
    workers = [StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size).start()]
    stack = await start_stack(request_tokenizer, workers)
    yield stack
    await stack.client.close()
    for worker in workers:
        worker.stop()
