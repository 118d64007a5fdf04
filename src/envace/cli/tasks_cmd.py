"""``envace tasks``: check a task file, print the task JSON Schema, list a world's tools."""

from __future__ import annotations

import argparse
import json
import sys

# Every command module loads for `envace --help`: the task checker, the Task model and the world registry
# are imported by the handlers that use them.


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tasks", help="task files: validate, schema, tools (docs/tasks.md)")
    tsub = p.add_subparsers(dest="tasks_command", required=True)
    v = tsub.add_parser("validate", help="check a task file; every problem as file:line: field")
    v.add_argument("file", help="a JSONL task file, a .parquet file or an exported dataset directory "
                                "(what --tasks-file takes)")
    v.add_argument("--world", default=None, help="the real environment of tasks that name none (as in train); "
                                                 "with it, tool names are checked against the world's tools")
    v.add_argument("--trust-task-worlds", action="store_true",
                   help="let the file's own env.world entries run code (mcp: commands, .py files, import "
                        "paths); refused by default, as in train")
    v.set_defaults(func=_validate)
    s = tsub.add_parser("schema", help="print the JSON Schema of one task line")
    s.set_defaults(func=_schema)
    t = tsub.add_parser("tools", help="print a world's tools as a task's 'tools' list (OpenAI format)")
    t.add_argument("--world", required=True)
    t.set_defaults(func=_tools)


def _validate(args: argparse.Namespace) -> int:
    from envace.experiments.task_check import validate_task_file

    count, problems = validate_task_file(args.file, args.world, args.trust_task_worlds)
    for p in problems:
        print(p.render(args.file), file=sys.stderr)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        print(f"{args.file}: {len(errors)} problem(s) in {count} tasks", file=sys.stderr)
        return 1
    warned = f", {len(problems)} warning(s)" if problems else ""
    print(f"{args.file}: {count} tasks, no problems{warned}")
    return 0


def _schema(args: argparse.Namespace) -> int:
    from envace.core.types import Task

    print(json.dumps(Task.model_json_schema(), indent=2))
    return 0


def _tools(args: argparse.Namespace) -> int:
    from envace.envs.registry import resolve_world

    provider = resolve_world(args.world)
    try:
        print(json.dumps([t.model_dump(mode="json") for t in provider.tools()], indent=2))
    finally:
        provider.shutdown()
    return 0
