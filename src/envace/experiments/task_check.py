"""Reading a task file and checking what it says, for ``envace tasks validate`` and for every run
that loads one (train, eval, rollout, export): one loader, one check, every problem as
``file:line: field 'path': problem``.

What a task file is: data. Reading and checking it never executes, imports or fetches anything
it names:

* a world named in a task (``env.world``) that would run code or reach out (an ``mcp:`` command,
  an MCP URL or settings file, a ``.py`` file or an import path) is refused unless the user
  trusts the file's worlds (``--trust-task-worlds`` / ``trust_task_worlds: true``) or named that
  same world themselves (``--world`` / ``world:``); registered worlds (the embedded ones and the
  ``envace.worlds`` entry points the user installed) are always allowed;
* a tool schema must be valid JSON Schema (meta-validated) and its ``$ref``\\ s resolve inside the
  schema only (a registry with no retrieval: ``http://`` and ``file://`` refs are refused, never
  fetched);
* a ``state`` query is one read-only SELECT.

The world the user named is theirs: with it, the check lists its tools (tool names and ``called``
items must be tools it has), compiles ``state`` queries against its SQLite state, and refuses
``env.args`` it has nothing to pass to (an MCP server without a reset tool, a class without
``reset``).

The checks: each line (or Parquet row) is JSON and a valid Task; ids are unique; every tool schema
is valid JSON Schema, its ``$ref``\\ s are local and resolve, its regex ``pattern``\\ s are safe (no
nested quantifiers that backtrack catastrophically); checklist, example and reference tools exist
in the task's tools; ``called`` args and example arguments meet the tool's schema; ``state``
queries compile against the task's world (a SQLite world) and are read-only; tasks without tools
have a world to list them from.
"""

from __future__ import annotations

import json
import re
import sqlite3
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jsonschema
from pydantic import ValidationError
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012, specification_with

from envace.core.jsonl import _field_path
from envace.core.patterns import schema_patterns, unsafe_pattern
from envace.core.tools import unguarded_warning
from envace.core.types import EnvRef, Task
from envace.core.validate import NO_RETRIEVAL, schema_error
from envace.envs.registry import registered_worlds, resolve_world, spec_key, spec_label
from envace.experiments.datasets_io import TASK_NESTED, read_rows

MAX_SCHEMA_DEPTH = 100  # deeper tool schemas are refused rather than walked
TRUST_HINT = ("a task file may name such a world only when you pass --trust-task-worlds (trust_task_worlds: true "
              "in your config) or name that world yourself (--world / world:)")


class TaskFileWarning(UserWarning):
    """A task file problem that does not stop a run (printed by ``tasks validate`` as a warning)."""


@dataclass
class Problem:
    line: int | str  # a JSONL line number, or "row N" of a Parquet file
    field: str
    message: str
    severity: Literal["error", "warning"] = "error"
    file: str | None = None  # the Parquet file of a dataset directory's row

    def render(self, path: str | Path) -> str:
        kind = "" if self.severity == "error" else "warning: "
        return f"{self.file or path}:{self.line}: field '{self.field}': {kind}{self.message}"


@dataclass
class TaskRecord:
    line: int | str
    task: Task
    file: str | None = None


@dataclass
class CheckedTasks:
    """A task file read and checked: its valid tasks, every problem, and how many records it had."""

    path: Path
    records: list[TaskRecord] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    count: int = 0

    @property
    def tasks(self) -> list[Task]:
        return [r.task for r in self.records]

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    def raise_errors(self) -> None:
        """A ValueError of one line (the first error and how many more) when there are any."""
        errors = self.errors
        if errors:
            more = f" (+{len(errors) - 1} more: envace tasks validate {self.path})" if len(errors) > 1 else ""
            raise ValueError(errors[0].render(self.path) + more)


# ---------------------------------------------------------------------------------------------
# Reading: JSONL, a .parquet file or an exported dataset directory, one loader for all commands.


def is_dataset_path(path: str | Path) -> bool:
    p = Path(path)
    return p.suffix == ".parquet" or p.is_dir()


def _jsonl_objects(path: Path) -> Iterator[tuple[int, Any, Problem | None]]:
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield lineno, None, Problem(lineno, "-", f"not UTF-8 text ({e.reason} at byte {e.start}); "
                                                         "save the file as UTF-8")
                continue
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line), None
            except json.JSONDecodeError as e:
                yield lineno, None, Problem(lineno, "-", f"not valid JSON ({e.msg} at column {e.colno})")
            except RecursionError:
                yield lineno, None, Problem(lineno, "-", "not valid JSON (nested too deeply)")


def _dataset_objects(path: Path) -> Iterator[tuple[str, Any, Problem | None, str]]:
    for where, row in read_rows(path):
        file, _, row_label = where.rpartition(":")
        row = {k: v for k, v in row.items() if v is not None}
        problem = None
        for key in TASK_NESTED:
            if isinstance(row.get(key), str):
                try:
                    row[key] = json.loads(row[key])
                except (json.JSONDecodeError, RecursionError) as e:
                    problem = Problem(row_label, key, f"not JSON ({getattr(e, 'msg', 'nested too deeply')})", file=file)
                    break
        if "split" not in row:  # an HF split file (data/test-00000-of-00001.parquet) says it by name
            split = Path(file).name.split("-", 1)[0]
            if split in ("train", "test"):
                row["split"] = split
        yield row_label, None if problem else row, problem, file


def read_task_file(path: str | Path) -> CheckedTasks:
    """Every record of a task file (JSONL, a ``.parquet`` file or an exported dataset directory)
    as a Task, with every shape problem. Raises only for a path that is not there or not a
    readable Parquet file (FileNotFoundError / ValueError, one line)."""
    path = Path(path)
    out = CheckedTasks(path)
    if is_dataset_path(path):
        rows: Iterator[tuple[Any, Any, Problem | None, str | None]] = _dataset_objects(path)
    else:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        rows = ((line, obj, problem, None) for line, obj, problem in _jsonl_objects(path))
    for line, obj, problem, file in rows:
        out.count += 1
        if problem is not None:
            out.problems.append(problem)
            continue
        try:
            task = Task.model_validate(obj)
        except ValidationError as e:
            out.problems += [Problem(line, _field_path(err["loc"]) or "-", err["msg"], file=file) for err in e.errors()]
            continue
        except RecursionError:
            out.problems.append(Problem(line, "-", "nested too deeply", file=file))
            continue
        out.records.append(TaskRecord(line, task, file))
    return out


# ---------------------------------------------------------------------------------------------
# Which worlds a task file may name.


def world_risk(spec: str) -> str | None:
    """What naming ``spec`` would make envace do that a data file must not (None: nothing:
    a registered world)."""
    s = spec.strip()
    if s in registered_worlds():
        return None
    if s.startswith("mcp:"):
        rest = s[4:].strip()
        if rest.startswith(("http://", "https://")):
            return "an MCP server URL: envace would connect to it"
        return "an MCP server command: envace would run it"
    if s.startswith(("http://", "https://")):
        return "an MCP server URL: envace would connect to it"
    if s.endswith((".yaml", ".yml")):
        return "an MCP settings file: envace would start or connect to the server it names"
    return "Python code (a file or an import path): envace would import and run it"


def _same_world(spec: Any, world: Any) -> bool:
    if world is None:
        return False
    try:
        return spec_key(spec) == spec_key(world)
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------------------------------------
# Tool schemas: valid JSON Schema, $refs inside the document only.


def _walk_refs(node: Any, at: str, depth: int = 0) -> Iterator[tuple[str, Any]]:
    if depth > MAX_SCHEMA_DEPTH:
        yield at, _TOO_DEEP
        return
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield at, v
            else:
                yield from _walk_refs(v, f"{at}.{k}", depth + 1)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk_refs(v, f"{at}[{i}]", depth + 1)


_TOO_DEEP = object()


def schema_problems(schema: Any, where: str) -> list[tuple[str, str]]:
    """(field, problem) for a tool's ``parameters``: meta-validation, then every ``$ref`` local
    and resolvable. Nothing is fetched: the registry has no retrieval."""
    refs = list(_walk_refs(schema, where))
    if any(ref is _TOO_DEEP for _, ref in refs):
        return [(where, f"nested more than {MAX_SCHEMA_DEPTH} levels deep")]
    dialect = schema.get("$schema") if isinstance(schema, dict) else None
    if dialect is not None and not isinstance(dialect, str):
        return [(where + ".$schema", f"must be a dialect URI (a string), not {type(dialect).__name__}")]
    try:
        with warnings.catch_warnings():
            # An unknown $schema dialect falls back to the default (never anything remote).
            warnings.simplefilter("ignore")
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        at = "/".join(map(str, e.absolute_path))
        return [(where, f"not a valid JSON Schema: {e.message}" + (f" (at {at})" if at else ""))]
    except RecursionError:
        return [(where, "not a valid JSON Schema: nested too deeply")]
    out: list[tuple[str, str]] = []
    if not refs:
        return out
    try:
        spec = specification_with(schema.get("$schema", ""), default=DRAFT202012) if isinstance(schema, dict) else DRAFT202012
    except Exception:  # noqa: BLE001 - an unknown dialect URI: judge refs as the default dialect does
        spec = DRAFT202012
    base = "urn:envace:tool-schema"
    registry: Registry = NO_RETRIEVAL.with_resource(base, spec.create_resource(schema))
    resolver = registry.resolver(base_uri=base)
    for at, ref in refs:
        if not isinstance(ref, str):
            out.append((at + ".$ref", f"a $ref must be a string, not {type(ref).__name__}"))
        elif not ref.startswith("#"):
            out.append((at + ".$ref", f"{ref!r} points outside the schema: a $ref must resolve inside the task "
                                      "file ('#/...'); envace never fetches or reads one (http, https, file)"))
        else:
            try:
                resolver.lookup(ref)
            except Unresolvable as e:
                out.append((at + ".$ref", f"{ref!r} does not resolve inside the schema ({type(e).__name__})"))
            except Exception as e:  # noqa: BLE001 - a malformed pointer
                out.append((at + ".$ref", f"{ref!r} is not a valid reference ({type(e).__name__}: {e})"))
    return out


# ---------------------------------------------------------------------------------------------
# The check.


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


class _Worlds:
    """The worlds a check may load (the user's own and registered ones), each once."""

    def __init__(self) -> None:
        self.providers: dict[str, Any] = {}
        self.failures: dict[str, str] = {}
        self.listings: dict[str, dict[str, Any]] = {}

    def provider(self, spec: Any) -> tuple[Any, str | None]:
        key = spec_key(spec)
        if key not in self.providers and key not in self.failures:
            try:
                self.providers[key] = resolve_world(spec)
            except (ValueError, ImportError) as e:
                self.failures[key] = str(e)
        return self.providers.get(key), self.failures.get(key)

    def tools(self, spec: Any) -> tuple[dict[str, Any] | None, str | None]:
        key = spec_key(spec)
        if key in self.listings:
            return self.listings[key], None
        provider, failure = self.provider(spec)
        if provider is None:
            return None, failure
        try:
            self.listings[key] = {t.name: t for t in provider.tools()}
        except ValueError as e:
            self.failures[key] = str(e)
            self.providers.pop(key, None)
            provider.shutdown()
            return None, str(e)
        return self.listings[key], None

    def close(self) -> None:
        for p in self.providers.values():
            p.shutdown()
        self.providers.clear()


def check_tasks(checked: CheckedTasks, world: Any = None, trust_task_worlds: bool = False) -> CheckedTasks:
    """Add the semantic problems of ``checked``'s tasks to it (see the module docstring).
    ``world``: the run's own world (--world / world:), for tasks that name none."""
    seen: dict[str, int | str] = {}
    unloadable: set[str] = set()
    worlds = _Worlds()
    try:
        for rec in checked.records:
            task = rec.task
            if task.id in seen:
                checked.problems.append(Problem(rec.line, "id", f"duplicate id {task.id!r} (first on line "
                                                                 f"{seen[task.id]})", file=rec.file))
            seen.setdefault(task.id, rec.line)
            try:
                found = _check_task(task, world, trust_task_worlds, worlds)
            except Exception as e:  # noqa: BLE001 - a check that fails is reported, never a traceback
                found = [("-", f"could not be checked: {type(e).__name__}: {e}", "error")]
            for f, m, s in found:
                if f == "-" and m.startswith("cannot load world"):  # the run's own world: once, not per task
                    if m in unloadable:
                        continue
                    unloadable.add(m)
                checked.problems.append(Problem(rec.line, f, m, s, file=rec.file))
        if not checked.errors and (why := unguarded_warning(checked.tasks)):  # rehearsal cannot check their writes
            checked.problems.append(Problem("-", "reference", why, "warning"))
    finally:
        worlds.close()
    return checked


def load_checked_tasks(path: str | Path, world: Any = None, trust_task_worlds: bool = False) -> CheckedTasks:
    """Read and check a task file; ValueError (one line) on any error, TaskFileWarning for soft problems."""
    checked = check_tasks(read_task_file(path), world, trust_task_worlds)
    checked.raise_errors()
    unjudged = [p for p in checked.warnings if p.message.endswith(UNJUDGED)]
    if unjudged:  # one line for the file, not one per task
        first = unjudged[0]
        warnings.warn(f"{checked.path}: {len(unjudged)} state items will not be judged: "
                      f"{first.message[:-len(UNJUDGED)]} (e.g. line {first.line}, {first.field})",
                      TaskFileWarning, stacklevel=2)
    for p in checked.warnings:
        if not p.message.endswith(UNJUDGED):
            warnings.warn(p.render(checked.path), TaskFileWarning, stacklevel=2)
    return checked


def validate_task_file(path: str | Path, world: Any = None, trust_task_worlds: bool = False) -> tuple[int, list[Problem]]:
    """(records read, problems) of a task file; what ``envace tasks validate`` prints."""
    checked = check_tasks(read_task_file(path), world, trust_task_worlds)
    return checked.count, checked.problems


Found = list[tuple[str, str, str]]  # (field, message, severity)
UNJUDGED = "; the item will not be judged"  # a 'state' item this run cannot query: a warning, not an error


def _check_task(task: Task, world: Any, trust: bool, worlds: _Worlds) -> Found:
    out: Found = []

    def err(where: str, message: str, severity: str = "error") -> None:
        out.append((where, message, severity))

    named = task.env.world if task.env is not None and task.env.world else None
    spec = named if named is not None else world
    usable = spec is not None
    if named is not None and not trust and not _same_world(named, world):
        risk = world_risk(named)
        if risk is not None:
            err("env.world", f"{named!r} is {risk}; refused: {TRUST_HINT}")
            usable = False

    for i, t in enumerate(task.tools):
        where = f"tools[{i}].function.parameters"
        problems = schema_problems(t.function.parameters, where)
        for at, message in problems:
            err(at, message)
        if problems:
            continue
        for at, pattern in schema_patterns(t.function.parameters, where):
            if why := unsafe_pattern(pattern):
                err(at + ".pattern", f"{pattern!r}: {why}")

    tools = {t.name: t for t in task.tools}
    world_tools, failure = (worlds.tools(spec) if usable else (None, None))
    if usable and world_tools is None:
        err("env.world" if named is not None else "-", f"cannot load world {spec!r}: {failure}")
    if not tools:
        if spec is None:
            err("tools", "no tools, and no world to list them from (env.world or --world)")
        tools = dict(world_tools or {})
    elif world_tools is not None:
        for i, t in enumerate(task.tools):
            if t.name not in world_tools:
                err(f"tools[{i}].function.name", f"{t.name!r} is not a tool of world {_label(spec)} (its tools: "
                                                  f"{', '.join(sorted(world_tools))})")
    if usable and world_tools is not None and task.env is not None and task.env.args:
        provider, _ = worlds.provider(spec)
        why = provider.args_ignored() if provider is not None else None
        if why:
            err("env.args", f"nothing receives them: {why}")

    for i, item in enumerate(task.checklist):
        where = f"checklist[{i}]"
        if item.kind == "called":
            if not item.tool:
                err(where + ".tool", "a 'called' item needs a tool")
            elif tools and item.tool not in tools:
                err(where + ".tool", f"unknown tool {item.tool!r}; the task's tools: {', '.join(sorted(tools))}")
            elif world_tools is not None and item.tool not in world_tools:
                err(where + ".tool", f"{item.tool!r} is not a tool of world {_label(spec)}")
        elif item.kind == "answer_contains" and not (item.text or "").strip():
            err(where + ".text", "an 'answer_contains' item needs a non-empty text")
        elif item.kind == "judge" and not (item.criterion or "").strip():
            err(where + ".criterion", "a 'judge' item needs a criterion")
        elif item.kind == "state":
            if not item.query or item.equals is None:
                err(where, "a 'state' item needs a query and equals")
                continue
            if why := check_state_query(item.query):
                err(where + ".query", why)
                continue
            if spec is None:
                err(where + ".query", f"no real world (env.world or --world) to run it in{UNJUDGED}", "warning")
            elif usable and world_tools is not None:
                for f, m in _compile_state(item.query, task, spec, worlds):
                    # one task file may serve a class, an MCP server and a schema-only run alike
                    err(where + ".query" if f == "" else f, m, "warning" if m.endswith(UNJUDGED) else "error")
    for i, ex in enumerate(task.examples):
        if tools and ex.tool not in tools:
            err(f"examples[{i}].tool", f"unknown tool {ex.tool!r}")
        elif tools and isinstance(ex.arguments, dict):
            if problem := schema_error(ex.arguments, tools[ex.tool].function.parameters):
                err(f"examples[{i}].arguments", problem)
    if task.reference is not None and tools:
        for i, call in enumerate(task.reference.calls):
            if call.name not in tools:
                err(f"reference.calls[{i}].name", f"unknown tool {call.name!r}")
    return out


def _label(spec: Any) -> str:
    return repr(spec_label(spec))


def _compile_state(sql: str, task: Task, spec: Any, worlds: _Worlds) -> list[tuple[str, str]]:
    provider, failure = worlds.provider(spec)
    if provider is None:
        return [("env.world", f"cannot load world {spec!r}: {failure}")]
    if getattr(provider, "kind", "") == "mcp":
        return [("", f"world {_label(spec)} is an MCP server: it has no SQL state to query{UNJUDGED}")]
    env = provider.open(task.env or EnvRef())
    try:
        db = getattr(env, "db", None)
        if not isinstance(db, sqlite3.Connection):
            if not callable(getattr(env, "query", None)):
                return [("", f"world {spec!r} has no SQL state to query{UNJUDGED}")]
            return []
        try:
            db.execute(f"EXPLAIN {sql}")
        except sqlite3.Error as e:
            return [("", f"does not compile against world {spec!r}: {e}")]
        return []
    finally:
        provider.close_environment(env)
