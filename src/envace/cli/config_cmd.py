"""``envace config``: every training config field with its type, default and description; and the
check that a ``--set`` key names a real field (with the nearest one suggested when it does not)."""

from __future__ import annotations

import argparse
import difflib
import json
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

# envace.experiments.config is imported where it is used: it pulls in torch, and this module loads
# for `envace --help`.


@dataclass(frozen=True)
class FieldInfo:
    path: str  # dotted, as --set and the YAML name it
    type: str
    default: str
    description: str
    section: bool  # a nested section (its own fields follow), not a value
    open: bool = False  # a mapping: keys below it are free (e.g. world's MCP settings)


def _models(annotation: Any) -> list[type[BaseModel]]:
    args = typing.get_args(annotation) or (annotation,)
    return [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]


def _is_mapping(annotation: Any) -> bool:
    args = typing.get_args(annotation) or (annotation,)
    return any(a is dict or typing.get_origin(a) is dict for a in args)


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) if isinstance(a, str) else str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return "null"
    if origin is not None:
        inner = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    return json.dumps(value) if not isinstance(value, float) else f"{value:g}"


def config_fields(model: type[BaseModel] | None = None, prefix: str = "") -> list[FieldInfo]:
    """Every field of the training config (``TrainConfig``), sections first then their fields."""
    if model is None:
        from envace.experiments.config import TrainConfig

        model = TrainConfig
    out: list[FieldInfo] = []
    for name, field in model.model_fields.items():
        path = prefix + name
        subs = _models(field.annotation)
        doc = field.description or (" ".join((subs[0].__doc__ or "").split()) if subs else "")
        out.append(FieldInfo(path, _type_name(field.annotation), _default(field), doc or "", bool(subs),
                             _is_mapping(field.annotation)))
        for sub in subs:
            out.extend(config_fields(sub, path + "."))
    return out


def check_override_keys(overrides: list[str]) -> None:
    """Refuse a ``--set KEY=VALUE`` whose key is no config field, naming the flag and the nearest
    field; the values themselves are checked with the config."""
    from envace.experiments.config import ConfigError

    fields = config_fields()
    known = {f.path: f for f in fields}
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if "=" not in item or not key:
            continue  # apply_overrides says what is wrong with its form
        parts = key.split(".")
        # below a mapping field (world: {command: ...}) any key goes
        if any(known.get(".".join(parts[:i])) and known[".".join(parts[:i])].open for i in range(1, len(parts))):
            continue
        if key in known:
            continue
        near = difflib.get_close_matches(key, [f.path for f in fields if not f.section], n=1, cutoff=0.6)
        hint = f"; did you mean '{near[0]}'?" if near else "; `envace config` lists the fields"
        raise ConfigError(f"--set {item}: unknown field '{key}'{hint}")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="list every training config field: type, default, description")
    p.add_argument("match", nargs="?", default="", help="only fields whose dotted name contains this")
    p.set_defaults(func=_list)


def _list(args: argparse.Namespace) -> int:
    for f in config_fields():
        if args.match and args.match not in f.path:
            continue
        if f.section:
            print(f"\n{f.path}:  (section: set its fields as {f.path}.NAME)")
        else:
            print(f"{f.path}: {f.type} = {f.default}")
        for line in textwrap.wrap(f.description, 76):
            print("    " + line)
    return 0
