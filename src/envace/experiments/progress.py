"""A progress bar for long phases: step, figures of the last step, rate and ETA (rich), and the
whole job's time left across its phases (:class:`JobClock`).

When output is not a terminal (a log file, CI), a plain line is printed at most every
``log_every_s`` seconds instead, so a log shows progress too.
"""

from __future__ import annotations

import io
import time
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


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


# Below this width the bar and elapsed time go, so the figures that matter keep their room.
WIDE = 120


def _clock(s: float | None) -> str:
    if s is None:
        return "-:--"
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def fit_line(head: str, values: dict[str, Any], job: str, width: int) -> str:
    """``head`` (phase and step), then as many of ``values`` (most important first) and the job
    ETA as fit in ``width`` columns: the job ETA's detail goes first, then the later values, so a
    narrow terminal shows whole figures instead of every one cut short."""
    items = [p for p in (_fmt({k: v}) for k, v in values.items()) if p]
    short_job = job.split(" (", 1)[0].replace("job eta ", "job ")
    for n in range(len(items), 0, -1):
        for j in ((job, short_job) if job else ("",)):
            line = " ".join([head, *items[:n]]) + (f" | {j}" if j else "")
            if len(line) <= width:
                return line
    line = " ".join([head, *items[:1]])
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


class StepProgress:
    def __init__(self, name: str, total: int | None, start: int = 0, log_every_s: float = 30.0,
                 clock: JobClock | None = None, console: Console | None = None):
        self.phase, self.clock = name, clock
        if clock is not None:
            name = clock.label(name)
        self.name, self.log_every_s = name, log_every_s
        self._console = console or Console()
        self._t0 = self._last = time.perf_counter()
        self._start = start
        self._progress = None
        if self._console.is_terminal:
            self._wide = self._console.width >= WIDE
            middle = [BarColumn(), TimeElapsedColumn()] if self._wide else []
            self._progress = Progress(TextColumn(f"[bold]{escape(name)}"), *middle, TextColumn("{task.fields[line]}"),
                                      console=self._console)
            self._progress.start()
            self._task = self._progress.add_task(name, total=total, completed=start, line="")

    def left(self, step: int, total: int | None) -> float | None:
        """Seconds left in this phase at the mean rate so far (None before the first step)."""
        done = step - self._start
        if not total or done <= 0:
            return None
        return (time.perf_counter() - self._t0) / done * (total - step)

    def line(self, step: int, total: int | None, values: dict[str, Any], width: int) -> str:
        """The terminal line: phase, step/total, ETA, then what fits of ``values`` and the job ETA."""
        left = self.left(step, total)
        job = self.clock.job_eta(self.phase, left) if self.clock is not None and left is not None else ""
        head = f"{self.name} {step}/{total or '?'}" + (f" eta {_clock(left)}" if total else "")
        return fit_line(head, values, job, width)

    def update(self, step: int, total: int | None, values: dict[str, Any]) -> None:
        if self._progress is not None:
            # the bar and elapsed time take about 50 columns of a wide line; the name's column is
            # part of the line's own width
            room = self._console.width - (52 if self._wide else 1)
            text = self.line(step, total, values, room)[len(self.name) + 1:]
            # rich markup in a key or value (a tool name with brackets) must print as it is
            self._progress.update(self._task, completed=step, total=total, line=escape(text))
            return
        left = self.left(step, total)
        job = self.clock.job_eta(self.phase, left) if self.clock is not None and left is not None else ""
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


def metrics_table(title: str, metrics: dict[str, Any], width: int | None = None) -> str:
    """``metrics`` (``eval/success``: 0.25, ...) as a titled two-column table of text, for a log
    line: readable at a glance where a dict's repr is not. Names keep their order; the shared
    prefix (``eval/``) is dropped."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_header=False, pad_edge=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    items = [(k.split("/", 1)[1] if k.startswith("eval/") else k,
              f"{v:g}" if k.endswith("_n") else f"{v:.3f}" if isinstance(v, float) else str(v))
             for k, v in metrics.items()]
    half = (len(items) + 1) // 2
    for left, right in zip(items[:half], items[half:] + [("", "")]):
        table.add_row(*left, *right)
    out = io.StringIO()
    Console(file=out, width=width or min(Console().width, 100), no_color=True, highlight=False).print(table)
    return "\n".join(line.rstrip() for line in out.getvalue().strip().splitlines() if line.strip())
