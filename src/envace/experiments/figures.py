"""Writing a matplotlib figure the way every report does."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_figure(fig: Any, path: Path) -> Path:
    """Saves ``fig`` as ``path`` (its folder made) and closes it; written to a temporary file and
    moved into place, so a reader never sees half a PNG."""
    import matplotlib.pyplot as plt  # not at module top: that would load matplotlib and pick its backend on import

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path
