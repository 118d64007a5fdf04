"""Keep the C heap from holding memory torch has freed (glibc; a no-op elsewhere).

glibc serves a freed CPU tensor's memory from its heap, and raises its mmap threshold (up to
32 MB) each time a large mmapped block is freed, so after the first steps every activation, KV
cache and logits buffer comes from the heap too. Tensors of ever-new sizes (each step's sequences
differ) then fragment it: the process's resident memory grew by about half a GiB a GRPO step
although the live tensors did not (docs/results.md, issue #43). Two levers, both here:

* :func:`release_freed_memory` (``malloc_trim``) between phases returns the free pages of every
  arena to the system: resident memory after a step stops growing; it costs one walk of the heap.
* :func:`cap_heap_blocks` fixes the mmap threshold, so blocks at least that large are mapped and
  unmapped on their own and never fragment the heap: the peak within a step stops growing too,
  at the price of fresh (zeroed) pages for each large tensor.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
DEFAULT_MMAP_THRESHOLD = 4 << 20  # a job's default (TrainConfig.mmap_threshold_kib): docs/results.md


@functools.cache
def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim, mallopt = libc.malloc_trim, libc.mallopt
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return trim, mallopt


def release_freed_memory() -> bool:
    """Return the heap's free pages to the system; True if the C library could (glibc)."""
    fns = _libc()
    if fns is None:
        return False
    fns[0](0)
    return True


def cap_heap_blocks(threshold_bytes: int | None) -> bool:
    """Blocks of ``threshold_bytes`` or more are mapped on their own (glibc's ``M_MMAP_THRESHOLD``,
    which also stops its dynamic raising); None leaves glibc's default. True if it was set."""
    if threshold_bytes is None:
        return False
    if not 0 < threshold_bytes <= 32 * 2**20:
        raise ValueError(f"mmap threshold must be in (0, 32 MiB], got {threshold_bytes}")
    fns = _libc()
    return fns is not None and bool(fns[1](M_MMAP_THRESHOLD, int(threshold_bytes)))
