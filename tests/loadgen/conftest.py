"""Loadgen fixtures: the real gateway (in this process, or as `python -m gateway`) in front of the
stand-in worker of tests/gateway, which speaks the real protocol over real ZeroMQ."""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
from pathlib import Path

import pytest
import pytest_asyncio

from tests.builds import demo, suite_build
from tests.gateway.conftest import endpoint, request_tokenizer, start_stack, tokenizer_dir  # noqa: F401 (fixtures)
from loadgen.standin_worker import StandInWorker, standin_manifest
from shared.manifest import manifest_json


@pytest.fixture(scope="session")
def standin_artifacts(tokenizer_dir, request_tokenizer, tmp_path_factory) -> Path:  # noqa: F811
    """An artifacts folder for `python -m gateway` in front of the stand-in: manifest and tokenizer."""
    folder = tmp_path_factory.mktemp("standin-artifacts")
    (folder / "manifest.json").write_bytes(manifest_json(standin_manifest(request_tokenizer.vocab_size)))
    shutil.copy(tokenizer_dir / "tokenizer.json", folder / "tokenizer.json")
    return folder


def deployment_toml(folder: Path, worker_endpoint: str, **gateway) -> Path:
    """A deployment config for a gateway process in front of one stand-in worker."""
    lines = ['name = "loadgen-test"', "[worker]", f'endpoints = ["{worker_endpoint}"]', 'devices = ["cpu"]',
             "heartbeat_interval_ms = 50", "[gateway]", "access_log = false"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in gateway.items()]
    path = folder / "deployment.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _heavy(checkpoint: Path, name: str, folder: Path) -> tuple[Path, Path]:
    """(config, artifacts): bench/tune_applied.py's heavy_config (configs/test.toml with batches of up to
    1024 tokens: a few tens of requests per second fill the tiny demo model, so the load generator
    keeps up with the load levels of the live checks on a small, shared machine), and `checkpoint`
    compiled for it."""
    from bench.tune_applied import HEAVY_BOUNDS, heavy_config
    from tests.builds import build_artifacts

    return heavy_config(checkpoint, folder), build_artifacts(checkpoint, name, bounds=HEAVY_BOUNDS)


@suite_build(compile_s=50)
def heavy_deployment(make, folder) -> tuple[Path, Path]:
    """(config, artifacts): _heavy for the demo checkpoint."""
    return _heavy(demo(make), "loadgen-heavy", folder)


COMPUTE_BOUND = dict(hidden_size=256, intermediate_size=768, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=64, num_hidden_layers=2)
"""A checkpoint whose full 1024-token batch takes tens of milliseconds on one thread: at its capacity
(tens of requests per second) the client and the gateway stay light next to the compute, as in a
real deployment, even on a small machine shared with other work."""


@suite_build(compile_s=50)
def compute_bound_deployment(make, folder) -> tuple[Path, Path]:
    """(config, artifacts): _heavy for a COMPUTE_BOUND checkpoint."""
    return _heavy(make("qwen3", name="compute-bound", **COMPUTE_BOUND), "loadgen-compute-bound", folder)


@pytest.fixture
def standin(request_tokenizer):  # noqa: F811
    """A stand-in worker on its own thread (5 ms per batch)."""
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, delay_ms=5.0).start()
    yield worker
    worker.stop()


@contextlib.asynccontextmanager
async def gated(request_tokenizer, **gateway):  # noqa: F811
    """The gateway app over real HTTP in this process, before a stand-in worker that holds every
    batch answer until the test sets `stack.workers[0].gate`; one batch in flight at a time."""
    worker = StandInWorker(endpoint(), vocab_size=request_tokenizer.vocab_size, gate=threading.Event()).start()
    stack = await start_stack(request_tokenizer, [worker], max_inflight_batches_per_worker=1, **gateway)
    try:
        yield stack
    finally:
        worker.gate.set()
        await stack.client.close()
        worker.stop()


@pytest_asyncio.fixture(loop_scope="function")
async def gated_stack(request_tokenizer):  # noqa: F811
    async with gated(request_tokenizer) as stack:
        yield stack
