"""Hand the memory torch has freed back to the operating system between phases of a job.

On glibc, the CPU tensors of a rollout or an update are freed into the C heap, which keeps them
resident: tensors of ever-new sizes (each step's sequences differ) fragment the heap, so the
process's resident memory grows step after step although the live tensors do not
(docs/results.md, issue #43). ``malloc_trim(0)`` returns the free pages of every arena to the
system; it costs a walk over the heap, nothing on the allocation path. Elsewhere (musl, macOS,
Windows) it is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def release_freed_memory() -> bool:
    """Return the heap's free pages to the system; True if the C library could (glibc)."""
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
