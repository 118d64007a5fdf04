"""A real environment from plain Python: a module of typed, docstring'd functions, or a class whose
public methods are the tools.

Schemas are derived, never hand-written: ``transformers.utils.get_json_schema`` reads the type
hints and the Google-style docstring (``Args:`` must describe every parameter). A class gets one
instance per episode and, if it defines ``reset(**args)``, that is called with the task's
``env.args`` (as TRL's ``environment_factory`` does); ``reset``, ``close`` and ``query`` are
reserved, not tools. ``query(sql)`` on the class, if present, answers ``state`` checklist items.
A tool that raises becomes a structured ``TOOL_EXECUTION_ERROR`` the caller can recover from
(``envace.envs.world.ToolFailure(code, message)`` sets its own code).
"""

from __future__ import annotations

import inspect
import types
from typing import Any, Callable

from envace.core.errors import tool_error
from envace.core.types import EnvRef, ToolCall, ToolSpec
from envace.envs.provider import TOOL_EXECUTION_ERROR, WorldProvider, check_call, json_safe, recorded

RESERVED = frozenset({"reset", "close", "query"})


class ToolSchemaError(ValueError):
    """A function cannot be turned into a tool schema (no type hints, an undocumented argument)."""


def function_schema(fn: Callable[..., Any], where: str) -> ToolSpec:
    from transformers.utils import get_json_schema  # heavy import: only when Python tools are used

    try:
        schema = get_json_schema(fn)
    except Exception as e:  # DocstringParsingException, TypeHintParsingException
        raise ToolSchemaError(f"{where}: tool {fn.__name__!r}: {e} (tools need type hints and a Google-style "
                              "docstring whose 'Args:' section describes every parameter)") from None
    function = dict(schema["function"])
    function.pop("return", None)  # not part of the OpenAI tool format
    params = dict(function.get("parameters") or {"type": "object", "properties": {}})
    params["properties"] = {k: _nullable(v) for k, v in (params.get("properties") or {}).items()}
    params.setdefault("required", [])
    params["additionalProperties"] = False  # a strict API: unknown arguments are an error, not ignored
    function["parameters"] = params
    return ToolSpec.model_validate({"type": "function", "function": function})


def _nullable(prop: dict[str, Any]) -> dict[str, Any]:
    """``nullable`` is OpenAPI, not JSON Schema: spell ``x | None`` as a type that admits null."""
    if not prop.get("nullable"):
        return prop
    prop = {k: v for k, v in prop.items() if k != "nullable"}
    t = prop.get("type")
    if isinstance(t, str):
        prop["type"] = [t, "null"]
    elif isinstance(t, list) and "null" not in t:
        prop["type"] = [*t, "null"]
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


class PythonTools(WorldProvider):
    """Tools from a module of functions or a class (one instance per episode)."""

    kind = "python"

    def __init__(self, target: types.ModuleType | type, spec: str) -> None:
        super().__init__(spec)
        self.target = target
        where = getattr(target, "__file__", None) or getattr(target, "__qualname__", spec)
        if isinstance(target, type):
            names = _public_methods(target)
            fns = {n: getattr(target, n) for n in names}
        else:
            fns = _public_functions(target)
        if not fns:
            raise ToolSchemaError(f"{spec}: no tools found (public functions of a module, or public methods of a "
                                  "class, other than reset/close/query)")
        self._specs = {n: function_schema(f, where) for n, f in fns.items()}

    def tools(self) -> list[ToolSpec]:
        return [ToolSpec.model_validate(s.model_dump()) for s in self._specs.values()]

    def open(self, env: EnvRef) -> PythonEnvironment:
        if isinstance(self.target, type):
            instance = self.target()
            reset = getattr(instance, "reset", None)
            if callable(reset):
                reset(**env.args)
            return PythonEnvironment(instance, self._specs)
        if env.args:
            raise ValueError(f"{self.spec}: a module of functions has no reset(); task env.args {sorted(env.args)} "
                             "need a class with reset(**args)")
        return PythonEnvironment(self.target, self._specs)


class PythonEnvironment:
    """One episode's instance (or the module). Records every call it receives, like a World."""

    def __init__(self, owner: Any, specs: dict[str, ToolSpec]) -> None:
        self.owner, self.specs = owner, specs
        self.calls: list[tuple[ToolCall, Any]] = []
        if callable(getattr(owner, "query", None)):
            self.query = owner.query  # state checklist items

    def call(self, name: str, arguments: dict) -> Any:
        result = check_call(name, arguments, self.specs)
        if result is None:
            try:
                result = json_safe(getattr(self.owner, name)(**arguments))
            except Exception as e:  # the user's code: any failure is the tool's error, not the run's
                code = getattr(e, "code", None)
                code = code if isinstance(code, str) and code else TOOL_EXECUTION_ERROR
                result = tool_error(code, f"{type(e).__name__}: {getattr(e, 'message', None) or e}"[:500])
        self.calls.append((recorded(name, arguments), result))
        return result

    def close(self) -> None:
        close = getattr(self.owner, "close", None)
        if callable(close) and not isinstance(self.owner, types.ModuleType):
            try:
                close()
            except Exception:  # the episode is over; a failing close must not lose it
                pass
