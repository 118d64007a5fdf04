"""A progress bar for long phases: step, figures of the last step, rate and ETA (rich).

When output is not a terminal (a log file, CI), a plain line is printed at most every
``log_every_s`` seconds instead, so a log shows progress too.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def _fmt(values: dict[str, Any]) -> str:
    parts = []
    for k, v in values.items():
        if v is None:
            continue
        parts.append(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(parts)


class StepProgress:
    def __init__(self, name: str, total: int | None, start: int = 0, log_every_s: float = 30.0):
        self.name, self.log_every_s = name, log_every_s
        self._console = Console()
        self._t0 = self._last = time.perf_counter()
        self._start = start
        self._progress = None
        if self._console.is_terminal:
            self._progress = Progress(TextColumn(f"[bold]{name}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                      TextColumn("{task.fields[info]}"), console=self._console)
            self._progress.start()
            self._task = self._progress.add_task(name, total=total, completed=start, info="")

    def update(self, step: int, total: int | None, values: dict[str, Any]) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=step, total=total, info=_fmt(values))
            return
        now = time.perf_counter()
        if now - self._last < self.log_every_s and step != total:
            return
        self._last = now
        done = step - self._start
        eta = ""
        if total and done > 0:
            eta = f" eta {(now - self._t0) / done * (total - step):.0f}s"
        print(f"{self.name} {step}/{total or '?'} {now - self._t0:.0f}s{eta} {_fmt(values)}", flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
