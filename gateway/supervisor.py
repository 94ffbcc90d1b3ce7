"""Starts the deployment's worker processes and keeps them running (restart with back-off).

A worker that exits is reported to the pool at once (its in-flight requests fail with 503
worker_lost) and restarted: at once when it had served (or stayed up a while), after a back-off that
doubles on each crash before serving. With `standby`, a spare process waits with its imports done
(gateway/standby.py) and a restart hands it the worker's endpoint. A worker whose process runs but
that the pool reports stuck (stalled in a call, or unreachable though alive, e.g. SIGSTOP) is
killed with SIGKILL and so restarted. Nothing here ends silently: a failed start is logged and
retried.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass

from gateway.standby import Standby

log = logging.getLogger("gateway.supervisor")
FIRST_BACKOFF_S, MAX_BACKOFF_S, STABLE_S = 0.5, 15.0, 30.0
STUCK_CHECK_S = 0.25
READY_POLL_S = 0.05


@dataclass(frozen=True)
class WorkerSpec:
    """How to start one worker process."""

    config_path: str
    artifacts: str
    endpoint: str
    device: str
    index: int

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "worker", "--config", self.config_path, "--artifacts", self.artifacts,
                "--endpoint", self.endpoint, "--device", self.device, "--index", str(self.index)]

    def standby_argv(self) -> list[str]:
        return [sys.executable, "-m", "worker", "--config", self.config_path, "--artifacts", self.artifacts,
                "--standby"]

    def assignment(self) -> bytes:
        """What a standby reads on stdin to become this worker."""
        return json.dumps({"endpoint": self.endpoint, "device": self.device, "index": self.index}).encode() + b"\n"


class Supervisor:
    """Owns the worker processes: start, watch, restart, and stop them (SIGTERM, then SIGKILL).

    `ready_pid(endpoint)`: the pid of the worker the pool has ready there now, else 0;
    `stuck_pid(endpoint)`: the pid of a worker the pool reports stuck there, else None."""

    def __init__(self, specs: list[WorkerSpec], on_exit: Callable[[str, str], None],
                 stuck_pid: Callable[[str], int | None] = lambda endpoint: None,
                 ready_pid: Callable[[str], int] = lambda endpoint: 0, standby: bool = False) -> None:
        self.specs = specs
        self.restarts = {spec.endpoint: 0 for spec in specs}
        self._on_exit = on_exit
        self._stuck_pid = stuck_pid
        self._ready_pid = ready_pid
        self._standby = Standby(specs[0].standby_argv()) if standby and specs else None
        self._processes: dict[str, asyncio.subprocess.Process] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._keep(spec), name=f"supervise {spec.endpoint}") for spec in self.specs]
        self._tasks.append(asyncio.create_task(self._kill_stuck(), name="stuck workers"))
        for task in self._tasks:
            task.add_done_callback(self._ended)

    def pid(self, endpoint: str) -> int | None:
        process = self._processes.get(endpoint)
        return process.pid if process is not None and process.returncode is None else None

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not (self._stopping or task.cancelled()):  # the loops below catch everything: a bug
            log.error("supervisor task %r ended: %r; its workers are no longer restarted", task.get_name(),
                      task.exception(), exc_info=task.exception())

    async def _keep(self, spec: WorkerSpec) -> None:
        backoff = 0.0
        loop = asyncio.get_running_loop()
        while not self._stopping:
            started = loop.time()
            try:
                why, served = await self._run_once(spec)
            except Exception as exc:  # e.g. fork failed (out of memory): log and try again
                log.exception("could not run worker %s", spec.endpoint)
                why, served = f"its process could not be started: {type(exc).__name__}: {exc}", False
            if self._stopping:
                return
            backoff = 0.0 if served or loop.time() - started > STABLE_S else backoff  # not a crash loop
            log.warning("%s; restarting in %.1f s", why, backoff)
            self._on_exit(spec.endpoint, why)
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF_S, max(FIRST_BACKOFF_S, backoff * 2))
            self.restarts[spec.endpoint] += 1

    async def _run_once(self, spec: WorkerSpec) -> tuple[str, bool]:
        """Start the worker (the standby when one waits), wait for it to exit: (what happened, had it served)."""
        process = await self._standby.take(spec.assignment()) if self._standby is not None else None
        how = "new" if process is None else "from the standby"
        if process is None:
            process = await asyncio.create_subprocess_exec(*spec.argv())
        self._processes[spec.endpoint] = process
        log.info("started worker %s (pid %d, %s)", spec.endpoint, process.pid, how)
        watch = asyncio.create_task(self._until_ready(spec.endpoint, process.pid))
        code = await process.wait()
        watch.cancel()
        served = watch.done() and not watch.cancelled() and watch.result()
        return f"worker process {process.pid} exited with {_describe(code)}", served

    async def _until_ready(self, endpoint: str, pid: int) -> bool:
        """True once the pool has this process ready; then (not before: they would share the CPU)
        a standby is prepared for the next restart."""
        while self._ready_pid(endpoint) != pid:
            await asyncio.sleep(READY_POLL_S)
        if self._standby is not None and not self._stopping:
            self._tasks.append(asyncio.create_task(self._standby.prepare(), name="standby worker"))
        return True

    async def _kill_stuck(self) -> None:
        """SIGKILL a worker the pool reports stuck while its process runs (its exit restarts it)."""
        while not self._stopping:
            await asyncio.sleep(STUCK_CHECK_S)
            for endpoint, process in list(self._processes.items()):
                try:
                    stuck = self._stuck_pid(endpoint)
                    if stuck is not None and stuck == process.pid and process.returncode is None:
                        log.warning("worker %s (pid %d) runs but does not answer; killing it to restart it",
                                    endpoint, process.pid)
                        process.kill()
                except Exception:  # one worker's check must not stop the others'
                    log.exception("checking worker %s for a stall failed", endpoint)

    async def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM every worker (they drain and exit 0), SIGKILL what is left after `timeout_s`."""
        self._stopping = True
        for process in self._processes.values():
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        spare = self._standby.close() if self._standby is not None else None
        processes = list(self._processes.values()) + ([spare] if spare is not None else [])
        waits = [p.wait() for p in processes if p.returncode is None]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout_s)
        except TimeoutError:
            for process in processes:
                if process.returncode is None:
                    log.warning("worker pid %d did not stop in %.0f s; killing it", process.pid, timeout_s)
                    process.kill()
            await asyncio.gather(*(p.wait() for p in processes), return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
