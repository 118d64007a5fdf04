"""Shared helpers of the performance benchmarks (issue #6): the machine header every script
prints, medians, load and peak-memory readings. Not part of the package: scripts import it as a
sibling module (``python benchmarks/<script>.py``)."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
from pathlib import Path
import resource
import statistics
import subprocess
import sys
from collections.abc import Sequence

import torch


def load1() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def loads() -> str:
    if not hasattr(os, "getloadavg"):
        return "n/a"
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def git_revision() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def set_threads(threads: int | None) -> None:
    """torch threads for the whole run (default 1: on a shared small machine one OpenMP thread
    was never clearly slower and is far less noisy; see docs/results.md)."""
    torch.set_num_threads(threads or 1)


def cpu_model() -> str:
    """The CPU's model name (bf16 and AMX figures depend on it), e.g. "Intel(R) Xeon(R) Processor"."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # not Linux
        pass
    return platform.processor() or "unknown CPU"


def print_header(title: str, args: object | None = None) -> None:
    import transformers

    print(f"== {title}")
    print(f"date        {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"machine     {cpu_model()} ({platform.machine()}) cores={os.cpu_count()} "
          f"nice={os.nice(0)} load(1/5/15)={loads()}")
    print(f"software    python {platform.python_version()}  torch {torch.__version__}  "
          f"transformers {transformers.__version__}  threads={torch.get_num_threads()}  git {git_revision()}")
    print(f"command     {' '.join([os.path.basename(sys.executable)] + sys.argv)}")
    if args is not None:
        print(f"settings    {vars(args)}")


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def spread(xs: Sequence[float]) -> str:
    """``median [min-max] (n)`` of a list of figures."""
    if not xs:
        return "n/a"
    return f"{median(xs):.3g} [{min(xs):.3g}-{max(xs):.3g}] (n={len(xs)})"


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / 2**20


def current_rss_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


_EPISODE_ARGS = {"model": str, "world": str, "tasks": int, "group_size": int, "max_turns": int}


def make_parser(doc: str | None, **defaults: object) -> argparse.ArgumentParser:
    """A script's parser with the episode options it takes (``--model``, ``--world``, ``--tasks``,
    ``--group-size``, ``--max-turns``: those given a default here)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, typ in _EPISODE_ARGS.items():
        if name in defaults:
            p.add_argument("--" + name.replace("_", "-"), type=typ, default=defaults[name])
    return p


def start(p: argparse.ArgumentParser, title: str) -> argparse.Namespace:
    """Parse (with ``--threads``, default 1), set the torch threads, print the machine header."""
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    set_threads(args.threads)
    print_header(title, args)
    return args
