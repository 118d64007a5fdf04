"""Executable tool worlds (SQLite-backed) and their generated task suites.

    make_world("shop", seed) -> World        # call(name, args), query(sql), tools(), calls
    generate_tasks("shop", n=300, n_examples=3, split=None) -> list[Task]
    load_tasks("shop", "test") -> list[Task]
"""

from envace.envs.registry import WORLDS, make_world, world_names
from envace.envs.tasks import generate_tasks, load_tasks
from envace.envs.world import World

__all__ = ["WORLDS", "World", "generate_tasks", "load_tasks", "make_world", "world_names"]
