"""Worker lifecycle: SIGTERM and Shutdown drain (accepted batches answered, then exit 0); bad artifacts
refused at start."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shared import protocol as p

ROOT = Path(__file__).resolve().parents[2]


def full_batch(batch_id: int, bounds: dict, vocab: int, rng) -> p.ScoreBatch:
    per = bounds["max_tokens_per_sample"]
    count = min(bounds["max_samples_per_batch"], bounds["max_tokens_per_batch"] // per)
    ids = rng.integers(0, vocab, size=per * count)
    request = p.ScoreRequest(f"r{batch_id}", 60_000.0, p.pack_ids(ids), (per,) * count, (1, 2), 5, True)
    return p.ScoreBatch(batch_id=batch_id, token_dtype="int32", requests=(request,))


def start(demo_artifacts, tmp_path, worker_process_class, client_class):
    worker = worker_process_class(demo_artifacts, tmp_path, queued=8)
    client = client_class(worker.endpoint)
    ready = client.hello()
    assert isinstance(ready, p.Ready), worker.log()
    return worker, client, ready


@pytest.mark.parametrize("how", ["sigterm", "shutdown_message"])
def test_drain_answers_accepted_batches_then_exits_zero(demo_artifacts, tmp_path, worker_process_class,
                                                         client_class, how):
    worker, client, ready = start(demo_artifacts, tmp_path, worker_process_class, client_class)
    try:
        rng = np.random.default_rng(0)
        vocab = ready.model["vocab_size"]
        batches = [full_batch(i, ready.bounds, vocab, rng) for i in range(1, 5)]
        for batch in batches:
            client.send(batch)
        # Hello after the batches: once Ready comes back, the worker has accepted all of them.
        assert isinstance(client.hello(), p.Ready)
        if how == "sigterm":
            worker.process.send_signal(signal.SIGTERM)
        else:
            client.send(p.Shutdown(reason="test"))
        replies = [client.reply_to(b.batch_id, timeout_s=60) for b in batches]
        assert all(isinstance(r, p.ScoreResults) and r.results[0].status == "ok" for r in replies), replies
        goodbye = client.recv_where(lambda m: isinstance(m, p.Goodbye), timeout_s=30)
        assert goodbye.reason == "draining"
        assert worker.process.wait(timeout=60) == 0, worker.log()
        assert '"event":"stopped"' in worker.log()
    finally:
        client.close()
        worker.kill()


def test_new_work_during_drain_is_refused(demo_artifacts, tmp_path, worker_process_class, client_class):
    worker, client, ready = start(demo_artifacts, tmp_path, worker_process_class, client_class)
    try:
        rng = np.random.default_rng(1)
        batches = [full_batch(i, ready.bounds, ready.model["vocab_size"], rng) for i in range(1, 9)]
        for batch in batches[:4]:
            client.send(batch)
        client.send(p.Shutdown(reason="test"))
        for batch in batches[4:]:
            client.send(batch)
        replies = [client.reply_to(b.batch_id, timeout_s=60) for b in batches]
        assert all(isinstance(r, p.ScoreResults) for r in replies[:4])
        assert all(isinstance(r, p.Error) and r.code == p.ErrorCode.DRAINING for r in replies[4:])
        assert worker.process.wait(timeout=60) == 0
    finally:
        client.close()
        worker.kill()


def test_missing_artifacts_fail_at_start_with_a_clear_error(tmp_path):
    config = ROOT / "configs" / "test.toml"
    result = subprocess.run(
        [sys.executable, "-m", "worker", "--config", str(config), "--artifacts", str(tmp_path / "none"),
         "--endpoint", f"ipc://{tmp_path}/w.sock"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2
    assert "startup_failed" in result.stderr and "manifest" in result.stderr


def test_endpoint_in_use_fails_with_a_clear_error(demo_artifacts, tmp_path):
    import zmq

    context = zmq.Context.instance()
    holder = context.socket(zmq.ROUTER)
    port = holder.bind_to_random_port("tcp://127.0.0.1")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "worker", "--config", str(ROOT / "configs" / "test.toml"), "--artifacts",
             str(demo_artifacts), "--endpoint", f"tcp://127.0.0.1:{port}"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
        )
    finally:
        holder.close(linger=0)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "bind_failed" in result.stderr and str(port) in result.stderr


def test_artifacts_built_for_another_machine_are_refused(demo_artifacts, tmp_path):
    import json
    import shutil

    copy = tmp_path / "artifacts"
    shutil.copytree(demo_artifacts, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["machine"]["cpu_isa"] = "some-other-isa"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    result = subprocess.run(
        [sys.executable, "-m", "worker", "--config", str(ROOT / "configs" / "test.toml"), "--artifacts", str(copy),
         "--endpoint", f"ipc://{tmp_path}/w.sock"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2
    assert "startup_failed" in result.stderr and "another machine" in result.stderr
