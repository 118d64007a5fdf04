"""Public task API of the embedded suite: ``generate_tasks`` and ``load_tasks``."""

from __future__ import annotations

from collections.abc import Collection
from functools import lru_cache

from envace.core.types import Task
from envace.envs import tasks_bank, tasks_calendar, tasks_shop
from envace.envs.registry import world_class
from envace.envs.taskgen import GROUNDINGS, TaskSet, build_task, difficulty_of

TASK_SETS: dict[str, TaskSet] = {t.world: t for t in (tasks_shop.TASKS, tasks_calendar.TASKS,
                                                      tasks_bank.TASKS)}
SPLITS = ("train", "test")


def task_set(world: str) -> TaskSet:
    world_class(world)  # ValueError listing the known worlds
    return TASK_SETS[world]


@lru_cache(maxsize=None)
def _task_json(world: str, index: int, n_examples: int, grounding: str) -> str:
    # Cached as JSON: parsing it back is the cheapest way to hand out an independent copy.
    return build_task(TASK_SETS[world], index, n_examples, grounding).model_dump_json()


def generate_tasks(world: str, n: int = 300, n_examples: int = 3,
                   split: str | None = None, grounding: str = "covering",
                   difficulties: Collection[int] | None = None) -> list[Task]:
    """Tasks ``{world}-0000`` .. ``{world}-{n-1}``, then filtered to ``split`` if given.

    Task i uses world seed i, so a task keeps its id, seed and split whatever ``n`` is. The same
    arguments always give identical tasks (returned as fresh copies: callers may mutate them).
    ``n_examples`` and ``grounding`` choose the simulator's real call/result examples
    (``taskgen.pick_examples``). ``difficulties`` keeps only those levels (and builds no others).
    """
    task_set(world)
    if split not in (None, *SPLITS):
        raise ValueError(f"split must be one of {SPLITS} or None, not {split!r}")
    if n < 0 or n_examples < 0:
        raise ValueError("n and n_examples must be >= 0")
    if grounding not in GROUNDINGS:
        raise ValueError(f"grounding must be one of {GROUNDINGS}, not {grounding!r}")
    wanted = [i for i in range(n) if difficulties is None or difficulty_of(i) in difficulties]
    tasks = (Task.model_validate_json(_task_json(world, i, n_examples, grounding)) for i in wanted)
    return [t for t in tasks if split is None or t.split == split]


def load_tasks(world: str, split: str | None = None, limit: int | None = None,
               n_examples: int = 3, grounding: str = "covering", n: int = 300,
               difficulties: Collection[int] | None = None) -> list[Task]:
    """The suite of ``world`` (by default 300 tasks, 3 examples each), optionally one split.
    A larger ``n`` keeps the first 300 tasks and adds more (more SFT data, same test tasks)."""
    tasks = generate_tasks(world, n=n, split=split, n_examples=n_examples, grounding=grounding,
                           difficulties=difficulties)
    return tasks if limit is None else tasks[:limit]
