"""Where benchmark data files live: read in place, never copied into the project.

Resolution order: an explicit ``--data-dir``, then ``$ENVACE_BENCH_DATA``, then
``<repo>/../shared/data`` (the repo root found from this file for an editable install, or from the
working directory otherwise).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "ENVACE_BENCH_DATA"


def _repo_root() -> Path | None:
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").exists() and (parent / "src" / "envace").is_dir():
            return parent
    return None


def data_root(override: str | Path | None = None) -> Path:
    if override:
        return Path(override).expanduser()
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    repo = _repo_root() or Path.cwd()
    return (repo / ".." / "shared" / "data").resolve()


def bench_dir(name: str, override: str | Path | None = None) -> Path:
    return data_root(override) / name
