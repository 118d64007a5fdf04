"""The torch CPU thread count a job uses when none is given.

torch's own default is one OpenMP thread per core. On a machine where another job already holds
a core, that team's threads take turns on the free cores and every parallel region waits for the
descheduled one: generation slows by far more than the lost core (benchmarks/thread_default.py,
docs/results.md). So the default counts the cores that are idle now and uses that many, never
fewer than one, and a long job checks again between steps (:class:`AdaptiveThreads`): another
job that starts or ends later moves it to the cores that are free.
"""

from __future__ import annotations

import os
import time

import torch


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


def _own_cpu_s() -> float:
    t = os.times()  # every thread of this process (OpenMP workers still spinning after a region)
    return t.user + t.system


def busy_cores(window_s: float = 0.3) -> float:
    """How many cores other processes keep busy, sampled over ``window_s`` (this process's own
    CPU time taken out; the 1-minute load average where /proc/stat is missing)."""
    a, own = _cpu_times(), _own_cpu_s()
    if a is None:
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    t0 = time.perf_counter()
    time.sleep(window_s)
    b, own = _cpu_times(), _own_cpu_s() - own
    wall = time.perf_counter() - t0  # > 0: it includes the sleep
    if b is None or b[1] <= a[1]:
        return 0.0
    busy = (b[0] - a[0]) / (b[1] - a[1]) * (os.cpu_count() or 1)
    return max(0.0, busy - own / wall)


def default_threads(window_s: float = 0.3) -> int:
    """One thread per idle core (at least one, at most the cores this process may run on)."""
    cores = usable_cores()
    return max(1, min(cores, int(cores - busy_cores(window_s) + 0.5)))


def _several_ranks() -> bool:
    """Launched as one of several processes: they share the cores, the launcher's count stands."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def apply_threads(threads: int | None, log=None) -> int:
    """Set torch's thread count: ``threads`` when given, else :func:`default_threads`; returns it."""
    if not threads and _several_ranks():
        return torch.get_num_threads()
    n = threads or default_threads()
    torch.set_num_threads(n)
    if log is not None and not threads:
        log(f"torch threads: {n} (idle cores of {usable_cores()}; set threads / --threads to choose)")
    return n


class AdaptiveThreads:
    """The thread default of a long job, checked again every ``every_s`` seconds at a step boundary
    (:meth:`check`); a fixed ``threads`` is never changed."""

    def __init__(self, threads: int | None, log=None, every_s: float = 60.0, window_s: float = 0.2):
        self.fixed, self.log, self.every_s, self.window_s = threads, log, every_s, window_s
        self.current = apply_threads(threads, log)
        self._last = time.perf_counter()

    def check(self) -> int:
        if self.fixed or _several_ranks():
            return self.current
        if time.perf_counter() - self._last < self.every_s:
            return self.current
        n = default_threads(self.window_s)
        self._last = time.perf_counter()
        if n != self.current:
            torch.set_num_threads(n)
            if self.log is not None:
                self.log(f"torch threads: {self.current} -> {n} (idle cores changed)")
            self.current = n
        return n
