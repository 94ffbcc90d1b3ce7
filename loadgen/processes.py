"""The processes of a local stack: started, stopped and read the same way by loadgen, bench, the deploy
checks and the tests (loadgen/stack.py builds the stacks on these)."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path


PR_SET_PDEATHSIG = 1
"""prctl(2)'s option: the signal a process gets when the thread that forked it ends."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(argv: list[str], log_path: Path, cpus: frozenset[int] | None = None, cwd: Path | None = None,
          group: bool = True) -> subprocess.Popen:
    """A child with stdout and stderr appended to `log_path`. `group`: in a session of its own, so that
    `stop` ends it with whatever it started (a gateway's spawned workers); `cpus`: confined to them from
    its first instruction on (every thread it starts inherits them)."""
    def before_exec() -> None:
        _end_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)

    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=group,
                                preexec_fn=before_exec)


def _end_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that spawned it dies (Linux's parent-death signal),
    so a benchmark or test killed outright leaves no gateway or worker behind holding a core (one was
    found serving an hour after its run was killed). The signal follows the forking *thread*: spawn from the
    thread that outlives the child (every caller here spawns from the main thread). Elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def stop(process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM (its process group when it leads one: it drains, and its children with it), then SIGKILL
    what lingers past the timeout."""
    stop_all([process], timeout_s)


def stop_all(processes: Iterable[subprocess.Popen], timeout_s: float = 30.0) -> None:
    """`stop` for several processes at once: all are asked first, then each is waited for."""
    processes = list(processes)
    for process in processes:
        _signal(process, signal.SIGTERM)
    end = time.monotonic() + timeout_s
    for process in processes:
        try:
            process.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(process, signal.SIGKILL)
            process.wait()


def _signal(process: subprocess.Popen, signum: int) -> None:
    if process.poll() is not None:
        return
    try:
        if os.getpgid(process.pid) == process.pid:  # a session leader: the group is its own
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
    except ProcessLookupError:
        pass


def tail(path: Path, chars: int = 3000) -> str:
    """The end of a log, for a failure message."""
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except OSError:
        return "<no log>"
