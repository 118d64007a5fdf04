"""``envace tasks validate``: a task file checked beyond its shape, every problem as file:line:field.

Checks: each line is JSON and a valid Task; ids are unique; every tool schema is valid JSON
Schema (and its regex ``pattern``s are safe: no nested quantifiers that backtrack
catastrophically); checklist and example tools exist in the task's tools; ``called`` args and
example arguments meet the tool's schema; ``state`` queries compile against the task's world
(a SQLite world) and are read-only; tasks without tools have a world to list them from.
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
from pydantic import ValidationError

from envace.core.jsonl import _field_path
from envace.core.patterns import schema_patterns, unsafe_pattern
from envace.core.types import EnvRef, Task
from envace.core.validate import schema_error
from envace.envs.registry import resolve_world, spec_key

@dataclass
class Problem:
    line: int
    field: str
    message: str

    def render(self, path: str) -> str:
        return f"{path}:{self.line}: field '{self.field}': {self.message}"


def check_state_query(sql: str) -> str | None:
    """A state query must be one read-only SELECT: no ATTACH, no writes, no PRAGMA."""
    stripped = sql.strip().rstrip(";").strip()
    if not re.match(r"(?is)^(select|with)\b", stripped):
        return "a state query must be one SELECT (or WITH ... SELECT)"
    if ";" in stripped:
        return "a state query must be a single statement"
    if re.search(r"(?i)\b(attach|detach|pragma|insert|update|delete|drop|create|alter|replace|vacuum)\b", stripped):
        return "a state query must only read (no ATTACH, PRAGMA or writes)"
    return None


def validate_task_file(path: str | Path, world: Any = None) -> tuple[int, list[Problem]]:
    """(tasks read, problems). ``world``: the run's --world, for tasks that name none."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    providers: dict[str, Any] = {}
    count = 0
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        for lineno, line in enumerate(text.split("\n"), start=1):  # as iter_jsonl numbers lines
            if not line.strip():
                continue
            count += 1
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as e:
                problems.append(Problem(lineno, "-", f"not valid JSON ({getattr(e, 'msg', e)})"))
                continue
            try:
                task = Task.model_validate(obj)
            except ValidationError as e:
                problems += [Problem(lineno, _field_path(err["loc"]), err["msg"]) for err in e.errors()]
                continue
            if task.id in seen:
                problems.append(Problem(lineno, "id", f"duplicate id {task.id!r} (first on line {seen[task.id]})"))
            seen.setdefault(task.id, lineno)
            problems += _check_task(task, lineno, world, providers)
    finally:
        for p in providers.values():
            if p is not None:
                p.shutdown()
    return count, problems


def _provider(spec: Any, providers: dict[str, Any]) -> Any:
    key = spec_key(spec)
    if key not in providers:
        try:
            providers[key] = resolve_world(spec)
        except ValueError:
            providers[key] = None
    return providers[key]


def _check_task(task: Task, line: int, world: Any, providers: dict[str, Any]) -> list[Problem]:
    out: list[Problem] = []
    spec = task.env.world if task.env is not None and task.env.world else world
    tools = {t.name: t for t in task.tools}
    if not tools:
        if spec is None:
            out.append(Problem(line, "tools", "no tools, and no world to list them from (env.world or --world)"))
        else:
            provider = _provider(spec, providers)
            if provider is None:
                out.append(Problem(line, "env.world", f"cannot load world {spec!r}"))
            else:
                try:
                    tools = {t.name: t for t in provider.tools()}
                except ValueError as e:
                    out.append(Problem(line, "env.world", str(e)))
    for i, t in enumerate(task.tools):
        where = f"tools[{i}].function.parameters"
        try:
            jsonschema.validators.validator_for(t.function.parameters).check_schema(t.function.parameters)
        except jsonschema.SchemaError as e:
            out.append(Problem(line, where, f"not a valid JSON Schema: {e.message}"))
            continue
        for at, pattern in schema_patterns(t.function.parameters, where):
            if why := unsafe_pattern(pattern):
                out.append(Problem(line, at + ".pattern", f"{pattern!r}: {why}"))
    for i, item in enumerate(task.checklist):
        where = f"checklist[{i}]"
        if item.kind == "called":
            if not item.tool:
                out.append(Problem(line, where + ".tool", "a 'called' item needs a tool"))
            elif tools and item.tool not in tools:
                out.append(Problem(line, where + ".tool", f"unknown tool {item.tool!r}; the task's tools: "
                                                           f"{', '.join(sorted(tools))}"))
        elif item.kind == "answer_contains" and not (item.text or "").strip():
            out.append(Problem(line, where + ".text", "an 'answer_contains' item needs a non-empty text"))
        elif item.kind == "judge" and not (item.criterion or "").strip():
            out.append(Problem(line, where + ".criterion", "a 'judge' item needs a criterion"))
        elif item.kind == "state":
            if not item.query or item.equals is None:
                out.append(Problem(line, where, "a 'state' item needs a query and equals"))
                continue
            if why := check_state_query(item.query):
                out.append(Problem(line, where + ".query", why))
                continue
            out += _compile_state(item.query, task, spec, providers, line, where + ".query")
    for i, ex in enumerate(task.examples):
        if tools and ex.tool not in tools:
            out.append(Problem(line, f"examples[{i}].tool", f"unknown tool {ex.tool!r}"))
        elif tools:
            problem = schema_error(ex.arguments, tools[ex.tool].function.parameters)
            if problem:
                out.append(Problem(line, f"examples[{i}].arguments", problem))
    return out


def _compile_state(sql: str, task: Task, spec: Any, providers: dict[str, Any], line: int, where: str) -> list[Problem]:
    if spec is None:
        return [Problem(line, where, "a 'state' item needs a real world (env.world or --world) to run in")]
    provider = _provider(spec, providers)
    if provider is None:
        return [Problem(line, "env.world", f"cannot load world {spec!r}")]
    env = provider.open(task.env or EnvRef())
    try:
        db = getattr(env, "db", None)
        if not isinstance(db, sqlite3.Connection):
            if not callable(getattr(env, "query", None)):
                return [Problem(line, where, f"world {spec!r} has no SQL state to query")]
            return []
        try:
            db.execute(f"EXPLAIN {sql}")
        except sqlite3.Error as e:
            return [Problem(line, where, f"does not compile against world {spec!r}: {e}")]
        return []
    finally:
        provider.close_environment(env)
