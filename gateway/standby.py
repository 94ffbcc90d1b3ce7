"""A spare worker process for fast restarts: started ahead, its imports done, no model loaded.

`python -m worker --standby` imports torch and the runtime and probes the CPU (the first seconds of
any worker start), then blocks reading one line from stdin. When a supervised worker dies, the
supervisor writes that worker's endpoint, device and index to the spare, which loads the artifacts
and serves in well under a second; a new spare is prepared once the replacement is ready (so the two
never compete for the CPU). A spare holds nothing, so one that is not needed is simply killed.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("gateway.supervisor")


class Standby:
    """At most one waiting spare; `take` hands it a worker's assignment."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.process: asyncio.subprocess.Process | None = None
        self._preparing = False
        self._closed = False

    async def prepare(self) -> None:
        """Start a spare unless one waits or is being started; a failure only costs the fast path."""
        if self._closed or self._preparing or (self.process is not None and self.process.returncode is None):
            return
        self._preparing = True
        try:
            process = await asyncio.create_subprocess_exec(*self.argv, stdin=asyncio.subprocess.PIPE)
        except OSError as exc:
            log.warning("could not start a standby worker: %s", exc)
            return
        finally:
            self._preparing = False
        self.process = process
        if self._closed:  # closed while it started
            self.close()

    async def take(self, assignment: bytes) -> asyncio.subprocess.Process | None:
        """The spare, now assigned (it becomes that worker), or None when no live spare waits."""
        process, self.process = self.process, None
        if process is None or process.returncode is not None or process.stdin is None:
            return None
        try:
            process.stdin.write(assignment)
            await process.stdin.drain()
            process.stdin.close()
        except (ConnectionError, OSError) as exc:
            log.warning("the standby worker (pid %d) could not be assigned: %s", process.pid, exc)
            process.kill()
            return None
        return process

    def close(self) -> asyncio.subprocess.Process | None:
        """Kill the waiting spare (it may still be importing); returns it for the caller to reap."""
        self._closed = True
        process, self.process = self.process, None
        if process is not None and process.returncode is None:
            process.kill()
        return process
