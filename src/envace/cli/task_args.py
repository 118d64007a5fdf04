"""The arguments that say where a command's tasks come from, shared by the commands that run them."""

from __future__ import annotations

import argparse


def add_task_source_args(p: argparse.ArgumentParser, world_help: str) -> None:
    """``--world`` (its help in the command's own words), ``--task-file`` and ``--trust-task-worlds``."""
    p.add_argument("--world", default=None, help=world_help)
    p.add_argument("--task-file", default=None, help="a JSONL task file instead of an embedded world")
    p.add_argument("--trust-task-worlds", action="store_true",
                   help="let the task file's own env.world entries run code (mcp: commands, .py files, import "
                        "paths); refused by default (docs/tasks.md)")
