"""The supervisor with real child processes: an exit is reported and restarted at once, a process the
pool reports stuck is killed (and so restarted), and stop ends everything it started."""

from __future__ import annotations

import dataclasses
import sys

from gateway.supervisor import Supervisor, WorkerSpec
from tests.gateway.waiting import until


@dataclasses.dataclass(frozen=True)
class Sleeper(WorkerSpec):
    """A stand-in process: sleeps until signalled (SIGTERM ends it with code 0, as a worker's drain)."""

    def argv(self) -> list[str]:
        return [sys.executable, "-c", "import signal, sys, time\n"
                "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
                "while True: time.sleep(1)"]


def spec() -> Sleeper:
    return Sleeper("unused.toml", "unused", "ipc:///tmp/boundserve-supervisor-test", "cpu", 0)


async def test_a_stuck_process_is_killed_reported_and_restarted():
    exits: list[tuple[str, str]] = []
    stuck: set[int] = set()
    supervisor = Supervisor([spec()], lambda endpoint, why: exits.append((endpoint, why)),
                            lambda endpoint: next(iter(stuck), None))
    supervisor.start()
    try:
        await until(lambda: supervisor.pid(spec().endpoint) is not None, what="the first process")
        first = supervisor.pid(spec().endpoint)
        stuck.add(first)  # the pool says: this pid runs but does not answer
        await until(lambda: exits, what="the stuck process's exit")
        assert exits == [(spec().endpoint, f"worker process {first} exited with signal SIGKILL")]
        await until(lambda: supervisor.pid(spec().endpoint) not in (None, first), what="a new process")
        assert supervisor.restarts[spec().endpoint] == 1
    finally:
        await supervisor.stop(timeout_s=10)
    assert supervisor.pid(spec().endpoint) is None


async def test_a_process_that_cannot_start_is_reported_and_retried_not_dropped(tmp_path):
    @dataclasses.dataclass(frozen=True)
    class Missing(WorkerSpec):
        def argv(self) -> list[str]:
            return [str(tmp_path / "no-such-program")]

    exits: list[str] = []
    supervisor = Supervisor([Missing("x", "x", "ipc:///tmp/x", "cpu", 0)], lambda endpoint, why: exits.append(why))
    supervisor.start()
    try:
        await until(lambda: len(exits) >= 2, what="two reported start failures")
        assert all("could not be started" in why and "no-such-program" in why for why in exits), exits
    finally:
        await supervisor.stop(timeout_s=1)
