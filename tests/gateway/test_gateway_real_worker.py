"""The gateway in front of real `python -m worker` processes serving the tiny compiled demo model.

Answers through HTTP equal the compiled scoring node called directly; a worker killed with
SIGKILL under load costs only its in-flight requests (answered, never hung), the other worker
keeps serving, and the supervisor brings the killed one back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
import torch
from aiohttp.test_utils import TestClient, TestServer

from gateway.app import GATEWAY, make_app
from gateway.wiring import Settings
from gateway.tokenizer import RequestTokenizer
from shared.config import BeamConfig, load_config
from shared.manifest import read_manifest
from tests.builds import without_bounds
from tests.gateway.test_gateway_fuzz import free_port

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["red running shoe", "is this relevant: blue phone case for summer", "cheap coffee", "the best hotel near me"]
pytestmark = pytest.mark.slow  # needs the compiled demo artifacts (built once per machine, cached)


def deployment_for(endpoints: list[str], port: int = 0):
    config = load_config(ROOT / "configs/test.toml")
    worker = dataclasses.replace(config.worker, endpoints=tuple(endpoints), devices=("cpu",) * len(endpoints),
                                 heartbeat_interval_ms=50)
    gateway = dataclasses.replace(config.gateway, access_log=False, port=port, score_deadline_ms=5000)
    return config.replace(worker=worker, gateway=gateway)


@contextlib.asynccontextmanager
async def real_gateway(artifacts: Path, folder: Path, worker_config: Path | str | None = None,
                       auth_token: str | None = None, **sections):
    """A real worker process (started with `worker_config`, default configs/test.toml without [bounds]: the
    worker serves what the artifacts were compiled for) and the gateway app (in this process) in front of it,
    its config's `sections` replaced, taking `auth_token` as its bearer token."""
    if worker_config is None:
        worker_config = folder / "worker-test.toml"
        worker_config.write_text(without_bounds((ROOT / "configs/test.toml").read_text()))
    endpoint = f"ipc://{folder}/w0"
    worker = subprocess.Popen([sys.executable, "-m", "worker", "--config", str(worker_config), "--artifacts",
                               str(artifacts), "--endpoint", endpoint], cwd=ROOT)
    manifest = read_manifest(artifacts)
    config = deployment_for([endpoint]).replace(**sections)
    settings = Settings(config, manifest, RequestTokenizer.from_artifacts(artifacts), auth_token)
    client = TestClient(TestServer(make_app(settings)))
    await client.start_server()
    try:
        end = time.monotonic() + 120
        while client.app[GATEWAY].pool.ready_count() == 0:
            assert time.monotonic() < end and worker.poll() is None, "the worker never became ready"
            await asyncio.sleep(0.05)
        yield client
    finally:
        await client.close()
        worker.terminate()
        worker.wait(timeout=30)


@pytest_asyncio.fixture(loop_scope="function")
async def real_stack(demo_artifacts, tmp_path):
    async with real_gateway(demo_artifacts, tmp_path) as client:
        yield client



async def test_generate_equals_the_compiled_beam_node(beam_artifacts, tmp_path):
    from worker.runtime.loader import load_nodes

    async with real_gateway(beam_artifacts, tmp_path, beam=BeamConfig(enabled=True)) as client:
        body = {"prompt": "red running shoe", "beam_width": 4, "max_new_tokens": 3, "num_return_sequences": 2}
        response = await client.post("/v1/generate", json=body)
        answer = await response.json()
        assert response.status == 200, answer
        prompt = encode(client, [body["prompt"]])[0]
    out = load_nodes(beam_artifacts).beam(torch.tensor(prompt, dtype=torch.int64),
                                          torch.tensor([len(prompt)], dtype=torch.int64), 4, 3, 2)
    want = [out.sequences[0, i, : int(out.lengths[0, i])].tolist() for i in range(2)]
    assert [c["token_ids"] for c in answer["candidates"]] == want
    np.testing.assert_allclose([c["score"] for c in answer["candidates"]], out.scores[0].numpy(), rtol=1e-5)


@pytest.fixture(scope="module")
def score_node(demo_artifacts):
    from worker.runtime.loader import load_nodes

    return load_nodes(demo_artifacts).score


def direct(score_node, token_ids: list[list[int]], label_ids: list[int], top_k: int = 0):
    flat = torch.tensor([t for ids in token_ids for t in ids], dtype=torch.int64)
    lens = torch.tensor([len(ids) for ids in token_ids], dtype=torch.int64)
    return score_node(flat, lens, torch.tensor(label_ids, dtype=torch.int64), top_k)


def encode(client, texts):
    return client.app[GATEWAY].settings.tokenizer.encode(texts)


@pytest.mark.parametrize("output, field", [("probs", "label_probs"), ("logprobs", "label_logprobs"),
                                           ("logits", "label_logits")])
async def test_label_outputs_equal_the_compiled_node(real_stack, score_node, output, field):
    response = await real_stack.post("/v1/score", json={"samples": TEXTS, "labels": ["yes", "no"], "output": output})
    body = await response.json()
    assert response.status == 200, body
    want = getattr(direct(score_node, encode(real_stack, TEXTS), body["label_token_ids"]), field)
    np.testing.assert_allclose(body["scores"], want.numpy(), rtol=1e-5, atol=1e-6)


async def test_topk_and_embedding_equal_the_compiled_node(real_stack, score_node):
    response = await real_stack.post("/v1/score", json={"samples": TEXTS, "output": "topk", "top_k": 3})
    body = await response.json()
    assert response.status == 200, body
    out = direct(score_node, encode(real_stack, TEXTS), [], 3)
    assert body["topk"]["token_ids"] == out.topk_ids.tolist()
    np.testing.assert_allclose(body["topk"]["logprobs"], out.topk_logprobs.numpy(), rtol=1e-5, atol=1e-6)
    response = await real_stack.post("/v1/score", json={"samples": TEXTS, "output": "embedding"})
    body = await response.json()
    assert response.status == 200, body
    np.testing.assert_allclose(body["embeddings"], out.hidden.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("apply_softmax", [True, False])
async def test_sglang_shape_equals_the_compiled_node(real_stack, score_node, apply_softmax):
    body = {"query": "is it relevant: ", "items": ["red shoe", "blue phone"], "label_token_ids": [5, 9],
            "apply_softmax": apply_softmax}
    response = await real_stack.post("/v1/score", json=body)
    answer = await response.json()
    assert response.status == 200, answer
    out = direct(score_node, encode(real_stack, ["is it relevant: red shoe", "is it relevant: blue phone"]), [5, 9])
    want = out.label_probs if apply_softmax else out.label_logprobs.exp()
    np.testing.assert_allclose(answer["scores"], want.numpy(), rtol=1e-5, atol=1e-7)


async def test_a_request_over_one_batch_is_split_and_equals_the_node(real_stack, score_node):
    texts = [f"{TEXTS[i % 4]} {i}" for i in range(20)]  # compiled bound: 8 samples per batch
    response = await real_stack.post("/v1/score", json={"samples": texts, "labels": ["yes"], "output": "logits"})
    body = await response.json()
    assert response.status == 200, body
    ids = encode(real_stack, texts)  # the node, called directly, one compiled batch at a time
    want = np.concatenate([direct(score_node, ids[i:i + 8], body["label_token_ids"]).label_logits.numpy()
                           for i in range(0, 20, 8)])
    np.testing.assert_allclose(body["scores"], want, rtol=1e-5, atol=1e-5)


async def test_requests_batched_together_with_different_labels_each_equal_the_node(real_stack, score_node):
    asks = [{"samples": TEXTS[:2], "label_token_ids": [5, 9], "output": "probs"},
            {"samples": TEXTS[2:], "label_token_ids": [9, 11, 13], "output": "probs"},
            {"samples": TEXTS[1:3], "output": "topk", "top_k": 2},
            {"samples": TEXTS[:1], "label_token_ids": [7], "output": "logprobs"}]
    answers = await asyncio.gather(*(real_stack.post("/v1/score", json=ask) for ask in asks))
    bodies = [await answer.json() for answer in answers]
    assert all(answer.status == 200 for answer in answers), bodies
    for ask, body in zip(asks, bodies):
        out = direct(score_node, encode(real_stack, ask["samples"]), ask.get("label_token_ids", []), ask.get("top_k", 0))
        if ask["output"] == "topk":
            assert body["topk"]["token_ids"] == out.topk_ids.tolist()
        else:
            want = out.label_probs if ask["output"] == "probs" else out.label_logprobs
            np.testing.assert_allclose(body["scores"], want.numpy(), rtol=1e-5, atol=1e-6)


async def test_kill_9_of_a_worker_under_load(demo_artifacts, tmp_path):
    port = free_port()
    config = tmp_path / "two.toml"
    config.write_text((ROOT / "configs/test.toml").read_text().replace(
        'endpoints = ["ipc:///tmp/boundserve-test-worker-0"]\ndevices = ["cpu"]',
        f'endpoints = ["ipc://{tmp_path}/w0", "ipc://{tmp_path}/w1"]\ndevices = ["cpu", "cpu"]\n'
        "heartbeat_interval_ms = 50") + f"\n[gateway]\nport = {port}\naccess_log = false\n")
    gateway = subprocess.Popen([sys.executable, "-m", "gateway", "--config", str(config), "--artifacts",
                                str(demo_artifacts), "--spawn-workers"], cwd=ROOT, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            pids = await wait_workers(http, url, 2)
            statuses = await load_while_killing(http, url, pids[0])
            assert set(statuses) <= {200, 503, 504}, statuses  # every request answered; none hung
            assert statuses[-20:].count(200) == 20, statuses[-20:]  # the remaining worker serves the rest
            restarted = await wait_workers(http, url, 2)
            assert pids[0] not in restarted and pids[1] in restarted
    finally:
        gateway.send_signal(signal.SIGTERM)
        assert gateway.wait(timeout=60) == 0


async def ready_pids(http, url: str) -> list[int]:
    try:
        async with http.get(url + "/readyz") as response:
            body = await response.json()
    except aiohttp.ClientError:
        return []
    return [w["pid"] for w in body.get("workers", []) if w["state"] == "ready"]


async def wait_workers(http, url: str, count: int, timeout_s: float = 120) -> list[int]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        pids = await ready_pids(http, url)
        if len(pids) == count:
            return pids
        await asyncio.sleep(0.1)
    raise AssertionError(f"{count} workers never became ready")


async def load_while_killing(http, url: str, victim: int) -> list[int]:
    """Six clients send back to back; the victim is killed after 20 answers, and the load ends 40
    answers after the gateway has seen it gone."""
    statuses: list[int] = []
    enough, done = asyncio.Event(), asyncio.Event()

    async def client(k: int) -> None:
        while not done.is_set():
            body = {"samples": [f"{TEXTS[k % 4]} {len(statuses)}"] * 4, "labels": ["yes", "no"], "deadline_ms": 3000}
            async with http.post(url + "/v1/score", json=body) as response:
                statuses.append(response.status)
            if len(statuses) >= 20:
                enough.set()

    async def killer() -> None:
        await enough.wait()
        os.kill(victim, signal.SIGKILL)
        while victim in await ready_pids(http, url):
            await asyncio.sleep(0.01)
        seen_at = len(statuses)
        while len(statuses) < seen_at + 40:
            await asyncio.sleep(0.01)
        done.set()

    await asyncio.gather(killer(), *(client(k) for k in range(6)))
    return statuses
