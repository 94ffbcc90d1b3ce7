"""Resident memory of a benchmark's calls, and whether a larger call fits in what the machine has free (Linux /proc).

A benchmark that runs several engines in one process can need more memory than the machine holds: the beam benchmark's
CTranslate2 call with 4 prompts of 256 tokens at W = 100 (24 layers, float32) rose 15.8 GiB above the process's
resident set on its own, on a 23.5 GiB machine that also held the other contenders' weights. `measured_call` times a
call and records how far the resident set rose during it; `fits` says whether a larger call is likely to fit,
scaling that rise linearly, an estimate either way: with glibc's default allocator CTranslate2's 4 prompts rose 2.5x
its single prompt's 6.2 GiB; in a kept heap its single call rose 4.5 GiB and its 2 prompts 12.3. A rise counts only
pages the call had to fault in: a call that reuses free memory an earlier call left in the heap
(worker/runtime/allocator.keep_freed_memory keeps it) rises less than it needs (a 24-layer run projected CTranslate2's 4
prompts from a single call's short rise and was killed), so measure after worker/runtime/allocator.release_free_memory
where the figure is to be trusted. Where /proc does not say, every figure is None and every call is taken to fit.
"""

from __future__ import annotations

import time
from pathlib import Path

from worker.runtime.allocator import proc_kib

GIB = 2**30
FREE_SHARE = 0.9  # of the memory available a projected call may take: the rest is the estimate's margin


def resident() -> tuple[int, int] | None:
    """(resident bytes now, the most resident since the peak was last reset), or None."""
    kib = proc_kib("VmRSS", "VmHWM")
    return None if kib is None else (kib[0] * 1024, kib[1] * 1024)


def available() -> int | None:
    """Bytes the kernel can hand out without swapping (MemAvailable), or None."""
    kib = proc_kib("MemAvailable", path="/proc/meminfo")
    return None if kib is None else kib[0] * 1024


def reset_peak() -> bool:
    """Start the process's resident peak afresh (VmHWM := VmRSS); False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def measured_call(fn) -> tuple[float, object, int | None]:
    """Call fn once: (wall seconds, what it returned, bytes its peak resident set rose above the set at its start, or
    None). Only fn is timed."""
    before = resident() if reset_peak() else None
    start = time.perf_counter()
    value = fn()
    seconds = time.perf_counter() - start
    after = resident() if before is not None else None
    return seconds, value, None if after is None else max(after[1] - before[0], 0)


def fits(rise: int | None, measured_size: int, size: int, free: int | None) -> tuple[bool, str]:
    """Whether a call of `size` prompts fits in `free` bytes (FREE_SHARE of them), projected from a call of
    `measured_size` prompts that rose `rise` bytes, and why not. Unknown figures fit."""
    if rise is None or free is None:
        return True, ""
    need = rise * size / measured_size
    if need <= FREE_SHARE * free:
        return True, ""
    return False, (f"needs about {need / GIB:.1f} GiB ({size} prompts from {measured_size}'s rise of "
                   f"{rise / GIB:.1f} GiB), {free / GIB:.1f} GiB available")
