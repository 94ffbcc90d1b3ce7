"""A CPU worker's resident set, held under a limit: after a batch, when the process holds more than
`[worker] resident_limit_mb`, the C heap's free pages go back to the kernel.

A CPU worker keeps freed memory for its next calls (worker/runtime/allocator.keep_freed_memory), which spares
every call from faulting its buffers in again but lets the heap fragment as batch shapes vary, up to
gigabytes more than any call needs (measured in worker/runtime/allocator.py). Releasing the free pages bounds
that; its cost is the faults of the calls after it, so it happens only past the limit. When what the
process holds in use is near or over the limit, releasing cannot keep it under: the next release then
comes only a quarter above what the last one left (or at the limit, whichever is higher), so that a
worker does not release, and fault its buffers in again, after every batch. The limit is a point at
which to act, not a cap: nothing stops a call from allocating past it.
"""

from __future__ import annotations

from pathlib import Path

from worker.runtime.allocator import proc_kib, release_free_memory, resident_bytes
from shared.logs import EventLog

DEFAULT_SHARE = 0.8  # of the memory the process may use, when resident_limit_mb is not set
MIB = 2**20
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # v2, v1


def memory_available_to_process(meminfo: str = "/proc/meminfo", cgroup_limits=CGROUP_LIMITS) -> int | None:
    """The memory this process may use: its cgroup's limit where one is set below the machine's memory,
    else the machine's (MemTotal); None where neither can be read."""
    kib = proc_kib("MemTotal", path=meminfo)
    total = kib[0] * 1024 if kib else None
    for path in cgroup_limits:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (v2) is no limit
            return min(int(text), total) if total else int(text)
    return total


def resident_limit(limit_mb: int | None) -> int | None:
    """The limit in bytes: `limit_mb` where set, else DEFAULT_SHARE of the memory available to the process;
    None (no limit) where that cannot be read or limit_mb is 0."""
    if limit_mb is not None:
        return limit_mb * MIB or None
    available = memory_available_to_process()
    return int(DEFAULT_SHARE * available) if available else None


class ResidentLimit:
    """Called after each batch (worker/compute.py): releases the heap's free pages when the resident set
    is over the limit, and logs `memory_released` with the resident set before and after."""

    def __init__(self, limit: int, log: EventLog) -> None:
        self.limit = self.threshold = limit
        self.log = log

    def after_batch(self) -> bool:
        """True when it released memory."""
        before = resident_bytes()
        if before is None or before <= self.threshold:
            return False
        released = release_free_memory()
        after = resident_bytes() or before
        self.threshold = max(self.limit, after + after // 4)
        self.log.info("memory_released", resident_mb_before=before // MIB, resident_mb_after=after // MIB,
                      limit_mb=self.limit // MIB, next_release_above_mb=self.threshold // MIB, released=released)
        return True
