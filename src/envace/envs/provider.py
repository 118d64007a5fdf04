"""The one protocol every real environment meets, whatever form the user brings it in.

A :class:`WorldProvider` lists the tools and opens one fresh :class:`Environment` per episode;
an environment answers ``call(name, arguments)`` with a JSON value, never raising on model input
(a failed call is a structured ``{"error": {...}}``). Three kinds implement it: the embedded
SQLite worlds (and a user's own :class:`~envace.envs.world.World` subclass), a user's Python
tools (:mod:`envace.envs.python_tools`) and an MCP server (:mod:`envace.envs.mcp_world`).
"""

from __future__ import annotations

import json
import math
from concurrent.futures import Future
from typing import Any, ClassVar, Protocol

from envace.core.errors import INVALID_PARAMETERS, TOOL_NOT_AVAILABLE, tool_error
from envace.core.types import EnvRef, ToolCall, ToolSpec
from envace.core.validate import schema_error

# A tool raised or failed inside the environment (not a bad call): the caller may recover.
TOOL_EXECUTION_ERROR = "TOOL_EXECUTION_ERROR"
# The environment itself is gone or did not answer (server crashed, hung, refused).
ENVIRONMENT_ERROR = "ENVIRONMENT_ERROR"


class Environment(Protocol):
    """One episode's real world. Optional extras: ``query(sql)`` (for ``state`` checklist items),
    ``submit(name, arguments) -> Future`` (calls of many episodes run concurrently), ``close()``."""

    def call(self, name: str, arguments: dict) -> Any: ...


class WorldProvider:
    """Makes a fresh environment per episode. ``kind`` says what it is (sqlite | python | mcp)."""

    kind: ClassVar[str] = ""

    def __init__(self, spec: str) -> None:
        self.spec = spec

    def tools(self) -> list[ToolSpec]:
        raise NotImplementedError

    def open(self, env: EnvRef) -> Environment:
        raise NotImplementedError

    def close_environment(self, environment: Any) -> None:
        close = getattr(environment, "close", None)
        if callable(close):
            close()

    def shutdown(self) -> None:
        """Release what the provider holds (an event loop, servers); called once per run."""


class SQLiteWorlds(WorldProvider):
    """A :class:`~envace.envs.world.World` subclass: ``World(seed)`` is the fresh episode."""

    kind = "sqlite"

    def __init__(self, cls: type, spec: str) -> None:
        super().__init__(spec)
        self.cls = cls

    def tools(self) -> list[ToolSpec]:
        return [ToolSpec.model_validate(s.model_dump()) for s in self.cls._specs.values()]  # type: ignore[attr-defined]

    def open(self, env: EnvRef) -> Environment:
        return self.cls(env.seed)


def check_call(name: Any, arguments: Any, specs: dict[str, ToolSpec]) -> dict | None:
    """The strict-API checks a real tool applies before running: known name, an object of
    finite, encodable values that meets the tool's schema. None when the call may run."""
    if not isinstance(name, str) or name not in specs:
        return tool_error(TOOL_NOT_AVAILABLE, f"Tool {name!r} is not available", available=sorted(specs))
    if not isinstance(arguments, dict):
        return tool_error(INVALID_PARAMETERS, "arguments must be a JSON object")
    if bad := bad_value(arguments):
        return tool_error(INVALID_PARAMETERS, bad)
    problem = schema_error(arguments, specs[name].function.parameters)
    if problem is not None:
        return tool_error(INVALID_PARAMETERS, problem, tool=name)
    return None


def bad_value(value: Any, depth: int = 0) -> str | None:
    """What jsonschema lets through but a tool (or JSON) would choke on."""
    if depth > 64:
        return "arguments are nested too deeply"
    if isinstance(value, float) and not math.isfinite(value):
        return "numbers must be finite"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "strings must be valid UTF-8"
    if isinstance(value, dict):
        return next((e for k, v in value.items() if (e := bad_value(k, depth + 1) or bad_value(v, depth + 1))), None)
    if isinstance(value, list):
        return next((e for v in value if (e := bad_value(v, depth + 1))), None)
    return None


def json_safe(value: Any) -> Any:
    """A tool's return value as plain JSON: what JSON cannot hold (dates, sets, objects) becomes
    its string form, so a user's tool returning a datetime still answers."""
    try:
        return json.loads(json.dumps(value, default=str, allow_nan=False, ensure_ascii=False))
    except (TypeError, ValueError, RecursionError):
        return str(value)


def recorded(name: Any, arguments: Any) -> ToolCall:
    """A call as the environment received it, for ``calls`` (kept even when its args are junk)."""
    try:
        args = json.loads(json.dumps(arguments)) if isinstance(arguments, dict) else {}
    except (TypeError, ValueError, RecursionError):
        args = {}
    return ToolCall(name=str(name), arguments=args)


def done(value: Any) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut


def table_digests(query: Any, tables: list[str] | None = None) -> dict[str, str]:
    """sha256 of each table's rows (sorted, so row order does not matter) via ``query(sql)``; all
    tables but SQLite's own when ``tables`` is None. The end state a task's ``end_state`` item
    compares: any write the reference did not make changes some table's digest."""
    import hashlib

    if tables is None:
        tables = [r[0] for r in query("SELECT name FROM sqlite_master WHERE type = 'table' "
                                      "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    out = {}
    for t in tables:
        rows = sorted(json.dumps(list(r), default=str) for r in query(f'SELECT * FROM "{t}"'))
        out[t] = hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]
    return out
