"""The supervisor with real child processes: an exit is reported and restarted at once, a process the
pool reports stuck is killed (and so restarted), a restart takes the standby when one waits, and
stop ends everything it started."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
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


@dataclasses.dataclass(frozen=True)
class SleeperWithStandby(Sleeper):
    """Its standby writes the assignment it reads on stdin to `record`, then sleeps as a worker would."""

    record: str = ""

    def standby_argv(self) -> list[str]:
        return [sys.executable, "-c", "import signal, sys, time\n"
                "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
                "line = sys.stdin.readline()\n"
                "if not line: sys.exit(0)\n"
                f"open({self.record!r}, 'w').write(line)\n"
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


async def test_a_restart_takes_the_waiting_standby_and_a_new_one_is_prepared(tmp_path):
    record = tmp_path / "assignment.json"
    worker = SleeperWithStandby("unused.toml", "unused", "ipc:///tmp/boundserve-standby-test", "cpu", 3,
                                str(record))
    exits: list[str] = []
    # "ready" as the pool would say: the process is up (a standby is prepared only behind a ready worker)
    supervisor = Supervisor([worker], lambda endpoint, why: exits.append(why),
                            ready_pid=lambda endpoint: supervisor.pid(endpoint) or 0, standby=True)
    standby = supervisor._standby
    supervisor.start()
    try:
        await until(lambda: supervisor.pid(worker.endpoint) is not None and standby.process is not None,
                    what="a worker and a standby behind it")
        first, spare = supervisor.pid(worker.endpoint), standby.process.pid
        os.kill(first, signal.SIGKILL)
        await until(lambda: supervisor.pid(worker.endpoint) == spare, what="the standby taking over")
        await until(lambda: record.exists() and record.read_text().endswith("\n"), what="the assignment read")
        assert json.loads(record.read_text()) == {"endpoint": worker.endpoint, "device": "cpu", "index": 3}
        assert exits == [f"worker process {first} exited with signal SIGKILL"]
        await until(lambda: standby.process is not None and standby.process.pid != spare, what="a new standby")
    finally:
        await supervisor.stop(timeout_s=10)
    assert supervisor.pid(worker.endpoint) is None
