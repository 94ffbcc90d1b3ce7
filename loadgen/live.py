"""Live tuning: start a gateway per candidate setting, replay a trace window, stop it.

The contract with the user's command template (`--gateway-cmd`):
  - `{config}` in the template is replaced by the path of a TOML file: the base config (`--config`)
    with the candidate's [gateway] settings written over it, and [gateway].host/port set from --url.
    `{port}` is replaced by the port. Example:
      --gateway-cmd "python -m gateway --config {config} --artifacts artifacts/demo --spawn-workers"
  - The command must start a server answering HTTP on --url; it is ready when GET {url}/readyz
    answers 200 (or 404: a server without that route is ready once it answers), within
    --startup-timeout-s.
  - It is stopped with SIGTERM to its process group (then SIGKILL after --stop-timeout-s), so every
    child it spawned (workers) goes with it.
Only [gateway] settings can be tuned live; bounds and worker counts need new artifacts or hosts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
import subprocess
import tempfile
import time
import tomllib
from dataclasses import dataclass
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiohttp

from loadgen.bodies import BodyFactory
from loadgen.processes import stop, tail
from loadgen.replayer import ReplayOptions, run_replay
from loadgen.result import RequestResult
from loadgen.trace import Trace
from loadgen.tuner import GATEWAY_KEYS, apply_knobs, config_toml


@dataclass(frozen=True)
class LiveOptions:
    """How to start, reach and stop the gateway for each candidate."""

    command_template: str
    base_config: str | None = None
    url: str = "http://127.0.0.1:8000"
    startup_timeout_s: float = 60.0
    stop_timeout_s: float = 10.0
    warmup_s: float = 0.0
    """Seconds of the trace replayed (and discarded) after each start, before the measured replay."""
    log_dir: str | None = None


class LiveEvaluator:
    """Callable for loadgen.tuner.tune: candidate knobs -> results of a live replay."""

    def __init__(self, trace: Trace, bodies: BodyFactory, options: LiveOptions, replay_options: ReplayOptions) -> None:
        self.trace = trace
        self.bodies = bodies
        self.options = options
        self.replay_options = replay_options
        self.runs = 0

    def __call__(self, knobs: dict[str, Any]) -> list[RequestResult]:
        unknown = sorted(set(knobs) - set(GATEWAY_KEYS))
        if unknown:
            raise ValueError(f"live tuning can only change [gateway] settings {GATEWAY_KEYS}; got {unknown}")
        self.runs += 1
        with tempfile.TemporaryDirectory(prefix="loadgen-live-") as workdir:
            config_path = Path(workdir) / "gateway.toml"
            config_path.write_text(candidate_config(self.options.base_config, self.options.url, knobs))
            log_path = Path(self.options.log_dir or workdir) / f"gateway-{self.runs}.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "wb") as log:
                process = self._start(config_path, log)
                try:
                    asyncio.run(wait_ready(self.options.url, self.options.startup_timeout_s, (process,)))
                    if self.options.warmup_s > 0:
                        run_replay(self.trace.window(0.0, self.options.warmup_s * 1000.0), self.bodies,
                                   dataclasses.replace(self.replay_options, progress=False))
                    return run_replay(self.trace, self.bodies, self.replay_options).results
                except (RuntimeError, TimeoutError) as exc:
                    raise RuntimeError(f"{exc}; candidate {knobs}; gateway output:\n{tail(log_path, 2000)}") from None
                finally:
                    stop(process, self.options.stop_timeout_s)

    def _start(self, config_path: Path, log) -> subprocess.Popen:
        port = urlparse(self.options.url).port or 80
        command = self.options.command_template.format(config=config_path, port=port)
        return subprocess.Popen(shlex.split(command), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def candidate_config(base_config: str | None, url: str, knobs: dict[str, Any]) -> str:
    """TOML text: the base config with [gateway] host/port from the URL and the knobs written over."""
    raw: dict[str, Any] = tomllib.loads(Path(base_config).read_text()) if base_config else {}
    parsed = urlparse(url)
    raw = apply_knobs(raw, knobs)
    raw["gateway"] = {**raw.get("gateway", {}), "host": parsed.hostname or "127.0.0.1", "port": parsed.port or 80}
    return config_toml(raw)


async def wait_ready(url: str, timeout_s: float, processes: Sequence[subprocess.Popen] = ()) -> None:
    """Poll GET {url}/readyz until it answers 200 (a server without /readyz, answering 404, counts
    as ready once it answers at all); fail early if one of `processes` (the gateway's command, its
    workers) died. The one wait-ready of the project: stacks, benchmarks and tests all call it."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
        while time.monotonic() < deadline:
            for process in processes:
                if process.poll() is not None:
                    raise RuntimeError(f"{' '.join(map(str, process.args[:4]))} exited with status "
                                       f"{process.returncode} before {url} was ready")
            try:
                async with session.get(url.rstrip("/") + "/readyz") as response:
                    await response.read()
                    if response.status in (200, 404):
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError(f"gateway at {url} not ready after {timeout_s:.0f} s")
