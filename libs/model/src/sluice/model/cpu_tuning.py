"""Process-wide tuning for serving on CPU, applied once at start-up.

glibc serves allocations above M_MMAP_THRESHOLD (128 KiB at first, adapting
up to 32 MiB) with a fresh mmap and returns freed heap tops above
M_TRIM_THRESHOLD to the OS. A decode step allocates and frees several MB-sized
activations (K/V gathers, logits, MLP intermediates) every layer, so each step
page-faults fresh zeroed pages for them: measured on the tiny model, that
doubled the KV gather time and slowed the GEMMs. Raising both thresholds to
1 GiB keeps those buffers in the heap, reused from step to step; the price is
that the process keeps its peak heap instead of returning it to the OS, which
a replica that runs one model for its whole life wants anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Large enough that no per-step tensor of a CPU-served model crosses it.
KEEP_IN_HEAP_BYTES = 1 << 30


def tune_cpu_allocator(keep_in_heap_bytes: int = KEEP_IN_HEAP_BYTES) -> bool:
    """Keep freed buffers up to ``keep_in_heap_bytes`` in glibc's heap.

    Returns False (and changes nothing) where the C library is not glibc.
    Affects the whole process, so call it from a program's main, never from
    a library import.
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl, macOS: no mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, keep_in_heap_bytes)) and bool(
        mallopt(_M_TRIM_THRESHOLD, keep_in_heap_bytes)
    )
    if not ok:
        log.warning("mallopt refused the CPU allocator tuning")
    return ok
