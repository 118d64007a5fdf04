"""Where a run's metric rows go: ``metrics.jsonl`` always, TensorBoard too when it is installed
(``pip install envace[tensorboard]``); the JSONL file stays the record the reports read."""

from __future__ import annotations

from typing import Any

from envace.experiments.rundir import RunDir

TB_DIR = "tensorboard"


class MetricsLog:
    def __init__(self, run: RunDir, tensorboard: bool = True, resume_step: int | None = None):
        self.run = run
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # torch's writer needs the tensorboard package
                return
            # purge_step drops events of steps after the checkpoint, as _truncate_logs does for JSONL.
            purge = None if resume_step is None else resume_step + 1
            self._tb = SummaryWriter(str(run.path / TB_DIR), purge_step=purge)

    @property
    def tensorboard(self) -> bool:
        return self._tb is not None

    def log(self, row: dict[str, Any]) -> None:
        self.run.log_metrics(row)
        if self._tb is None:
            return
        step, phase = int(row.get("step", 0)), str(row.get("phase", "run"))
        for key, value in row.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            self._tb.add_scalar(key if "/" in key else f"{phase}/{key}", value, step)
        self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
