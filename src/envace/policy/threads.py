"""The torch CPU thread count a job uses when none is given.

torch's own default is one OpenMP thread per core. On a machine where another job already holds
a core, that team's threads take turns on the free cores and every parallel region waits for the
descheduled one: generation slows by far more than the lost core (benchmarks/thread_default.py,
docs/results.md). So the default counts the cores that are idle now and uses that many, never
fewer than one.
"""

from __future__ import annotations

import os
import time


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu_times() -> tuple[float, float] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat (Linux), or None."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 4:
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def busy_cores(window_s: float = 0.3) -> float:
    """How many cores other work keeps busy, sampled over ``window_s`` (the 1-minute load average
    where /proc/stat is missing)."""
    a = _cpu_times()
    if a is None:
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    time.sleep(window_s)
    b = _cpu_times()
    if b is None or b[1] <= a[1]:
        return 0.0
    return (b[0] - a[0]) / (b[1] - a[1]) * (os.cpu_count() or 1)


def default_threads(window_s: float = 0.3) -> int:
    """One thread per idle core (at least one, at most the cores this process may run on)."""
    cores = usable_cores()
    return max(1, min(cores, int(cores - busy_cores(window_s) + 0.5)))


def apply_threads(threads: int | None, log=None) -> int:
    """Set torch's thread count: ``threads`` when given, else :func:`default_threads`; returns it."""
    import torch

    if not threads and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return torch.get_num_threads()  # several ranks share the cores: the launcher's choice stands
    n = threads or default_threads()
    torch.set_num_threads(n)
    if log is not None and not threads:
        log(f"torch threads: {n} (idle cores of {usable_cores()}; set threads / --threads to choose)")
    return n
