"""The C allocator of a process that runs CPU packages: keep freed memory for the next call.

A compiled node allocates its intermediate buffers as it runs and frees them before it returns
(AOTInductor plans buffer reuse within a call, never across calls; a CPU tensor is a plain
malloc). With glibc's defaults every block above the mmap threshold (32 MiB at most) gets a
mapping of its own, unmapped on free; a thread other than the main one allocates from an arena of
64 MiB heaps, each unmapped when it empties; and a free heap top goes back to the kernel. So each
call faults its working set in again, page by page, every page zeroed by the kernel first.

`keep_freed_memory` serves every block from the main heap (no mmap, one arena for all threads) and
never trims it. Measured on the scoring node (24 layers, Qwen2.5-0.5B shapes, bf16, a request of 15
samples / 4,285 tokens, 2 threads, called from a thread as a worker's lane does): 692,557 minor
faults per call (about 2.7 GiB of fresh pages) with the defaults; 0 once the heap has grown to the
largest call's working set (two calls), the process then holding 2.49 GiB resident against 2.20
GiB. `bench/node_ab.py` reports faults per call for both sides.

The cost: the process keeps its largest call's buffers resident between calls, which a serving
process wants anyway, and all its threads share one arena's lock (a node's kernels do not
allocate per element). Only glibc has these settings; elsewhere the allocator is left as it is
and `keep_freed_memory` says so. Call it before the threads that call packages allocate: a thread
keeps the arena it first allocated from.

A heap that is never trimmed can also come to hold much more than the largest call needs. Blocks that
are allocated during a call and outlive it, such as the entries of oneDNN's caches (a primitive for each
new shape of a GEMM, about 0.45 MiB for a bf16 GEMM of Qwen2.5-0.5B's shapes, up to 1,024 of them;
PyTorch's ideep keeps another, its size set by LRU_CACHE_CAPACITY), land between the call's large
buffers; when those are freed the holes cannot merge, and a later call larger than each hole grows the
heap instead. Measured on the 24-layer bf16 beam node of Qwen2.5-0.5B's shapes, one 8-token prompt per
call: with widths 4, 5, 6, ... in turn the resident set rose 10.1 GiB over 250 calls while the blocks in
use rose 0.75 GiB; with widths drawn at random from 4-100 it rose 1.14 GiB over 200 calls, the blocks in
use 0.49 GiB; with both caches kept to nothing the first 100 widths in turn left the blocks in use as
they were and raised the resident set 0.38 GiB, against 2.2-2.3 GiB, but took 91 s against 60-66.
`release_free_memory` hands every free page back to the kernel, wherever it lies in the heap (after 100
widths in turn: from 2.28 to 0.77 GiB above the start, in 121 ms; the next call took 38,184 faults
against some 9,000 before). A CPU worker calls it when its resident set passes a limit
(worker/memory.py).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1  # free heap top above this is returned to the kernel
M_MMAP_MAX = -4  # how many blocks may be served by mmap at once; 0: none, every block comes from the heap
M_ARENA_MAX = -8  # how many arenas threads may spread over; 1: every thread allocates from the main heap
KEEP = 2**31 - 1  # the largest value mallopt takes (a C int): a heap top is trimmed only above 2 GiB


def _libc():
    """The process's C library, or None where ctypes cannot open it."""
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Serve every block from the main heap and keep freed memory there; True when the allocator took
    it (glibc), False when this C library has no such settings. Process-wide; call before serving."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(parameter, value) == 1
               for parameter, value in ((M_MMAP_MAX, 0), (M_ARENA_MAX, 1), (M_TRIM_THRESHOLD, KEEP)))


def release_free_memory() -> bool:
    """Hand the C heap's free pages back to the kernel (glibc's malloc_trim(0)), the holes between blocks
    in use as well as the free top: True when some were, False when none were or this C library has no
    malloc_trim. A call that reuses those pages faults them in again."""
    malloc_trim = getattr(_libc(), "malloc_trim", None)
    if malloc_trim is None:
        return False
    malloc_trim.argtypes, malloc_trim.restype = (ctypes.c_size_t,), ctypes.c_int
    return malloc_trim(0) == 1


class _MallInfo2(ctypes.Structure):
    """glibc's struct mallinfo2 (malloc.h)."""

    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def free_top_bytes() -> int | None:
    """The size of the main heap's free top (glibc's mallinfo2 keepcost): what a heap that keeps freed
    memory can hand out again without growing; None where this C library has no mallinfo2."""
    mallinfo2 = getattr(_libc(), "mallinfo2", None)
    if mallinfo2 is None:
        return None
    mallinfo2.argtypes, mallinfo2.restype = (), _MallInfo2
    return mallinfo2().keepcost


def proc_kib(*keys: str, path: str = "/proc/self/status") -> list[int] | None:
    """The values of `keys` in a Linux /proc file of "Key: value kB" lines (status, meminfo), in KiB; None
    where the file or a key cannot be read."""
    try:
        fields = dict(line.split(":", 1) for line in Path(path).read_text().splitlines() if ":" in line)
        return [int(fields[key].split()[0]) for key in keys]
    except (OSError, KeyError, ValueError, IndexError):
        return None


def resident_bytes() -> int | None:
    """This process's resident set in bytes (Linux's /proc/self/statm), None where it cannot be read."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
