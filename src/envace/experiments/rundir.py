"""A run directory: resolved config, provenance, trajectories and metrics, all written safely.

Layout::

    runs/<id>/config.yaml        resolved config (what actually ran)
    runs/<id>/meta.json          seed, git revision, command line, start time, machine
    runs/<id>/trajectories.jsonl append-only, one Trajectory a line
    runs/<id>/metrics.jsonl      append-only, one dict a line
    runs/<id>/summary.md         written at the end
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from envace.core.jsonl import append_jsonl, atomic_write_text, read_jsonl_dicts
from envace.core.types import Trajectory


def git_revision() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def new_run_id(kind: str) -> str:
    return f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


@dataclass
class RunDir:
    path: Path

    @classmethod
    def create(cls, root: Path | str, kind: str, config: dict[str, Any], seed: int | None = None,
               name: str | None = None) -> "RunDir":
        if name is not None and (not name.strip() or name in (".", "..") or "/" in name or "\\" in name
                                 or Path(name).is_absolute() or "\x00" in name):
            raise ValueError(f"run name {name!r} must be one plain folder name (no '/', '..' or absolute path): "
                             "runs are written only inside --out")
        path = Path(root) / (name or new_run_id(kind))
        if path.exists() and any(path.iterdir()):
            raise FileExistsError(f"run directory {path} already exists and is not empty (use --resume to continue it)")
        path.mkdir(parents=True, exist_ok=True)
        run = cls(path)
        run.write_config(config)
        meta = {"kind": kind, "seed": seed, "git_revision": git_revision(), "argv": sys.argv,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "python": sys.version.split()[0],
                "platform": platform.platform(), "cpus": os.cpu_count()}
        atomic_write_text(path / "meta.json", json.dumps(meta, indent=2))
        return run

    @classmethod
    def open(cls, path: Path | str) -> "RunDir":
        path = Path(path)
        if not (path / "config.yaml").exists():
            raise FileNotFoundError(f"{path} is not a run directory (no config.yaml)")
        return cls(path)

    def write_config(self, config: dict[str, Any]) -> None:
        atomic_write_text(self.path / "config.yaml", yaml.safe_dump(config, sort_keys=False))

    def config(self) -> dict[str, Any]:
        return yaml.safe_load((self.path / "config.yaml").read_text()) or {}

    def meta(self) -> dict[str, Any]:
        p = self.path / "meta.json"
        return json.loads(p.read_text()) if p.exists() else {}

    def add_trajectories(self, trajectories: Iterable[Trajectory], name: str = "trajectories.jsonl") -> None:
        append_jsonl(self.path / name, trajectories)

    def trajectories(self, name: str = "trajectories.jsonl") -> list[Trajectory]:
        return [Trajectory.model_validate(d) for d in read_jsonl_dicts(self.path / name)]

    def log_metrics(self, row: dict[str, Any]) -> None:
        """One row; every row also carries the process's memory then (``mem/rss_gib``) and its
        high-water mark so far (``mem/peak_rss_gib``), so a run's peak is placed in its phase."""
        append_jsonl(self.path / "metrics.jsonl", [{**row, **memory_now()}])

    def metrics(self) -> list[dict[str, Any]]:
        return read_jsonl_dicts(self.path / "metrics.jsonl")

    def write_text(self, name: str, text: str) -> Path:
        atomic_write_text(self.path / name, text)
        return self.path / name


def memory_now() -> dict[str, float]:
    """Resident memory of this process now and at its peak so far, in GiB (Linux; elsewhere the
    peak only, or nothing)."""
    out: dict[str, float] = {}
    try:
        import resource

        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        out["mem/peak_rss_gib"] = round(peak_kib / 2**20, 3)
    except (ImportError, OSError):  # not a POSIX system: no figure rather than a wrong one
        pass
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        out["mem/rss_gib"] = round(pages * os.sysconf("SC_PAGE_SIZE") / 2**30, 3)
    except (OSError, ValueError, IndexError):  # no /proc (not Linux)
        pass
    return out
