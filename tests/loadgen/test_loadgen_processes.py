"""loadgen/processes.spawn: a child it starts ends when the process that spawned it dies, even killed
outright (no gateway or worker of a killed benchmark or test left behind holding a core)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux only")

PARENT = """
import sys, time
from pathlib import Path
from loadgen.processes import spawn
child = spawn([sys.executable, "-c", "import time; time.sleep(600)"], Path(sys.argv[1]))
print(child.pid, flush=True)
time.sleep(600)
"""


def ended(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (it runs no more)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_a_spawned_child_ends_when_its_parent_is_killed(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path / "child.log")], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    child = int(parent.stdout.readline())
    try:
        assert not ended(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        end = time.monotonic() + WAIT_S
        while not ended(child):
            assert time.monotonic() < end, "the child outlived its killed parent"
            time.sleep(0.01)
    finally:
        if not ended(child):
            os.kill(child, signal.SIGKILL)
