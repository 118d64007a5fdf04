"""The base of every executable tool world: SQLite state built from a seed, tools as methods.

A world is the ground truth the project measures rehearsal against, so ``call`` behaves like a
strict real API: it never raises on bad model input, it answers with a structured error instead,
and it records every call it receives (valid or not) in ``self.calls``.
"""

from __future__ import annotations

import copy
import random
import sqlite3
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable
from datetime import date
from typing import Any, ClassVar

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from envace.core.errors import INVALID_PARAMETERS, TOOL_NOT_AVAILABLE, tool_error
from envace.core.types import FunctionSpec, ToolCall, ToolSpec
from envace.envs.provider import bad_value

# Tool schemas come from these small builders so that every world spells types the same way.
ID = {"type": "string", "minLength": 1, "maxLength": 40}
DATE = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$", "description": "ISO date, YYYY-MM-DD."}
TIME = {"type": "string", "pattern": r"^([01]\d|2[0-3]):[0-5]\d$", "description": "24-hour time, HH:MM."}
MONEY = {"type": "number", "exclusiveMinimum": 0, "maximum": 1_000_000, "description": "Amount in USD."}


def prop(base: dict[str, Any], description: str, **extra: Any) -> dict[str, Any]:
    """A property schema: ``base`` with its own description and extra keywords."""
    return {**base, **extra, "description": description}


def enum(values: list[str], description: str) -> dict[str, Any]:
    return {"type": "string", "enum": values, "description": description}


def integer(lo: int, hi: int, description: str) -> dict[str, Any]:
    return {"type": "integer", "minimum": lo, "maximum": hi, "description": description}


class ToolFailure(Exception):
    """Raised inside a tool method for a domain error; ``call`` turns it into ``tool_error``."""

    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.code, self.message, self.details = code, message, details


def found(row: dict[str, Any] | None, code: str, message: str) -> dict[str, Any]:
    """``row``, or a :class:`ToolFailure` (``code``, ``message``) where the lookup found none."""
    if row is None:
        raise ToolFailure(code, message)
    return row


def tool(
    description: str,
    properties: dict[str, dict[str, Any]] | None = None,
    required: tuple[str, ...] = (),
    writes: bool = False,
) -> Callable[[Callable[..., dict]], Callable[..., dict]]:
    """Mark a World method as a tool; its name is the method name.

    ``writes`` says the tool changes state: the task generator runs example calls of such tools
    on a throwaway world so that examples all show the same initial state.
    """

    def mark(fn: Callable[..., dict]) -> Callable[..., dict]:
        params = {
            "type": "object",
            "properties": properties or {},
            "required": list(required),
            "additionalProperties": False,
        }
        fn._tool_spec = ToolSpec(  # type: ignore[attr-defined]
            function=FunctionSpec(name=fn.__name__, description=description, parameters=params)
        )
        fn._tool_writes = writes  # type: ignore[attr-defined]
        return fn

    return mark


def money(cents: int) -> str:
    """Amounts go out as decimal strings ("42.50"), as payment APIs do, so cents never get lost."""
    sign = "-" if cents < 0 else ""
    return f"{sign}{abs(cents) // 100}.{abs(cents) % 100:02d}"


def to_cents(amount: float) -> int:
    cents = round(amount * 100)
    if abs(amount * 100 - cents) > 1e-6:
        raise ToolFailure("INVALID_AMOUNT", f"Amount {amount} has more than two decimal places")
    return cents


def parse_date(value: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise ToolFailure("INVALID_DATE", f"{value!r} is not a valid calendar date") from None


_BASE_SCHEMA = "CREATE TABLE sequences(name TEXT PRIMARY KEY, next INT);\n"
_CAN_SERIALIZE = hasattr(sqlite3.Connection, "serialize")
_IMAGE_CACHE_SIZE = 2048  # ~4 KB each compressed: a few MB for every seed of all suites
_IMAGES: OrderedDict[tuple[type, int], bytes] = OrderedDict()
_IMAGE_LOCK = threading.Lock()


QUERY_TIME_LIMIT_S = 2.0
_READ_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
_READ_PRAGMAS = {"table_info", "table_xinfo", "table_list", "index_list", "index_info", "foreign_key_list"}


def _read_only(action: int, arg1: Any = None, arg2: Any = None, *_: Any) -> int:
    if action in _READ_ACTIONS:
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and arg1 in _READ_PRAGMAS:
        return sqlite3.SQLITE_OK  # schema introspection; these pragmas cannot write
    return sqlite3.SQLITE_DENY


class World:
    """A SQLite-backed tool world; ``World(seed)`` builds it, a fresh instance is the reset."""

    name: ClassVar[str] = ""
    today: ClassVar[date]
    schema: ClassVar[str] = ""  # CREATE TABLE statements
    _specs: ClassVar[dict[str, ToolSpec]] = {}
    _validators: ClassVar[dict[str, Draft202012Validator]] = {}
    writing_tools: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        specs: dict[str, ToolSpec] = {}
        writes: set[str] = set()
        for klass in reversed(cls.__mro__):  # definition order, subclasses may override
            for attr in vars(klass).values():
                if spec := getattr(attr, "_tool_spec", None):
                    specs[spec.name] = spec
                    if attr._tool_writes:
                        writes.add(spec.name)
        cls._specs = specs
        cls._validators = {n: Draft202012Validator(s.function.parameters) for n, s in specs.items()}
        cls.writing_tools = frozenset(writes)

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.calls: list[tuple[ToolCall, dict]] = []
        self.db = sqlite3.connect(":memory:")
        image = self._image(seed)
        if image is None:  # an SQLite without serialize(): populate every time
            self.db.executescript(_BASE_SCHEMA + self.schema)
            with self.db:
                self.populate(random.Random(f"{self.name}:{seed}"))
        else:
            self.db.deserialize(zlib.decompress(image))

    @classmethod
    def _image(cls, seed: int) -> bytes | None:
        """The populated DB of ``seed``, built once and kept compressed (a few KB): loading it
        is much faster than populating, and generation, replay and evaluation all build the
        same seeds' worlds again and again."""
        if not _CAN_SERIALIZE:
            return None
        key = (cls, seed)
        with _IMAGE_LOCK:
            if key in _IMAGES:
                _IMAGES.move_to_end(key)
                return _IMAGES[key]
        db = sqlite3.connect(":memory:")
        db.executescript(_BASE_SCHEMA + cls.schema)
        builder = cls.__new__(cls)
        builder.db = db
        with db:
            builder.populate(random.Random(f"{cls.name}:{seed}"))
        image = zlib.compress(db.serialize(), 1)
        db.close()
        with _IMAGE_LOCK:
            _IMAGES[key] = image
            if len(_IMAGES) > _IMAGE_CACHE_SIZE:
                _IMAGES.popitem(last=False)
        return image

    def populate(self, rng: random.Random) -> None:
        """Fill the tables; all randomness must come from ``rng`` and all state must live in
        ``self.db`` (the populated DB is copied, the instance is not)."""
        raise NotImplementedError

    # -- public API -----------------------------------------------------------------------

    def tools(self) -> list[ToolSpec]:
        """Fresh copies, so that a caller editing a task's tools cannot change the world's."""
        return [ToolSpec.model_validate(s.model_dump()) for s in self._specs.values()]

    def call(self, name: str, arguments: dict) -> dict:
        result = self._dispatch(name, arguments)
        try:  # a copy, keyed by strings as in JSON, so the record cannot change afterwards
            recorded = ({str(k): copy.deepcopy(v) for k, v in arguments.items()}
                        if isinstance(arguments, dict) else {})
        except Exception:  # uncopyable junk from a buggy caller: keep the call, drop the args
            recorded = {}
        self.calls.append((ToolCall(name=str(name), arguments=recorded), result))
        return result

    def query(self, sql: str, time_limit_s: float = QUERY_TIME_LIMIT_S) -> list[list]:
        """Run one read-only statement from a task file; sqlite3.Error propagates. An authorizer
        allows reading only (no ATTACH, which would create a file, no PRAGMA, no writes), and a
        progress handler stops a query that runs past ``time_limit_s``."""
        deadline = time.monotonic() + time_limit_s
        self.db.set_authorizer(_read_only)
        self.db.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        try:
            return [list(row) for row in self.db.execute(sql).fetchall()]
        finally:
            self.db.set_progress_handler(None, 0)
            self.db.set_authorizer(None)

    # -- helpers for subclasses -----------------------------------------------------------

    def rows(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        cur = self.db.execute(sql, params)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]

    def row(self, sql: str, *params: Any) -> dict[str, Any] | None:
        found = self.rows(sql, *params)
        return found[0] if found else None

    def scalar(self, sql: str, *params: Any) -> Any:
        r = self.db.execute(sql, params).fetchone()
        return r[0] if r else None

    def by_id(self, table: str, thing: str, value: str) -> dict[str, Any]:
        """The ``table`` row whose ``id`` is ``value``; an unknown id is ``<THING>_NOT_FOUND``."""
        return found(self.row(f"SELECT * FROM {table} WHERE id = ?", value), f"{thing.upper()}_NOT_FOUND",
                     f"No {thing} with id {value!r}")

    def next_number(self, sequence: str) -> int:
        """Take the next number of an id sequence (returns, disputes...) started by ``start_sequence``."""
        n = self.scalar("SELECT next FROM sequences WHERE name = ?", sequence)
        self.db.execute("UPDATE sequences SET next = next + 1 WHERE name = ?", (sequence,))
        return n

    def start_sequence(self, sequence: str, first: int) -> None:
        self.db.execute("INSERT INTO sequences VALUES (?, ?)", (sequence, first))

    # -- dispatch -------------------------------------------------------------------------

    def _dispatch(self, name: Any, arguments: Any) -> dict:
        if not isinstance(name, str) or name not in self._specs:
            return tool_error(
                TOOL_NOT_AVAILABLE,
                f"Tool {name!r} is not available",
                available=sorted(self._specs),
            )
        if not isinstance(arguments, dict):
            return tool_error(INVALID_PARAMETERS, "arguments must be a JSON object")
        if bad := bad_value(arguments):
            return tool_error(INVALID_PARAMETERS, bad)
        error = best_match(self._validators[name].iter_errors(arguments))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "arguments"
            return tool_error(INVALID_PARAMETERS, f"{where}: {error.message}")
        args = self._coerce(name, arguments)
        try:
            with self.db:  # a failing tool leaves no half-written state
                return getattr(self, name)(**args)
        except ToolFailure as failure:
            return tool_error(failure.code, failure.message, **failure.details)

    def _coerce(self, name: str, arguments: dict) -> dict:
        """jsonschema accepts 2.0 as an integer; hand the tool a real int."""
        props = self._specs[name].function.parameters["properties"]
        return {
            k: int(v) if props[k].get("type") == "integer" and isinstance(v, float) else v
            for k, v in arguments.items()
        }
