"""Experiment trackers a run reports to besides ``metrics.jsonl`` (``report_to`` in the config):
``tensorboard`` (``<run>/tensorboard``), ``wandb`` (offline by default, into ``<run>/wandb``;
``wandb_mode: online`` uploads) and ``trackio`` (a local SQLite store, ``<run>/trackio`` unless
``TRACKIO_DIR`` is set). Each gets the scalars of every row (per phase and role) and, every
``report_samples_every`` steps, a table of sampled trajectories: the task, the caller's turns, and
each tool response, rehearsed or real, side by side with what was called. All optional extras;
asking for one that is not installed is a clear error at the start of the run."""

from __future__ import annotations

import importlib
import json
import os
from typing import Any, Protocol

from envace.core.types import Trajectory

TRACKERS = ("tensorboard", "wandb", "trackio")
TB_DIR = "tensorboard"  # <run>/tensorboard
SAMPLE_COLUMNS = ["step", "task_id", "reward", "caller_turns", "tool_responses", "response_kind"]


class Tracker(Protocol):
    def scalars(self, values: dict[str, float], step: int) -> None: ...
    def table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None: ...
    def close(self) -> None: ...


def _need(module: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(f"report_to {extra}: the package is not installed (pip install 'envace[{extra}]')") from None


class TensorBoardTracker:
    def __init__(self, path: str, resume_step: int | None = None) -> None:
        _need("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops events of steps after the checkpoint, as the JSONL logs are truncated.
        self.w = SummaryWriter(path, purge_step=None if resume_step is None else resume_step + 1)

    def scalars(self, values: dict[str, float], step: int) -> None:
        for k, v in values.items():
            self.w.add_scalar(k, v, step)
        self.w.flush()

    def table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
        body = "".join("| " + " | ".join(str(c).replace("|", "\\|").replace("\n", "<br>") for c in r) + " |\n"
                       for r in rows)
        self.w.add_text(name, head + body, step)

    def close(self) -> None:
        self.w.close()


class RunTracker:
    """A W&B or trackio run: both take ``log(dict, step=)``, their own ``Table`` and ``finish()``."""

    def __init__(self, module: Any, run: Any) -> None:
        self.module, self.run = module, run

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        self.run.log({name: self.module.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


def wandb_tracker(path: str, name: str, config: dict[str, Any], project: str, mode: str) -> RunTracker:
    wandb = _need("wandb", "wandb")
    os.makedirs(path, exist_ok=True)
    return RunTracker(wandb, wandb.init(project=project, name=name, dir=path, mode=mode, config=config,
                                        reinit="create_new"))


def trackio_tracker(path: str, name: str, config: dict[str, Any], project: str) -> RunTracker:
    os.environ.setdefault("TRACKIO_DIR", path)  # read when trackio is imported
    trackio = _need("trackio", "trackio")
    return RunTracker(trackio, trackio.init(project=project, name=name, config=config, auto_log_cpu=False,
                                            auto_log_gpu=False, embed=False))


def make_trackers(names: list[str], run_path: Any, run_name: str, config: dict[str, Any], project: str = "envace",
                  wandb_mode: str = "offline", resume_step: int | None = None) -> list[Tracker]:
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ValueError(f"report_to: unknown tracker(s) {unknown}; choose from {', '.join(TRACKERS)}")
    out: list[Tracker] = []
    for n in dict.fromkeys(names):
        if n == "tensorboard":
            out.append(TensorBoardTracker(str(run_path / TB_DIR), resume_step))
        elif n == "wandb":
            out.append(wandb_tracker(str(run_path / "wandb"), run_name, config, project, wandb_mode))
        else:
            out.append(trackio_tracker(str(run_path / "trackio"), run_name, config, project))
    return out


def row_scalars(row: dict[str, Any]) -> dict[str, float]:
    """A metrics row's numbers, keyed ``phase/name`` unless the name has its own prefix
    (``caller/loss``, ``eval/success``): one curve per phase and per role."""
    phase = str(row.get("phase", "run"))
    return {(k if "/" in k else f"{phase}/{k}"): float(v) for k, v in row.items()
            if k != "step" and not isinstance(v, bool) and isinstance(v, (int, float))}


def sample_rows(trajs: list[Trajectory], step: int, n: int = 4) -> list[list[Any]]:
    """The first ``n`` trajectories as table rows: caller turns, and each tool response next to
    the call it answers, marked rehearsed or real."""
    rows = []
    for t in trajs[:n]:
        caller = [m.content for m in t.messages if m.role == "assistant"]
        tools = [m for m in t.messages if m.role == "tool"]
        kinds = sorted({"rehearsed" if m.rehearsed else "real" if m.rehearsed is False else "error" for m in tools})
        rows.append([step, t.task_id, round(t.reward, 4), "\n---\n".join(caller),
                     "\n---\n".join(f"{m.name}: {m.content}" for m in tools), ",".join(kinds) or "-"])
    return rows


def json_config(cfg: Any) -> dict[str, Any]:
    return json.loads(json.dumps(cfg, default=str))


# Keys of a metrics row that place it, not measure it.
PLACE_KEYS = ("step", "global_step")


def warm_start_steps(rows: list[dict[str, Any]]) -> int:
    """How many optimiser steps the warm start (copy warm-up, then SFT) logged: its per-step rows
    carry a ``global_step`` (1, 2, ... through both phases)."""
    return max((int(r["global_step"]) for r in rows if isinstance(r.get("global_step"), int)), default=0)


def replay_warm_start(trackers: list[Tracker], rows: list[dict[str, Any]]) -> None:
    """Send the warm start's per-step rows, already in metrics.jsonl, to ``trackers`` at their
    ``global_step``: the trackers are made after it (on several processes, once rank 0's run
    directory exists), so its curves appear when GRPO starts."""
    for r in rows:
        if isinstance(r.get("global_step"), int):
            values = {k: v for k, v in row_scalars(r).items() if k.rsplit("/", 1)[-1] not in PLACE_KEYS}
            for t in trackers:
                t.scalars(values, int(r["global_step"]))


class Shifted:
    """A tracker whose steps are moved on by ``offset`` (the warm start's steps): GRPO step k at
    ``offset + k``, with ``train/step`` = k beside the figures."""

    def __init__(self, tracker: Tracker, offset: int) -> None:
        self.tracker, self.offset = tracker, offset

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.tracker.scalars({**values, "train/step": float(step)}, self.offset + step)

    def table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        self.tracker.table(name, columns, rows, self.offset + step)

    def close(self) -> None:
        self.tracker.close()


def after_warm_start(trackers: list[Tracker], offset: int) -> list[Tracker]:
    """The trackers GRPO and eval rows go to. TensorBoard and trackio keep one step per curve, so
    GRPO step k stays k there (``sft/loss`` has its own curve at the warm start's steps); W&B drops
    a step lower than the last it saw, so there GRPO step k goes at ``offset + k`` (one x-axis through
    every phase; ``train/step`` holds k)."""
    if not offset:
        return trackers
    return [Shifted(t, offset) if getattr(getattr(t, "module", None), "__name__", "") == "wandb" else t
            for t in trackers]
