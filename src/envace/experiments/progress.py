"""A progress bar for long phases: step, figures of the last step, rate and ETA (rich)."""

from __future__ import annotations

from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def _fmt(values: dict[str, Any]) -> str:
    parts = []
    for k, v in values.items():
        if v is None:
            continue
        parts.append(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(parts)


class StepProgress:
    def __init__(self, name: str, total: int | None, start: int = 0):
        self._progress = Progress(TextColumn(f"[bold]{name}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                  TextColumn("{task.fields[info]}"), transient=False)
        self._progress.start()
        self._task = self._progress.add_task(name, total=total, completed=start, info="")

    def update(self, step: int, total: int | None, values: dict[str, Any]) -> None:
        self._progress.update(self._task, completed=step, total=total, info=_fmt(values))

    def close(self) -> None:
        self._progress.stop()
