"""A local boundserve stack for live checks: `python -m gateway --spawn-workers` started and owned here.

The deployment config is the user's, written again (tomli-w) with the gateway on a free local port
and each worker on its own ipc endpoint in a scratch folder, so a check never collides with a
running deployment. Everything the gateway and its workers print goes to one log file; the workers'
events there (shared/events.py, read by type) tell the latency model each reported and what each
batch cost.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from loadgen.live import stop, wait_ready
from loadgen.service import ServiceModel, load_service_model
from loadgen.tuner import apply_knobs, config_toml
from shared.config import DeploymentConfig
from shared.events import SETTLED, BatchDone, read_events
from shared.request_ids import client_id


@dataclass(frozen=True)
class BatchLine:
    """One BatchDone event of a worker: milliseconds it waited in the worker and computed."""

    queue_ms: float
    compute_ms: float
    request_ids: tuple[str, ...]
    """As the client sent them (X-Request-Id), without the gateway's `~n` and chunk `#k` suffixes."""
    expired: tuple[str, ...]
    done_unix: float = 0.0
    """When the worker logged it (its compute ended just before)."""


class LocalStack:
    """Starts on `start()`, stops on `stop()` (SIGTERM to its process group: the workers go too)."""

    def __init__(self, config_path: str | Path, artifacts: str | Path, folder: str | Path,
                 knobs: dict[str, Any] | None = None, startup_timeout_s: float = 180.0) -> None:
        self.folder = Path(folder)
        self.artifacts = Path(artifacts)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = self.folder / "stack.toml"
        self.log_path = self.folder / "stack.log"
        self.startup_timeout_s = startup_timeout_s
        raw = apply_knobs(tomllib.loads(Path(config_path).read_text()), knobs or {})
        self.raw_config = local_config(raw, self.folder, self.port)
        self._process: subprocess.Popen | None = None

    def start(self) -> LocalStack:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(config_toml(self.raw_config))
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "gateway", "--config", str(self.config_path), "--artifacts",
                 str(self.artifacts), "--spawn-workers"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            asyncio.run(wait_ready(self.url, self.startup_timeout_s, (self._process,)))
            self._wait_profiles()
        except (RuntimeError, TimeoutError) as exc:
            self.stop()
            raise RuntimeError(f"the local stack did not start: {exc}; its log:\n{self.log_tail()}") from None
        return self

    def _wait_profiles(self) -> None:
        """Until every worker's profile is settled: measured at start-up, or, after a start on a cached
        profile, measured again by its background refit (which holds the compute lane while it runs)."""
        workers = len(self.raw_config["worker"]["endpoints"])
        end = time.monotonic() + self.startup_timeout_s
        while True:
            settled = {e.worker for e in read_events(self.log_path, *SETTLED)}
            if len(settled) >= workers:
                return
            if time.monotonic() > end:
                raise TimeoutError(f"{workers - len(settled)} worker(s) never settled their latency profile")
            time.sleep(0.2)

    def stop(self) -> None:
        if self._process is not None:
            stop(self._process, 30.0)
            self._process = None

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def reported_model(self) -> ServiceModel:
        """The latency model the workers reported (their last profile events)."""
        return load_service_model(str(self.log_path))

    def batch_lines(self) -> list[BatchLine]:
        """Every batch the workers have answered so far, in log order."""
        return [BatchLine(e.queue_ms, e.compute_ms, tuple(map(client_id, e.request_ids)),
                          tuple(map(client_id, e.expired)), e.ts) for e in read_events(self.log_path, BatchDone)]


def deployment_toml(config: DeploymentConfig) -> str:
    """A DeploymentConfig as TOML text that shared.config.load_config reads back unchanged (unset
    optional keys left out)."""
    return config_toml(_without_none(msgspec.to_builtins(config)))


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    return value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_config(raw: dict[str, Any], folder: Path, port: int) -> dict[str, Any]:
    """The config on 127.0.0.1:port, its workers on endpoints in `folder`, no access log."""
    out = dict(raw)
    worker = dict(out.get("worker", {}))
    count = len(worker.get("endpoints", ["one"]))
    worker["endpoints"] = [f"ipc://{folder}/worker-{i}" for i in range(count)]
    worker["devices"] = list(worker.get("devices", ["cpu"] * count))
    out["worker"] = worker
    out["gateway"] = {**out.get("gateway", {}), "host": "127.0.0.1", "port": port, "access_log": False}
    return out

