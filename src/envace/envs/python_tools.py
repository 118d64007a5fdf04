"""A real environment from plain Python: a module of typed, docstring'd functions, or a class whose
public methods are the tools.

Schemas are derived, never hand-written: ``transformers.utils.get_json_schema`` reads the type
hints and the Google-style docstring (``Args:`` must describe every parameter); a parameter typed
with a TypedDict, a dataclass or a pydantic model (or a list / dict / union of them) gets its full
nested shape from pydantic's ``TypeAdapter`` (``$defs`` inlined, so each schema stands alone), and
arrives in the call as that type. A class gets one instance per episode and, if it defines
``reset(**args)``, that is called with the task's ``env.args`` (as TRL's ``environment_factory``
does); ``reset``, ``close`` and ``query`` are reserved, not tools. ``query(sql)`` on the class, if
present, answers ``state`` checklist items. A tool that raises becomes a structured
``TOOL_EXECUTION_ERROR`` the caller can recover from (``envace.envs.world.ToolFailure(code,
message)`` sets its own code).

Each episode's instance lives in a worker thread of its own (made, called and closed there, so a
sqlite3 connection it opens keeps working). A call that runs past ``timeout_s`` answers
``TOOL_EXECUTION_ERROR`` "timed out after N s"; a thread cannot be killed, so that instance is
abandoned (left to finish in the background) and the episode's next call gets a fresh one.
Results are converted to JSON deterministically and capped at ``max_result_chars``
(:class:`~envace.envs.provider.ResultPolicy`). ``@envace.tool(read_only=True, timeout_s=...,
max_result_chars=...)`` (or ``@envace.readonly``) on a tool sets these per tool, on a class for all
its tools; ``read_only`` becomes the tool's ``annotations`` (MCP's ``readOnlyHint`` /
``destructiveHint``), and a tool without it counts as one that writes.
"""

from __future__ import annotations

import dataclasses
import inspect
import queue
import threading
import types
import typing
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable

import typing_extensions
from pydantic import BaseModel, TypeAdapter, ValidationError

from envace.core.errors import INVALID_PARAMETERS, tool_error
from envace.core.types import EnvRef, ToolCall, ToolSpec
from envace.envs.provider import (ENVIRONMENT_ERROR, MAX_RESULT_CHARS, TOOL_EXECUTION_ERROR, ResultPolicy, WorldProvider, check_call,
                                  recorded)

DEFAULT_TIMEOUT_S = 30.0  # as an MCP world's timeout_s
RESERVED = frozenset({"reset", "close", "query"})
OPTIONS_ATTR = "__envace_tool__"


@dataclasses.dataclass(frozen=True)
class ToolOptions:
    """What ``@envace.tool`` records on a tool (or, on a class, the default for its tools)."""

    read_only: bool | None = None  # None: unknown, judged as a tool that writes
    destructive: bool | None = None  # a write that deletes or overwrites (MCP's destructiveHint)
    timeout_s: float | None = None
    max_result_chars: int | None = None

    def merged(self, default: ToolOptions | None) -> ToolOptions:
        if default is None:
            return self
        return ToolOptions(**{f.name: getattr(self, f.name) if getattr(self, f.name) is not None
                              else getattr(default, f.name) for f in dataclasses.fields(self)})

    def annotations(self) -> dict[str, Any] | None:
        if self.read_only is None and self.destructive is None:
            return None
        out: dict[str, Any] = {}
        if self.read_only is not None:
            out["readOnlyHint"] = self.read_only
        if self.destructive is not None and not self.read_only:
            out["destructiveHint"] = self.destructive
        return out


def tool(fn: Any = None, *, read_only: bool | None = None, destructive: bool | None = None,
         timeout_s: float | None = None, max_result_chars: int | None = None) -> Any:
    """Mark a tool function / method (or a class: the default for all its tools) with settings:
    ``read_only`` (becomes ``annotations.readOnlyHint``; unknown means it writes), ``destructive``,
    ``timeout_s`` per call, ``max_result_chars`` shown to the agent. Usable bare or with arguments."""
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    if max_result_chars is not None and not (isinstance(max_result_chars, int) and max_result_chars > 0):
        raise ValueError(f"max_result_chars must be a positive integer, got {max_result_chars!r}")
    options = ToolOptions(read_only, destructive, timeout_s, max_result_chars)

    def mark(target: Any) -> Any:
        setattr(target, OPTIONS_ATTR, options)
        return target

    return mark if fn is None else mark(fn)


def readonly(fn: Any) -> Any:
    """``@envace.readonly``: the tool only reads (``annotations: {"readOnlyHint": true}``)."""
    return tool(fn, read_only=True)


def _options(fn: Any, owner: Any = None) -> ToolOptions:
    own = getattr(fn, OPTIONS_ATTR, None)
    default = getattr(owner, OPTIONS_ATTR, None) if isinstance(owner, type) else None
    own = own if isinstance(own, ToolOptions) else ToolOptions()
    return own.merged(default if isinstance(default, ToolOptions) else None)


class ToolSchemaError(ValueError):
    """A function cannot be turned into a tool schema (no type hints, an undocumented argument)."""


def _is_typeddict(hint: Any) -> bool:
    """A ``typing.TypedDict`` or a ``typing_extensions.TypedDict`` (``typing.is_typeddict`` does not
    know the latter before Python 3.12, and pydantic requires it there)."""
    return typing.is_typeddict(hint) or typing_extensions.is_typeddict(hint)


def _is_structured(hint: Any, depth: int = 0) -> bool:
    """A hint that transformers cannot turn into a schema but pydantic can: a TypedDict, a
    dataclass or a pydantic model, alone or inside a list / dict / union / Optional."""
    if depth > 8:
        return False
    if isinstance(hint, type):
        if _is_typeddict(hint) or dataclasses.is_dataclass(hint):
            return True
        try:
            if issubclass(hint, BaseModel):
                return True
        except TypeError:
            return False
    return any(_is_structured(a, depth + 1) for a in typing.get_args(hint) if not isinstance(a, (str, int, float)))


def pydantic_hint(hint: Any, memo: dict[int, Any] | None = None) -> Any:
    """``hint`` with every ``typing.TypedDict`` rebuilt as a ``typing_extensions.TypedDict``
    (which pydantic requires before Python 3.12), inside lists, dicts, unions, Annotated and the
    fields of other TypedDicts (a ``typing_extensions`` one is rebuilt only when a field changes)."""
    memo = {} if memo is None else memo
    if id(hint) in memo:
        return memo[id(hint)]
    if isinstance(hint, type) and _is_typeddict(hint):
        native = type(hint) is type(typing_extensions.TypedDict("_X", {}))
        memo[id(hint)] = hint  # a recursive TypedDict refers to itself as it is
        optional = getattr(hint, "__optional_keys__", frozenset())
        marks = {typing_extensions.NotRequired, typing_extensions.Required}
        fields, changed = {}, False
        for k, v in typing.get_type_hints(hint, include_extras=True).items():
            mark = typing.get_origin(v)
            if mark in marks:  # NotRequired[...] read from the hint itself (string annotations hide it
                # from the class's __optional_keys__ before Python 3.12)
                inner = typing.get_args(v)[0]
                new = pydantic_hint(inner, memo)
                fields[k] = mark[new]
            else:
                inner, new = v, pydantic_hint(v, memo)
                fields[k] = typing_extensions.NotRequired[new] if k in optional else new
            changed = changed or new is not inner
        if native and not changed:
            return hint
        out = typing_extensions.TypedDict(hint.__name__, fields)  # type: ignore[operator]
        out.__doc__ = hint.__doc__
        memo[id(hint)] = out
        return out
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is None or not args:
        return hint
    if origin is typing.Annotated:
        return typing.Annotated[(pydantic_hint(args[0], memo), *args[1:])]  # type: ignore[valid-type]
    if origin is typing.Literal:
        return hint
    new = tuple(pydantic_hint(a, memo) for a in args)
    if new == args:
        return hint
    if origin in (typing.Union, types.UnionType):
        return typing.Union[new]  # type: ignore[valid-type]
    try:
        return origin[new] if len(new) > 1 else origin[new[0]]
    except TypeError:  # an origin that cannot be subscripted again: leave it to pydantic as it is
        return hint


# Keywords whose value is one schema / a list of schemas / a map of name -> schema.
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def _inline(schema: Any, defs: dict[str, Any], seen: tuple[str, ...] = ()) -> Any:
    """``schema`` with each ``#/$defs/X`` replaced by X and pydantic's auto ``title``s dropped.
    A recursive type keeps its ``$ref`` (its ``$defs`` go to the top of the parameters)."""
    if not isinstance(schema, dict):
        return schema
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        name = ref[len("#/$defs/"):]
        if name in defs and name not in seen:
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            return {**_inline(defs[name], defs, (*seen, name)), **_inline(rest, defs, seen)}
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title":
            continue
        if key in _ONE and isinstance(value, dict):
            out[key] = _inline(value, defs, seen)
        elif key in _MANY and isinstance(value, list):
            out[key] = [_inline(v, defs, seen) for v in value]
        elif key in _MAP and isinstance(value, dict) and key not in ("$defs", "definitions"):
            out[key] = {k: _inline(v, defs, seen) for k, v in value.items()}
        else:
            out[key] = value
    return out


def _uses_ref(schema: Any) -> bool:
    if isinstance(schema, dict):
        return "$ref" in schema or any(_uses_ref(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_uses_ref(v) for v in schema)
    return False


def _closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object that lists its keys and says
    nothing about others (a TypedDict, a dataclass, a pydantic model with the default ``extra``):
    an unknown key is then refused by name, as at the top level, instead of dropped unseen. A
    model that allows extra keys says so (``additionalProperties: true``) and keeps it."""
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _ONE or key in _MANY:
            out[key] = _closed(value)
        elif key in _MAP and isinstance(value, dict):
            out[key] = {k: _closed(v) for k, v in value.items()}
        else:
            out[key] = value
    if isinstance(out.get("properties"), dict) and out.get("type", "object") == "object":
        out.setdefault("additionalProperties", False)
    return out


def pydantic_schema(hint: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the JSON schema of ``hint`` with its definitions inlined, the definitions a recursive type still needs)."""
    raw = _closed(TypeAdapter(pydantic_hint(hint)).json_schema())
    defs = raw.pop("$defs", {}) or {}
    inlined = _inline(raw, defs)
    if not _uses_ref(inlined):
        return inlined, {}
    return inlined, {k: _inline(v, defs, (k,)) for k, v in defs.items()}


def function_schema(fn: Callable[..., Any], where: str, options: ToolOptions | None = None) -> ToolSpec:
    from transformers.utils import get_json_schema  # heavy import: only when Python tools are used

    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - unresolvable hints: transformers reports them below
        hints = {}
    structured = {n: h for n, h in hints.items() if n != "return" and _is_structured(h)}
    try:
        schema = get_json_schema(_plain_proxy(fn, hints, structured) if structured else fn)
    except Exception as e:  # DocstringParsingException, TypeHintParsingException
        raise ToolSchemaError(f"{where}: tool {fn.__name__!r}: {e} (tools need type hints and a Google-style "
                              "docstring whose 'Args:' section describes every parameter)") from None
    function = dict(schema["function"])
    function.pop("return", None)  # not part of the OpenAI tool format
    params = dict(function.get("parameters") or {"type": "object", "properties": {}})
    props = {k: _nullable(v) for k, v in (params.get("properties") or {}).items()}
    all_defs: dict[str, Any] = {}
    for name, hint in structured.items():
        try:
            shape, defs = pydantic_schema(hint)
        except Exception as e:  # noqa: BLE001 - pydantic cannot describe it: say which parameter
            raise ToolSchemaError(f"{where}: tool {fn.__name__!r}: parameter {name!r}: no JSON schema for "
                                  f"{hint!r} ({type(e).__name__}: {e})") from None
        if name in props and props[name].get("description"):
            shape = {**shape, "description": props[name]["description"]}
        props[name] = shape
        all_defs.update(defs)
    params["properties"] = props
    if all_defs:
        params["$defs"] = all_defs
    params.setdefault("required", [])
    params["additionalProperties"] = False  # a strict API: unknown arguments are an error, not ignored
    function["parameters"] = params
    annotations = (options or ToolOptions()).annotations()
    return ToolSpec.model_validate({"type": "function", "function": function,
                                    **({"annotations": annotations} if annotations else {})})


def _plain_proxy(fn: Callable[..., Any], hints: dict[str, Any], structured: dict[str, Any]) -> Callable[..., Any]:
    """``fn``'s signature and docstring with structured hints replaced by ``dict``, for
    transformers to read the rest (descriptions, plain parameters, defaults)."""
    sig = inspect.signature(fn)
    params = [p.replace(annotation=dict if p.name in structured else hints.get(p.name, p.annotation))
              for p in sig.parameters.values()]

    def proxy(*args: Any, **kwargs: Any) -> None:
        return None

    proxy.__name__, proxy.__doc__ = fn.__name__, fn.__doc__
    proxy.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    proxy.__annotations__ = {p.name: p.annotation for p in params if p.annotation is not inspect.Parameter.empty}
    if "return" in hints:
        proxy.__annotations__["return"] = dict if _is_structured(hints["return"]) else hints["return"]
    return proxy


def _nullable(prop: dict[str, Any]) -> dict[str, Any]:
    """``nullable`` is OpenAPI, not JSON Schema: spell ``x | None`` as a type that admits null (and,
    for an enumeration, an enum that lists null: ``enum`` alone would still refuse it)."""
    if not prop.get("nullable"):
        return prop
    prop = {k: v for k, v in prop.items() if k != "nullable"}
    t = prop.get("type")
    if isinstance(t, str):
        prop["type"] = [t, "null"]
    elif isinstance(t, list) and "null" not in t:
        prop["type"] = [*t, "null"]
    if isinstance(prop.get("enum"), list) and None not in prop["enum"]:
        prop["enum"] = [*prop["enum"], None]
    return prop


def _public_functions(module: types.ModuleType) -> dict[str, Callable[..., Any]]:
    """Functions defined in the module itself (not imported into it), not starting with '_'."""
    names = getattr(module, "__all__", None)
    out = {}
    for name, obj in vars(module).items():
        if name.startswith("_") or name in RESERVED or not inspect.isfunction(obj):
            continue
        if names is not None and name not in names:
            continue
        if names is None and obj.__module__ != module.__name__:
            continue
        out[name] = obj
    return out


def _public_methods(cls: type) -> list[str]:
    return [name for name, obj in inspect.getmembers(cls)
            if not name.startswith("_") and name not in RESERVED and inspect.isfunction(obj)]


@dataclasses.dataclass
class _Tool:
    spec: ToolSpec
    options: ToolOptions
    structured: dict[str, Any]  # parameter -> its hint, validated into that type before the call


class PythonTools(WorldProvider):
    """Tools from a module of functions or a class (one instance per episode)."""

    kind = "python"

    def __init__(self, target: types.ModuleType | type, spec: str, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_result_chars: int = MAX_RESULT_CHARS) -> None:
        super().__init__(spec)
        self.target = target
        self.timeout_s, self.max_result_chars = timeout_s, max_result_chars
        where = getattr(target, "__file__", None) or getattr(target, "__qualname__", spec)
        if isinstance(target, type):
            names = _public_methods(target)
            fns = {n: getattr(target, n) for n in names}
        else:
            fns = _public_functions(target)
        if not fns:
            raise ToolSchemaError(f"{spec}: no tools found (public functions of a module, or public methods of a "
                                  "class, other than reset/close/query)")
        self._tools: dict[str, _Tool] = {}
        for n, f in fns.items():
            options = _options(f, target)
            try:
                hints = typing.get_type_hints(f)
            except Exception:  # noqa: BLE001 - unresolvable hints: the schema comes from the signature alone
                hints = {}
            self._tools[n] = _Tool(function_schema(f, where, options), options,
                                   {k: pydantic_hint(h) for k, h in hints.items() if k != "return" and _is_structured(h)})
        self._specs = {n: t.spec for n, t in self._tools.items()}
        self.results = ResultPolicy(spec, max_result_chars,
                                    setting="max_result_chars (@envace.tool(max_result_chars=...))")

    def tools(self) -> list[ToolSpec]:
        return [ToolSpec.model_validate(s.model_dump()) for s in self._specs.values()]

    def open(self, env: EnvRef) -> PythonEnvironment:
        if not isinstance(self.target, type) and env.args:
            raise ValueError(f"{self.spec}: a module of functions has no reset(); task env.args {sorted(env.args)} "
                             "need a class with reset(**args)")
        return PythonEnvironment(self, env)

    def args_ignored(self) -> str | None:
        if not isinstance(self.target, type):
            return f"{self.spec} is a module of functions: it has no reset(**args) to receive env.args"
        if not callable(getattr(self.target, "reset", None)):
            return f"{self.spec}: class {self.target.__name__} has no reset(**args) to receive env.args"
        return None

    def timeout_for(self, name: str) -> float:
        t = self._tools.get(name)
        return (t.options.timeout_s if t is not None and t.options.timeout_s else None) or self.timeout_s


class _Worker:
    """A daemon thread that owns one episode's tool instance and runs everything on it."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="envace-python-tool", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fn, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - delivered to the waiting caller
                fut.set_exception(e)

    def run(self, fn: Callable[[], Any]) -> Future:
        fut: Future = Future()
        self.jobs.put((fn, fut))
        return fut

    def stop(self) -> None:
        self.jobs.put(None)


class TimedOut(Exception):
    pass


class PythonEnvironment:
    """One episode's instance (or the module), in a worker thread of its own. Records every call
    it receives, like a World."""

    def __init__(self, provider: PythonTools, env: EnvRef) -> None:
        self.provider, self.env, self.specs = provider, env, provider._specs
        self.calls: list[tuple[ToolCall, Any]] = []
        self.abandoned = 0  # instances left to a call that timed out
        self.dead: str | None = None
        self.closed = False
        self._start()
        if callable(getattr(self.owner, "query", None)):
            self.query = self._query  # state checklist items

    def _start(self) -> None:
        """A worker and a fresh instance made in it (``reset(**env.args)`` included)."""
        target, args = self.provider.target, dict(self.env.args)

        def make() -> Any:
            if not isinstance(target, type):
                return target
            instance = target()
            reset = getattr(instance, "reset", None)
            if callable(reset):
                reset(**args)
            return instance

        self.worker = _Worker()
        fut = self.worker.run(make)
        try:
            self.owner = fut.result(timeout=self.provider.timeout_s)
        except FutureTimeout:
            self.worker.stop()
            raise ValueError(f"{self.provider.spec}: making the tool instance (and reset(**env.args)) took longer "
                             f"than {self.provider.timeout_s:g} s") from None

    def _run(self, fn: Callable[[], Any], timeout_s: float, restart: bool = True) -> Any:
        if self.closed:
            raise RuntimeError("the episode's tool instance is closed")
        fut = self.worker.run(fn)
        try:
            return fut.result(timeout=timeout_s)
        except FutureTimeout:
            # A thread cannot be stopped: leave it (and its instance) to finish on its own, and
            # give the rest of the episode a fresh instance.
            self.worker.stop()
            self.abandoned += 1
            if not restart:
                raise TimedOut(f"timed out after {timeout_s:g} s") from None
            try:
                self._start()
            except Exception as e:  # noqa: BLE001 - no fresh instance: the rest of the episode says why
                self.dead = f"{self.provider.spec}: no fresh instance after a timeout: {type(e).__name__}: {e}"[:500]
            raise TimedOut(f"timed out after {timeout_s:g} s") from None

    def _query(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        owner = self.owner
        try:
            return self._run(lambda: owner.query(sql, *args, **kwargs), self.provider.timeout_s)
        except TimedOut as e:
            raise TimeoutError(f"query {e}") from None

    def call(self, name: str, arguments: dict) -> Any:
        result = check_call(name, arguments, self.specs)
        if result is None:
            result = self._call(name, arguments)
        self.calls.append((recorded(name, arguments), result))
        return result

    def _call(self, name: str, arguments: dict) -> Any:
        if self.dead is not None:
            return tool_error(ENVIRONMENT_ERROR, self.dead)
        tool_ = self.provider._tools[name]
        kwargs = dict(arguments)
        if tool_.structured:
            for k, hint in tool_.structured.items():
                if k in kwargs:
                    try:
                        kwargs[k] = TypeAdapter(hint).validate_python(kwargs[k])
                    except ValidationError as e:
                        err = e.errors()[0]
                        where = "/".join(map(str, (k, *err["loc"])))
                        return tool_error(INVALID_PARAMETERS, f"{where}: {err['msg']}", tool=name)
        method = getattr(self.owner, name)
        timeout_s = self.provider.timeout_for(name)
        try:
            raw = self._run(lambda: method(**kwargs), timeout_s)
        except TimedOut as e:
            return tool_error(TOOL_EXECUTION_ERROR, f"{name}: {e}")
        except Exception as e:  # the user's code: any failure is the tool's error, not the run's
            code = getattr(e, "code", None)
            code = code if isinstance(code, str) and code else TOOL_EXECUTION_ERROR
            return tool_error(code, f"{type(e).__name__}: {getattr(e, 'message', None) or e}"[:500])
        return self.provider.results.apply(name, raw, tool_.options.max_result_chars)

    def close(self) -> None:
        if self.closed:
            return
        close = getattr(self.owner, "close", None)
        if callable(close) and not isinstance(self.owner, types.ModuleType):
            try:
                self._run(close, self.provider.timeout_s, restart=False)
            except Exception:  # noqa: BLE001 - the episode is over; a failing close must not lose it
                pass
        self.closed = True
        self.worker.stop()
