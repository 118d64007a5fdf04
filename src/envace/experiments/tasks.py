"""Where a run's tasks come from: an embedded world's generator or a user's JSONL file."""

from __future__ import annotations

from pathlib import Path

from envace.core.jsonl import load_jsonl
from envace.core.types import Task
from envace.envs.registry import world_names
from envace.envs.tasks import load_tasks


def select_tasks(world: str | None, split: str = "test", limit: int | None = None,
                 task_file: str | Path | None = None) -> list[Task]:
    if task_file is not None:
        tasks = load_jsonl(task_file, Task)
        if split in ("train", "test"):
            tasks = [t for t in tasks if t.split in (None, split)]
    else:
        names = world_names() if world in (None, "all") else [w.strip() for w in world.split(",")]
        unknown = [w for w in names if w not in world_names()]
        if unknown:
            raise ValueError(f"unknown world(s) {unknown}; known: {world_names()}")
        per = None if limit is None else max(1, -(-limit // len(names)))
        tasks = [t for w in names for t in load_tasks(w, split, limit=per)]
    if limit is not None:
        tasks = tasks[:limit]
    if not tasks:
        raise ValueError(f"no tasks for world={world!r} split={split!r}" + (f" in {task_file}" if task_file else ""))
    return tasks
