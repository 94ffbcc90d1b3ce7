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
"""

from __future__ import annotations

import ctypes

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1  # free heap top above this is returned to the kernel
M_MMAP_MAX = -4  # how many blocks may be served by mmap at once; 0: none, every block comes from the heap
M_ARENA_MAX = -8  # how many arenas threads may spread over; 1: every thread allocates from the main heap
KEEP = 2**31 - 1  # the largest value mallopt takes (a C int): a heap top is trimmed only above 2 GiB


def keep_freed_memory() -> bool:
    """Serve every block from the main heap and keep freed memory there; True when the allocator took
    it (glibc), False when this C library has no such settings. Process-wide; call before serving."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(parameter, value) == 1
               for parameter, value in ((M_MMAP_MAX, 0), (M_ARENA_MAX, 1), (M_TRIM_THRESHOLD, KEEP)))
