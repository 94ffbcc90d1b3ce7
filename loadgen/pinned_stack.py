"""A local stack whose workers run on CPUs of their own, shared by several gateways.

For comparing gateway policies on one machine: the config's workers are started once as processes
of their own (`python -m worker`, profiled before they serve: no cached profile, so no background
refit and no standby spare keeps a CPU busy afterwards), and each gateway (`python -m gateway`,
no spawned workers) is started with its own [gateway] settings on a free port, all of them
connected to the same workers. With a `Pinning`, the workers are confined to their CPUs
(os.sched_setaffinity) and every gateway to the others, where the caller runs its client too
(`Pinning.pin_caller`): the gateway's refusals and the client's sends then never take CPU from
the model. Readiness is read from each gateway's GET /readyz (its declared JSON answer).
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

from loadgen.live import stop
from loadgen.stack import free_port, local_config
from loadgen.tuner import apply_knobs, config_toml


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
            with open(self.folder / f"worker-{index}.log", "wb") as log:
                self.processes.append(_start([sys.executable, "-m", "worker", "--config", str(self.config_path),
                                              "--artifacts", str(self.artifacts), "--index", str(index),
                                              "--profile-cache", "none"], log, cpus))
        return self

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
        with open(self.log_path, "wb") as log:
            self._process = _start([sys.executable, "-m", "gateway", "--config", str(self.config_path),
                                    "--artifacts", str(self.workers.artifacts)], log, cpus)
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
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


def _start(command: list[str], log, cpus: frozenset[int] | None) -> subprocess.Popen:
    """A child in its own session (stopped with its process group), confined to `cpus` from its first
    instruction on (so every thread it starts inherits them)."""
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=pin)


async def _readyz(session: aiohttp.ClientSession, url: str) -> dict | None:
    try:
        async with session.get(url + "/readyz") as response:
            return json.loads(await response.read()) if response.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError):
        return None


def _all_ready(answer: dict | None, workers: int) -> bool:
    states = [w.get("state") for w in (answer or {}).get("workers", [])]
    return len(states) == workers and all(state == "ready" for state in states)
