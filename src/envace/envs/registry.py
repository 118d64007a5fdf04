"""Which worlds exist, and how a world spec becomes a :class:`WorldProvider`.

A spec is one of:

* a registered name: the ``envace.worlds`` entry-point group (the built-in shop / calendar /
  bank register there too, in envace's own pyproject; a user's package adds its own);
* an import path ``package.module:Name`` or a file ``path/to/tools.py[:Name]``: a ``World``
  subclass, a class whose public methods are tools, a module of tool functions, or a ready
  :class:`WorldProvider`;
* an MCP server: ``mcp:COMMAND ARGS`` (stdio, started by envace) or ``http(s)://.../mcp``, a
  YAML file of its settings (``world.yaml``: command or url, reset_tool, timeouts), or an
  :class:`~envace.envs.mcp_world.MCPSpec` (from a config's ``world:`` mapping).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import importlib.util
import sys
import types
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from envace.envs.bank import BankWorld
from envace.envs.calendar import CalendarWorld
from envace.envs.mcp_world import MCPSpec, MCPWorld
from envace.envs.provider import SQLiteWorlds, WorldProvider
from envace.envs.python_tools import PythonTools
from envace.envs.shop import ShopWorld
from envace.envs.world import World

ENTRY_POINT_GROUP = "envace.worlds"
# The embedded worlds with task generators (envs.tasks). They are also entry points; this map is
# what a source checkout without installed metadata still finds.
WORLDS: dict[str, type[World]] = {w.name: w for w in (ShopWorld, CalendarWorld, BankWorld)}


def world_names() -> list[str]:
    """The embedded worlds that generate their own tasks."""
    return list(WORLDS)


def world_class(name: str) -> type[World]:
    try:
        return WORLDS[name]
    except KeyError:
        raise ValueError(f"Unknown world {name!r}; known worlds: {', '.join(WORLDS)}") from None


def make_world(name: str, seed: int) -> World:
    return world_class(name)(seed)


def registered_worlds() -> dict[str, str]:
    """Name -> ``module:attr`` of every world in the ``envace.worlds`` entry-point group."""
    found = {name: f"{cls.__module__}:{cls.__qualname__}" for name, cls in WORLDS.items()}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found[ep.name] = ep.value
    return found


def _import_file(path: Path) -> types.ModuleType:
    """A tool file that is not part of a package, imported once per resolved path."""
    path = path.resolve()
    name = "envace_user_" + path.stem + "_" + hashlib.sha1(str(path).encode()).hexdigest()[:8]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path}: cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's module: whatever it raises is reported as one ValueError
        del sys.modules[name]
        raise ValueError(f"{path}: importing it failed: {type(e).__name__}: {e}") from None
    return module


def import_object(target: str) -> Any:
    """``package.module[:attr.path]`` or ``path/to/file.py[:attr.path]``."""
    head, _, attr = target.partition(":")
    if head.endswith(".py") or "/" in head:
        path = Path(head)
        if not path.is_file():
            raise ValueError(f"world {target!r}: {path} is not a file")
        obj: Any = _import_file(path)
    else:
        try:
            obj = importlib.import_module(head)
        except ImportError as e:
            raise ValueError(f"world {target!r}: cannot import {head!r} ({e})") from None
    for part in filter(None, attr.split(".")):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"world {target!r}: {head} has no attribute {part!r}") from None
    return obj


def provider_for(obj: Any, spec: str) -> WorldProvider:
    if isinstance(obj, WorldProvider):
        return obj
    if isinstance(obj, type) and issubclass(obj, World):
        return SQLiteWorlds(obj, spec)
    if isinstance(obj, type) and issubclass(obj, WorldProvider):
        return obj(spec)
    if isinstance(obj, MCPSpec):
        return MCPWorld(obj)
    if isinstance(obj, (type, types.ModuleType)):
        return PythonTools(obj, spec)
    raise ValueError(f"world {spec!r} is a {type(obj).__name__}: expected a World subclass, a class or module of "
                     "tool functions, an MCPSpec or a WorldProvider")


def resolve_world(spec: str | MCPSpec | dict) -> WorldProvider:
    """The provider a world spec names (see the module docstring); a clear ValueError otherwise."""
    if isinstance(spec, dict):
        spec = MCPSpec.model_validate(spec)
    if isinstance(spec, MCPSpec):
        return MCPWorld(spec)
    s = str(spec).strip()
    if not s:
        raise ValueError("empty world spec")
    if s.startswith(("mcp:", "http://", "https://")):
        return MCPWorld(MCPSpec.parse(s))
    if s.endswith((".yaml", ".yml")):
        return MCPWorld(_mcp_file(Path(s)))
    known = registered_worlds()
    if s in known:
        return provider_for(import_object(known[s]), s)
    if ":" in s or "/" in s or s.endswith(".py") or "." in s:
        return provider_for(import_object(s), s)
    if importlib.util.find_spec(s) is not None:  # a top-level module of tool functions
        return provider_for(import_object(s), s)
    raise ValueError(f"unknown world {s!r}: not registered ({', '.join(sorted(known))}), not an import path "
                     "(package.module:Name or path/to/tools.py) and not an MCP server (mcp:COMMAND or http://...)")


def _mcp_file(path: Path) -> MCPSpec:
    """An MCP server's settings in a YAML file (command or url, reset_tool, timeouts, ...)."""
    if not path.is_file():
        raise ValueError(f"world {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: an MCP world file is a mapping (command or url, reset_tool, timeout_s, ...)")
    try:
        return MCPSpec.model_validate(data.get("mcp", data))
    except ValidationError as e:
        err = e.errors()[0]
        raise ValueError(f"{path}: field '{'.'.join(map(str, err['loc'])) or 'mcp'}': {err['msg']}") from None


def spec_label(spec: str | MCPSpec | dict | None) -> str:
    """A world spec for people (logs, reports); a mapping is not validated here."""
    if spec is None:
        return "none"
    if isinstance(spec, MCPSpec):
        return spec.label()
    if isinstance(spec, dict):
        return spec.get("url") or "mcp:" + " ".join(map(str, spec.get("command") or []))
    return str(spec)


def spec_key(spec: str | MCPSpec | dict) -> str:
    """Identity of a world spec, for caching one provider per spec (settings included)."""
    if isinstance(spec, MCPSpec):
        spec = spec.model_dump()
    return spec if isinstance(spec, str) else json.dumps(spec, sort_keys=True, default=str)
