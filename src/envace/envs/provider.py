"""The one protocol every real environment meets, whatever form the user brings it in.

A :class:`WorldProvider` lists the tools and opens one fresh :class:`Environment` per episode;
an environment answers ``call(name, arguments)`` with a JSON value, never raising on model input
(a failed call is a structured ``{"error": {...}}``). Three kinds implement it: the embedded
SQLite worlds (and a user's own :class:`~envace.envs.world.World` subclass), a user's Python
tools (:mod:`envace.envs.python_tools`) and an MCP server (:mod:`envace.envs.mcp_world`).
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import hashlib
import json
import math
import threading
import uuid
import warnings
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

    def args_ignored(self) -> str | None:
        """Why a task's ``env.args`` would reach nothing here (None: something receives them)."""
        return None


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

    def args_ignored(self) -> str | None:
        return f"{self.spec} is a SQLite World: its state comes from env.seed, and env.args reach nothing"


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


class ToolResultWarning(UserWarning):
    """A tool's result was changed on its way to the agent (converted by ``str()`` or truncated)."""


# Longest result (as JSON text) an agent is shown; longer ones are cut with TRUNCATION_MARK.
MAX_RESULT_CHARS = 8000
TRUNCATION_MARK = "… [envace: result truncated: {shown} of {total} characters shown]"


def to_json(value: Any, stringified: list[str] | None = None, depth: int = 0) -> Any:
    """A tool's return value as plain JSON, the same text in every process: sets sorted,
    dataclasses and pydantic models as dicts, tuples as lists, dates as ISO 8601, enums by value,
    non-finite floats as null. Anything else becomes ``str(value)``; its type name is appended to
    ``stringified`` so the caller can warn."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth > 64:
        return _stringified(value, stringified)
    d = depth + 1
    if isinstance(value, dict):
        return {(k if isinstance(k, str) else _key(k, stringified)): to_json(v, stringified, d)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v, stringified, d) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [to_json(v, stringified, d) for v in value]
        return sorted(items, key=lambda x: json.dumps(x, sort_keys=True, ensure_ascii=False))
    if isinstance(value, enum.Enum):
        return to_json(value.value, stringified, d)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value) if not value.is_finite() else (int(value) if value == value.to_integral_value()
                                                            and abs(value) < 2 ** 53 else float(value))
    if isinstance(value, uuid.UUID):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json({f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, stringified, d)
    dump = getattr(value, "model_dump", None)  # a pydantic model
    if callable(dump) and not isinstance(value, type):
        try:
            return to_json(dump(mode="json"), stringified, d)
        except Exception:  # noqa: BLE001 - a model that cannot dump itself is stringified below
            pass
    return _stringified(value, stringified)


def _key(key: Any, stringified: list[str] | None) -> str:
    if isinstance(key, (bool, int, float)) or key is None:
        return json.dumps(key)  # as json.dumps would write the key
    converted = to_json(key, stringified)
    return converted if isinstance(converted, str) else json.dumps(converted, sort_keys=True, ensure_ascii=False)


def _stringified(value: Any, stringified: list[str] | None) -> str:
    if stringified is not None:
        stringified.append(type(value).__name__)
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - a __str__ that raises: still an answer
        return f"<{type(value).__name__}>"


def json_safe(value: Any) -> Any:
    """:func:`to_json` without the report of what was stringified."""
    return to_json(value)


def cap_result(value: Any, max_chars: int = MAX_RESULT_CHARS) -> tuple[Any, int | None]:
    """(value, None) when its JSON text fits ``max_chars``; else (the text cut to ``max_chars``
    with a marker saying so, the original length)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if len(text) <= max_chars:
        return value, None
    return text[:max_chars] + TRUNCATION_MARK.format(shown=max_chars, total=len(text)), len(text)


class ResultPolicy:
    """Turns one provider's raw tool results into what the agent sees (JSON, capped), warning once
    per tool about a conversion by ``str()`` and about truncation, with advice that applies."""

    def __init__(self, label: str, max_result_chars: int = MAX_RESULT_CHARS, setting: str = "max_result_chars") -> None:
        self.label, self.max_result_chars, self.setting = label, max_result_chars, setting
        self._warned: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def _once(self, tool: str, what: str) -> bool:
        with self._lock:
            if (tool, what) in self._warned:
                return False
            self._warned.add((tool, what))
            return True

    def apply(self, tool: str, raw: Any, limit: int | None = None) -> Any:
        converted: list[str] = []
        value = to_json(raw, converted)
        if converted and self._once(tool, "str"):
            warnings.warn(f"{self.label}: tool {tool!r} returned {', '.join(sorted(set(converted)))} values, which JSON "
                          "cannot hold; envace sent their str() text. Return JSON types (dict, list, str, "
                          "int, float, bool, None; sets, tuples, dataclasses, pydantic models and dates are "
                          "converted for you)", ToolResultWarning, stacklevel=2)
        limit = self.max_result_chars if limit is None else limit
        value, total = cap_result(value, limit)
        if total is not None and self._once(tool, "cap"):
            warnings.warn(f"{self.label}: tool {tool!r} returned {total} characters; the agent sees the first "
                          f"{limit} and a truncation mark. Make the tool return less (a page, a limit "
                          f"argument, only the fields asked for), or raise {self.setting} if the agent "
                          "really needs it all", ToolResultWarning, stacklevel=2)
        return value


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
    if tables is None:
        tables = [r[0] for r in query("SELECT name FROM sqlite_master WHERE type = 'table' "
                                      "AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    out = {}
    for t in tables:
        rows = sorted(json.dumps(list(r), default=str) for r in query(f'SELECT * FROM "{t}"'))
        out[t] = hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]
    return out
