"""Worker test fixtures: a real `python -m worker` process on the compiled demo model, and a client."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from shared import protocol
from tests.builds import without_bounds

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 180.0

WORKER_SECTION = """[worker]
endpoints = ["{endpoint}"]
devices = ["cpu"]
cpu_threads = 1
max_queued_batches = {queued}
heartbeat_interval_ms = 50
warmup_runs = 1
profile_budget_s = 0.3
profile_repeats = 1
"""


def write_config(folder: Path, endpoint: str, queued: int = 4, prefix_cache_mb: int | None = None,
                 worker_lines: str = "", beam_lines: str | None = None) -> Path:
    """configs/test.toml with its [worker] section replaced (short profile, fast heartbeats, plus
    worker_lines), when given [score] prefix_cache_mb set and its [beam] section's lines replaced, and
    without [bounds]: a worker serves what its artifacts were compiled for (some test builds narrow a bound)."""
    text = (ROOT / "configs" / "test.toml").read_text()
    text = without_bounds(text)
    if beam_lines is not None:
        text = re.sub(r"(?ms)^\[beam\]\n.*?(?=^\[|\Z)", f"[beam]\n{beam_lines}\n\n", text)
    text = re.sub(r"(?ms)^\[worker\].*?(?=^\[|\Z)", "", text)
    if prefix_cache_mb is not None:
        text = re.sub(r"(?m)^prefix_cache_mb = .*\n", "", text)
        text = re.sub(r"(?m)^\[score\]\n", f"[score]\nprefix_cache_mb = {prefix_cache_mb}\n", text)
    path = folder / "worker-test.toml"
    path.write_text(text + "\n" + WORKER_SECTION.format(endpoint=endpoint, queued=queued) + worker_lines)
    return path


class WorkerClient:
    """A gateway-side DEALER socket speaking shared.protocol to one worker."""

    def __init__(self, endpoint: str, gateway_id: str = "gw-test") -> None:
        self.context = zmq.Context.instance()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(endpoint)
        self.gateway_id = gateway_id
        self.heartbeats: list[protocol.Heartbeat] = []
        self.backlog: list = []  # messages received while waiting for another one

    def send(self, message) -> None:
        self.socket.send_multipart(protocol.encode(message))

    def send_raw(self, frames: list[bytes]) -> None:
        self.socket.send_multipart(frames)

    def recv(self, timeout_s: float = 30.0, keep_heartbeats: bool = False):
        """Next message; heartbeats are recorded and skipped unless keep_heartbeats."""
        end = time.monotonic() + timeout_s
        while (left := end - time.monotonic()) > 0:
            if not self.socket.poll(int(left * 1000) + 1):
                break
            message = protocol.decode(self.socket.recv_multipart())
            if isinstance(message, protocol.Heartbeat):
                self.heartbeats.append(message)
                if not keep_heartbeats:
                    continue
            return message
        raise TimeoutError(f"no message from the worker within {timeout_s} s")

    def recv_where(self, predicate, timeout_s: float = 30.0):
        """Next message satisfying predicate; others are kept in the backlog for later calls."""
        for k, message in enumerate(self.backlog):
            if predicate(message):
                return self.backlog.pop(k)
        end = time.monotonic() + timeout_s
        while True:
            message = self.recv(max(0.01, end - time.monotonic()))
            if predicate(message):
                return message
            self.backlog.append(message)

    def reply_to(self, batch_id: int, timeout_s: float = 30.0):
        """The ScoreResults/BeamResults/Error answering batch_id."""
        return self.recv_where(lambda m: getattr(m, "batch_id", None) == batch_id, timeout_s)

    def hello(self, timeout_s: float = STARTUP_TIMEOUT_S) -> protocol.Ready:
        self.send(protocol.Hello(protocol_version=protocol.PROTOCOL_VERSION, gateway_id=self.gateway_id))
        return self.recv_where(lambda m: isinstance(m, (protocol.Ready, protocol.Error)), timeout_s)

    def counters(self) -> protocol.WorkerCounters:
        """Counters of the next heartbeat (sent after every reply already received)."""
        return self.heartbeat().counters

    def heartbeat(self) -> protocol.Heartbeat:
        """The next heartbeat (sent after every reply already received)."""
        self.heartbeats.clear()
        while not self.heartbeats:
            self.recv(5.0, keep_heartbeats=True)
        return self.heartbeats[-1]

    def close(self) -> None:
        self.socket.close()


class WorkerProcess:
    """A `python -m worker` subprocess; its JSON-lines log goes to a file."""

    def __init__(self, artifacts: Path, folder: Path, queued: int = 4, prefix_cache_mb: int | None = None,
                 worker_lines: str = "", beam_lines: str | None = None) -> None:
        self.endpoint = f"ipc://{folder}/worker.sock"
        self.config = write_config(folder, self.endpoint, queued, prefix_cache_mb, worker_lines, beam_lines)
        self.log_path = folder / "worker.log"
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "worker", "--config", str(self.config), "--artifacts", str(artifacts),
                 "--worker-id", "w-test"],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "PYTHONPATH": str(ROOT)},
            )

    def log(self) -> str:
        return self.log_path.read_text()

    def terminate(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="session")
def client_class():
    return WorkerClient


@pytest.fixture(scope="session")
def worker_process_class():
    return WorkerProcess


@pytest.fixture(scope="module")
def worker_process(demo_artifacts, tmp_path_factory):
    worker = WorkerProcess(demo_artifacts, tmp_path_factory.mktemp("worker"))
    yield worker
    worker.kill()


@pytest.fixture(scope="module")
def client(worker_process):
    """A client that has completed the handshake with the module's worker."""
    c = WorkerClient(worker_process.endpoint)
    try:
        ready = c.hello()
    except TimeoutError:
        pytest.fail("worker did not answer Hello; its log:\n" + worker_process.log())
    assert isinstance(ready, protocol.Ready), ready
    c.ready = ready
    yield c
    c.close()
