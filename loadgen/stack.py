"""Local boundserve stacks for live checks, benchmarks and tests, started and owned here.

`LocalStack`: `python -m gateway --spawn-workers`, the deployment as a user runs it. `start_standin_stack`:
a gateway on one stand-in worker (loadgen/standin_worker.py), for what is measured or fuzzed without a
model. `SharedWorkers` and
`GatewayProcess`: the config's workers started once as processes of their own and several gateways on
them, each with its own [gateway] settings, for comparing gateway policies on one machine; with a
`Pinning` the workers are confined to CPUs of their own (os.sched_setaffinity) and the gateways and the
client driving them to the rest, so that refusals and sends never take CPU from the model.

The deployment config is the user's, written again (tomli-w) with the gateway on a free local port
and each worker on its own ipc endpoint in a scratch folder, so a check never collides with a
running deployment. Everything the gateway and its workers print goes to one log file; the workers'
events there (shared/events.py, read by type) tell the latency model each reported and what each
batch cost.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from loadgen.live import wait_ready
from loadgen.processes import free_port, spawn, stop, tail
from loadgen.service import ServiceModel, load_service_model
from loadgen.standin_worker import standin_manifest
from loadgen.tuner import apply_knobs, config_toml
from shared.config import DeploymentConfig
from shared.events import SETTLED, BatchDone, parse_events, read_events
from shared.manifest import manifest_json
from shared.request_ids import client_id

ROOT = Path(__file__).resolve().parent.parent


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
        self.log_path.write_bytes(b"")
        self._process = spawn([sys.executable, "-m", "gateway", "--config", str(self.config_path), "--artifacts",
                               str(self.artifacts), "--spawn-workers"], self.log_path)
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
        return tail(self.log_path, chars)

    def reported_model(self) -> ServiceModel:
        """The latency model the workers reported (their last profile events)."""
        return load_service_model(str(self.log_path))

    def batch_lines(self) -> list[BatchLine]:
        """Every batch the workers have answered so far, in log order."""
        return batch_lines(self.log_path)


def batch_lines(log_path: str | Path, offset: int = 0) -> list[BatchLine]:
    """The batches a log of JSON lines names (a worker's, or a gateway's that carries its workers'), from
    byte `offset` on (a size the log had between two lines), in log order."""
    with open(log_path, "rb") as log:
        log.seek(offset)
        events = parse_events(log.read())
    return [BatchLine(e.queue_ms, e.compute_ms, tuple(map(client_id, e.request_ids)), tuple(map(client_id, e.expired)),
                      e.ts) for e in events if isinstance(e, BatchDone)]


def start_standin_stack(folder: Path, port: int, vocab_size: int, name: str, toml: str = "") -> list[subprocess.Popen]:
    """A gateway on 127.0.0.1:`port` and one stand-in worker of `vocab_size` on an ipc endpoint in `folder`,
    which holds the tokenizer.json the gateway reads; the stand-in's manifest and the config (gw.toml) are
    written beside it, `toml` adding [gateway] keys and any tables after them. The processes' output goes to
    gateway.log and worker.log there. [gateway, worker]: the caller stops them."""
    endpoint = f"ipc://{folder}/worker"
    (folder / "manifest.json").write_bytes(manifest_json(standin_manifest(vocab_size)))
    (folder / "gw.toml").write_text(f'name = "{name}"\n[worker]\nendpoints = ["{endpoint}"]\ndevices = ["cpu"]\n'
                                    f"[gateway]\nport = {port}\naccess_log = false\n{toml}")
    worker = spawn([sys.executable, "-m", "loadgen.standin_worker", "--endpoint", endpoint, "--vocab-size",
                    str(vocab_size)], folder / "worker.log", cwd=ROOT, group=False)
    gateway = spawn([sys.executable, "-m", "gateway", "--config", str(folder / "gw.toml"), "--artifacts", str(folder)],
                    folder / "gateway.log", cwd=ROOT, group=False)
    return [gateway, worker]


def deployment_toml(config: DeploymentConfig) -> str:
    """A DeploymentConfig as TOML text that shared.config.load_config reads back unchanged (unset
    optional keys left out)."""
    return config_toml(_without_none(msgspec.to_builtins(config)))


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    return value



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


@dataclass(frozen=True)
class Pinning:
    """Which CPUs the workers run on, and which the gateways (and the client driving them)."""

    worker_cpus: frozenset[int]
    gateway_cpus: frozenset[int]

    @classmethod
    def split(cls, workers: int = 1) -> Pinning | None:
        """The last `workers` CPUs this process may use for the workers (one each), the rest for the
        gateways and the client; None when that leaves the gateways none."""
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) <= workers:
            return None
        return cls(frozenset(cpus[-workers:]), frozenset(cpus[:-workers]))

    def pin_caller(self) -> None:
        """Confine the calling process (the client) to the gateways' CPUs."""
        os.sched_setaffinity(0, self.gateway_cpus)

    def to_json(self) -> dict[str, list[int]]:
        return {"worker_cpus": sorted(self.worker_cpus), "gateway_and_client_cpus": sorted(self.gateway_cpus)}


class SharedWorkers:
    """The config's workers, each a `python -m worker` process of its own (on the worker CPUs)."""

    def __init__(self, config_path: str | Path, artifacts: str | Path, folder: str | Path,
                 pinning: Pinning | None = None, startup_timeout_s: float = 300.0) -> None:
        self.folder = Path(folder)
        self.artifacts = Path(artifacts)
        self.pinning = pinning
        self.startup_timeout_s = startup_timeout_s
        self.raw_config = local_config(tomllib.loads(Path(config_path).read_text()), self.folder, 0)
        self.config_path = self.folder / "workers.toml"
        self.processes: list[subprocess.Popen] = []

    @property
    def count(self) -> int:
        return len(self.raw_config["worker"]["endpoints"])

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def start(self) -> SharedWorkers:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(config_toml(self.raw_config))
        cpus = self.pinning.worker_cpus if self.pinning else None
        for index in range(self.count):
            log_path = self.log_path(index)
            log_path.write_bytes(b"")
            self.processes.append(spawn([sys.executable, "-m", "worker", "--config", str(self.config_path),
                                         "--artifacts", str(self.artifacts), "--index", str(index),
                                         "--profile-cache", "none"], log_path, cpus))
        return self

    def log_path(self, index: int) -> Path:
        """Where worker `index` writes its log (its JSON event lines)."""
        return self.folder / f"worker-{index}.log"

    def stop(self) -> None:
        for process in self.processes:
            stop(process, 30.0)
        self.processes = []

    def __enter__(self) -> SharedWorkers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class GatewayProcess:
    """One `python -m gateway` on the shared workers, with its own [gateway] settings (`knobs`)."""

    def __init__(self, workers: SharedWorkers, name: str, knobs: dict[str, Any]) -> None:
        self.workers = workers
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        raw = apply_knobs(workers.raw_config, knobs)
        raw["gateway"] = {**raw["gateway"], "port": self.port}
        self.config_path = workers.folder / f"gateway-{name}.toml"
        self.log_path = workers.folder / f"gateway-{name}.log"
        self.config_text = config_toml(raw)
        self._process: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self._process is not None, "the gateway is not running"
        return self._process.pid

    def start(self) -> GatewayProcess:
        self.config_path.write_text(self.config_text)
        cpus = self.workers.pinning.gateway_cpus if self.workers.pinning else None
        self.log_path.write_bytes(b"")
        self._process = spawn([sys.executable, "-m", "gateway", "--config", str(self.config_path),
                               "--artifacts", str(self.workers.artifacts)], self.log_path, cpus)
        return self

    async def ready(self) -> None:
        """Until /readyz says every worker is ready (they profile before they serve: minutes on a busy machine)."""
        end = time.monotonic() + self.workers.startup_timeout_s
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
            while time.monotonic() < end:
                if self._process is None or self._process.poll() is not None:
                    raise RuntimeError(f"gateway {self.name} exited; its log:\n{self.log_tail()}")
                if _all_ready(await _readyz(session, self.url), self.workers.count):
                    return
                await asyncio.sleep(0.2)
        raise TimeoutError(f"gateway {self.name} had not every worker ready after "
                           f"{self.workers.startup_timeout_s:.0f} s; its log:\n{self.log_tail()}\n"
                           f"workers' logs in {self.workers.folder}")

    def stop(self) -> None:
        if self._process is not None:
            stop(self._process, 30.0)
            self._process = None

    def log_tail(self, chars: int = 3000) -> str:
        return tail(self.log_path, chars)


async def _readyz(session: aiohttp.ClientSession, url: str) -> dict | None:
    try:
        async with session.get(url + "/readyz") as response:
            return json.loads(await response.read()) if response.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError):
        return None


def _all_ready(answer: dict | None, workers: int) -> bool:
    states = [w.get("state") for w in (answer or {}).get("workers", [])]
    return len(states) == workers and all(state == "ready" for state in states)
