"""Where a run's tasks come from: an embedded world's generator or a user's JSONL file, and the
task-level settings a config may apply (which difficulties, which tools each prompt shows)."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

from envace.core.types import Task
from envace.envs.registry import resolve_world, spec_key, world_names
from envace.experiments.task_check import load_checked_tasks

# A task file that marks no task's split holds out every HOLDOUT-th task (by a hash of its id) as
# test, so a run on a user's file never evaluates on the tasks it trained on.
HOLDOUT = 5


def file_split(task: Task, file_has_splits: bool) -> str | None:
    if task.split is not None or file_has_splits:
        return task.split
    return "test" if int(hashlib.sha256(task.id.encode()).hexdigest(), 16) % HOLDOUT == 0 else "train"


def with_world_tools(tasks: list[Task], world: Any = None) -> list[Task]:
    """Tasks that list no tools take the tool listing of their real world (their ``env.world``,
    else the run's ``world``): a Python tool set's derived schemas, an MCP server's listing."""
    specs: dict[str, Any] = {}
    for t in tasks:
        if not t.tools:
            spec = t.env.world if t.env is not None and t.env.world else world
            if spec is None:
                raise ValueError(f"task {t.id} lists no tools and names no world to take them from "
                                 "(give its 'tools', its env.world, or the run's --world)")
            specs.setdefault(spec_key(spec), spec)
    listings = {}
    for label, spec in specs.items():
        provider = resolve_world(spec)
        try:
            listings[label] = provider.tools()
        finally:
            provider.shutdown()
    out = []
    for t in tasks:
        if t.tools:
            out.append(t)
            continue
        spec = t.env.world if t.env is not None and t.env.world else world
        out.append(t.model_copy(update={"tools": [x.model_copy(deep=True) for x in listings[spec_key(spec)]]}))
    return out
from envace.envs.tasks import load_tasks


def needed_tools(task: Task) -> list[str]:
    names = [c.name for c in task.reference.calls] if task.reference else []
    names += [i.tool for i in task.checklist if i.kind == "called" and i.tool]
    return list(dict.fromkeys(names))


def restrict_tools(task: Task, distractors: int) -> Task:
    """Show only the tools the task needs plus ``distractors`` others (chosen per task, fixed).

    Like BFCL's per-entry function lists: prompts several times shorter, which is what a CPU
    budget needs. It uses the generator's reference, so it is a data setting, not a policy input.
    """
    need = set(needed_tools(task))
    if not need:
        return task
    others = [t for t in task.tools if t.name not in need]
    keep = need | {t.name for t in random.Random(task.id).sample(others, min(distractors, len(others)))}
    # Recorded examples of tools the task no longer shows go with them (the reference's tools are
    # always kept, so no reference call is lost): the task check refuses examples of unknown tools.
    return task.model_copy(update={"tools": [t for t in task.tools if t.name in keep],
                                   "examples": [e for e in task.examples if e.tool in keep]})


def select_tasks(world: str | None, split: str = "test", limit: int | None = None,
                 task_file: str | Path | None = None, difficulties: list[int] | None = None,
                 tool_distractors: int | None = None, n_examples: int = 3,
                 grounding: str = "covering", tasks_per_world: int = 300, real_world: Any = None,
                 trust_task_worlds: bool = False) -> list[Task]:
    """Tasks of ``split`` (train | test | all). ``tool_distractors=None`` shows every tool;
    ``n_examples`` and ``grounding`` set the embedded generator's simulator examples. File tasks
    without tools take them from their world (``real_world``: the run's ``--world``); a file's
    own worlds that would run code are refused unless ``trust_task_worlds`` (see task_check)."""
    if task_file is not None:
        # The one loader and check `envace tasks validate` uses: errors refuse the file (one line).
        tasks = load_checked_tasks(task_file, real_world, trust_task_worlds).tasks
        has_splits = any(t.split is not None for t in tasks)
        if split in ("train", "test"):
            tasks = [t for t in tasks if file_split(t, has_splits) in (None, split)]
        tasks = with_world_tools(tasks, real_world)
    else:
        names = world_names() if world in (None, "all") else [w.strip() for w in world.split(",")]
        unknown = [w for w in names if w not in world_names()]
        if unknown:
            raise ValueError(f"unknown world(s) {unknown}; known: {world_names()}")
        wanted = None if split == "all" else split
        per_world = [load_tasks(w, wanted, n_examples=n_examples, grounding=grounding, n=tasks_per_world,
                                difficulties=difficulties) for w in names]
        # Interleave worlds so that a limit takes from each of them.
        tasks = [t for group in zip(*per_world) for t in group]
        tasks += [t for ts in per_world for t in ts[min(map(len, per_world)):]]
    if difficulties is not None and task_file is not None:
        # A task without a difficulty is kept: the filter is for files that grade their tasks.
        tasks = [t for t in tasks if t.difficulty is None or t.difficulty in difficulties]
    if limit is not None:
        tasks = tasks[:limit]
    if not tasks:
        raise ValueError(f"no tasks for world={world!r} split={split!r}" + (f" in {task_file}" if task_file else ""))
    if tool_distractors is not None:
        tasks = [restrict_tools(t, tool_distractors) for t in tasks]
    return tasks
