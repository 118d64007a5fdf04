"""Where a run's metric rows go: ``metrics.jsonl`` always (the record the reports read), and the
trackers of ``report_to`` (``experiments.trackers``: TensorBoard, W&B, trackio)."""

from __future__ import annotations

from typing import Any

from envace.core.types import Trajectory
from envace.experiments.rundir import RunDir
from envace.experiments.trackers import Tracker, row_scalars, sample_rows, SAMPLE_COLUMNS


class MetricsLog:
    def __init__(self, run: RunDir, trackers: list[Tracker] | None = None, samples_every: int = 0):
        self.run = run
        self.trackers = list(trackers or [])
        self.samples_every = samples_every

    def log(self, row: dict[str, Any]) -> None:
        self.run.log_metrics(row)
        if self.trackers:
            values, step = row_scalars(row), int(row.get("step", 0))
            for t in self.trackers:
                t.scalars(values, step)

    def samples(self, trajs: list[Trajectory], step: int, phase: str = "train") -> None:
        """A table of sampled trajectories every ``samples_every`` steps (and at step 1)."""
        if not self.trackers or not self.samples_every or not trajs or (step != 1 and step % self.samples_every):
            return
        rows = sample_rows(trajs, step)
        for t in self.trackers:
            t.table(f"{phase}/samples", SAMPLE_COLUMNS, rows, step)

    def close(self) -> None:
        for t in self.trackers:
            t.close()
