"""Worker lifecycle: SIGTERM and Shutdown drain (accepted batches answered, then exit 0, once every
gateway said Goodbye: protocol 10); bad artifacts refused at start; a restart serves with the last
fitted profile and refits in the background; a CPU worker over its resident limit releases free
memory after a batch."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from shared import protocol
from shared.bounds import Bounds
from shared.events import Profiled, ProfileRefitted, ProfileReused, read_events

ROOT = Path(__file__).resolve().parents[2]


def full_batch(batch_id: int, bounds: Bounds, vocab: int, rng) -> protocol.ScoreBatch:
    per = bounds.max_tokens_per_sample
    count = min(bounds.max_samples_per_batch, bounds.max_tokens_per_batch // per)
    ids = rng.integers(0, vocab, size=per * count)
    request = protocol.ScoreRequest(f"r{batch_id}", 60_000.0, protocol.pack_ids(ids), (per,) * count, (1, 2), 5, True)
    return protocol.ScoreBatch(batch_id=batch_id, token_dtype="int32", requests=(request,))


def start(demo_artifacts, tmp_path, worker_process_class, client_class):
    worker = worker_process_class(demo_artifacts, tmp_path, queued=8)
    client = client_class(worker.endpoint)
    ready = client.hello()
    assert isinstance(ready, protocol.Ready), worker.log()
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
        assert isinstance(client.hello(), protocol.Ready)
        if how == "sigterm":
            worker.process.send_signal(signal.SIGTERM)
        else:
            client.send(protocol.Shutdown(reason="test"))
        replies = [client.reply_to(b.batch_id, timeout_s=60) for b in batches]
        assert all(isinstance(r, protocol.ScoreResults) and r.results[0].status == "ok" for r in replies), replies
        goodbye = client.recv_where(lambda m: isinstance(m, protocol.Goodbye), timeout_s=30)
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
        client.send(protocol.Shutdown(reason="test"))
        for batch in batches[4:]:
            client.send(batch)
        replies = [client.reply_to(b.batch_id, timeout_s=60) for b in batches]
        assert all(isinstance(r, protocol.ScoreResults) for r in replies[:4])
        assert all(isinstance(r, protocol.Error) and r.code == protocol.ErrorCode.DRAINING for r in replies[4:])
        assert worker.process.wait(timeout=60) == 0
    finally:
        client.close()
        worker.kill()


def test_a_drain_lasts_until_every_gateway_said_goodbye(demo_artifacts, tmp_path, worker_process_class, client_class):
    """Protocol 10: after SIGTERM the worker answers what it holds, then waits for each gateway's
    Goodbye (here far longer than any test: its ack timeout is 10 minutes) before it exits 0."""
    worker = worker_process_class(demo_artifacts, tmp_path, queued=8, worker_lines="drain_ack_timeout_ms = 600000\n")
    first, second = client_class(worker.endpoint, "gw-1"), client_class(worker.endpoint, "gw-2")
    try:
        ready = first.hello()
        assert isinstance(ready, protocol.Ready), worker.log()
        assert isinstance(second.hello(), protocol.Ready)
        batch = full_batch(1, ready.bounds, ready.model["vocab_size"], np.random.default_rng(2))
        first.send(batch)
        assert isinstance(first.hello(), protocol.Ready)  # the batch is accepted
        worker.process.send_signal(signal.SIGTERM)
        for client in (first, second):
            assert client.recv_where(lambda m: isinstance(m, protocol.Goodbye), timeout_s=30).reason == "draining"
        assert isinstance(first.reply_to(batch.batch_id, timeout_s=60), protocol.ScoreResults)
        first.send(protocol.Goodbye(sender_id="gw-1", reason="no more batches"))
        # One gateway has not said Goodbye: the worker keeps running, and still refuses new work.
        late = full_batch(2, ready.bounds, ready.model["vocab_size"], np.random.default_rng(3))
        second.send(late)
        refusal = second.reply_to(late.batch_id, timeout_s=30)
        assert isinstance(refusal, protocol.Error) and refusal.code == protocol.ErrorCode.DRAINING
        assert worker.process.poll() is None, worker.log()
        second.send(protocol.Goodbye(sender_id="gw-2", reason="no more batches"))
        assert worker.process.wait(timeout=60) == 0, worker.log()
    finally:
        first.close()
        second.close()
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



def test_a_worker_configured_for_another_thread_count_is_refused_naming_both(demo_artifacts, tmp_path):
    """The demo artifacts are compiled for configs/test.toml's 1 thread; a worker set to 2 refuses."""
    config = tmp_path / "two-threads.toml"
    config.write_text((ROOT / "configs" / "test.toml").read_text().replace("cpu_threads = 1", "cpu_threads = 2"))
    result = subprocess.run(
        [sys.executable, "-m", "worker", "--config", str(config), "--artifacts", str(demo_artifacts),
         "--endpoint", f"ipc://{tmp_path}/w.sock"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2
    assert "startup_failed" in result.stderr
    assert "compiled for 1 CPU thread(s)" in result.stderr and "cpu_threads = 2" in result.stderr


def cached_worker_argv(artifacts, folder) -> tuple[str, list[str]]:
    """(endpoint, argv) of a worker keeping its profiles in folder/profiles."""
    from tests.worker.conftest import write_config

    endpoint = f"ipc://{folder}/worker.sock"
    return endpoint, [sys.executable, "-m", "worker", "--config", str(write_config(folder, endpoint)),
                      "--artifacts", str(artifacts), "--profile-cache", str(folder / "profiles")]


@contextlib.contextmanager
def serving(argv, endpoint, log_path, client_class):
    """A worker process and a client that had its Ready; SIGTERM at the end must exit 0."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
    client = client_class(endpoint)
    try:
        ready = client.hello()
        assert isinstance(ready, protocol.Ready), log_path.read_text()
        yield client, ready
    finally:
        client.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, log_path.read_text()


def logged(path: Path, event: str, timeout_s: float = 0.0) -> list[dict]:
    """The JSON log lines of `event`, one for people not declared in shared/events.py (waiting up to
    timeout_s for the first one)."""
    end = time.monotonic() + timeout_s
    while True:
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]
        found = [line for line in lines if line.get("event") == event]
        if found or time.monotonic() >= end:
            return found
        time.sleep(0.05)


def test_a_restart_serves_with_the_last_profile_and_refits_in_the_background(demo_artifacts, tmp_path,
                                                                               client_class):
    """First start: the grid is timed before serving and saved. Second start: the saved profile is
    used at once, refitted in the background, and the refit is what Ready carries from then on."""
    endpoint, argv = cached_worker_argv(demo_artifacts, tmp_path)
    cold, warm = tmp_path / "cold.log", tmp_path / "warm.log"
    with serving(argv, endpoint, cold, client_class):
        (saved,) = (tmp_path / "profiles").iterdir()
        cached = json.loads(saved.read_text())["profiles"]["score"]["model"]
    with serving(argv, endpoint, warm, client_class):
        assert logged(warm, "profile_adopted", timeout_s=120), warm.read_text()
        refitted = read_events(warm, ProfileRefitted)[0].coefficients()
        fresh = client_class(endpoint, gateway_id="gw-after-refit")
        try:
            assert fresh.hello().latency["score"].to_dict() == refitted
        finally:
            fresh.close()
    assert read_events(cold, Profiled) and not read_events(cold, ProfileReused)
    (reused,) = read_events(warm, ProfileReused)
    assert reused.coefficients() == cached and not read_events(warm, Profiled)
    assert json.loads(saved.read_text())["profiles"]["score"]["model"] == refitted  # saved for the next start


def test_an_unreadable_profile_cache_costs_only_the_fast_path(demo_artifacts, tmp_path, client_class):
    endpoint, argv = cached_worker_argv(demo_artifacts, tmp_path)
    with serving(argv, endpoint, tmp_path / "first.log", client_class):
        (saved,) = (tmp_path / "profiles").iterdir()
    saved.write_text("{not json")
    with serving(argv, endpoint, tmp_path / "second.log", client_class):
        pass
    assert logged(tmp_path / "second.log", "profile_cache_unusable") and read_events(tmp_path / "second.log", Profiled)


def test_a_cpu_worker_over_its_resident_limit_releases_its_free_memory_after_a_batch(
        demo_artifacts, tmp_path, worker_process_class, client_class):
    """resident_limit_mb = 1: every CPU worker is over it, so the first batch is followed by a release
    (worker/memory.py), logged with the resident set before and after; the next release then waits for
    a quarter more than that release left, so a worker whose memory in use is over its limit does not
    release after every batch."""
    worker = worker_process_class(demo_artifacts, tmp_path, worker_lines="resident_limit_mb = 1\n")
    client = client_class(worker.endpoint)
    try:
        ready = client.hello()
        assert isinstance(ready, protocol.Ready), worker.log()
        rng = np.random.default_rng(0)
        for batch_id in (1, 2):
            client.send(full_batch(batch_id, ready.bounds, ready.model["vocab_size"], rng))
            reply = client.reply_to(batch_id, timeout_s=60)
            assert isinstance(reply, protocol.ScoreResults) and reply.results[0].status == "ok", reply
        assert worker.terminate() == 0, worker.log()  # drained: the compute thread has logged what it did
    finally:
        client.close()
        worker.kill()
    (loaded,) = logged(worker.log_path, "loaded")
    assert loaded["resident_limit_mb"] == 1
    (released,) = logged(worker.log_path, "memory_released")
    assert released["limit_mb"] == 1 and released["released"] is True, released
    assert 0 < released["resident_mb_after"] <= released["resident_mb_before"], released
    assert released["next_release_above_mb"] >= released["resident_mb_after"] * 1.2, released
