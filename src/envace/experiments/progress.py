"""A progress bar for long phases: step, figures of the last step, rate and ETA (rich), and the
whole job's time left across its phases (:class:`JobClock`).

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


def _secs(s: float) -> str:
    return f"{s:,.0f}s"


class JobClock:
    """The phases of one job in order and what is known of their length, so that each phase's
    progress line can also say how long the whole job has left. A later phase counts once it has
    an estimate (e.g. the final eval from the step-0 eval of the same tasks); until then the line
    names it as not yet timed rather than showing a phase's ETA as the job's."""

    def __init__(self, phases: list[str]):
        self.phases = list(phases)
        self.estimates: dict[str, float] = {}

    def label(self, phase: str) -> str:
        return f"{phase} [{self.phases.index(phase) + 1}/{len(self.phases)}]" if phase in self.phases else phase

    def estimate(self, phase: str, seconds: float) -> None:
        self.estimates[phase] = float(seconds)

    def job_eta(self, phase: str, left: float) -> str:
        """``left`` seconds of ``phase`` plus the phases after it."""
        later = self.phases[self.phases.index(phase) + 1:] if phase in self.phases else []
        total = left + sum(self.estimates.get(p, 0.0) for p in later)
        untimed = [p for p in later if p not in self.estimates]
        if untimed:
            return f"job eta >{_secs(total)} ({', '.join(untimed)} not yet timed)"
        return f"job eta {_secs(total)}"


class StepProgress:
    def __init__(self, name: str, total: int | None, start: int = 0, log_every_s: float = 30.0,
                 clock: JobClock | None = None):
        self.phase, self.clock = name, clock
        if clock is not None:
            name = clock.label(name)
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

    def left(self, step: int, total: int | None) -> float | None:
        """Seconds left in this phase at the mean rate so far (None before the first step)."""
        done = step - self._start
        if not total or done <= 0:
            return None
        return (time.perf_counter() - self._t0) / done * (total - step)

    def update(self, step: int, total: int | None, values: dict[str, Any]) -> None:
        left = self.left(step, total)
        job = self.clock.job_eta(self.phase, left) if self.clock is not None and left is not None else ""
        if self._progress is not None:
            info = _fmt(values) + (f" | {job}" if job else "")
            self._progress.update(self._task, completed=step, total=total, info=info)
            return
        now = time.perf_counter()
        if now - self._last < self.log_every_s and step != total:
            return
        self._last = now
        eta = f" eta {left:.0f}s" if left is not None else ""
        job = f" | {job}" if job else ""
        print(f"{self.name} {step}/{total or '?'} {now - self._t0:.0f}s{eta} {_fmt(values)}{job}", flush=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
