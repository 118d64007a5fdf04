"""Schemas derived from a user's Python tools refuse what the tool would not accept and accept
what its hints allow: unknown keys inside a TypedDict / dataclass / pydantic argument are an
INVALID_PARAMETERS error naming the key (not dropped before the tool runs), ``typing_extensions``
TypedDicts are understood on Python 3.11, and an optional enumeration accepts null."""

from __future__ import annotations

import pytest

from envace.core.errors import error_code
from envace.core.types import EnvRef
from envace.envs.registry import resolve_world

TOOLS = '''
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypedDict

import typing_extensions
from pydantic import BaseModel, ConfigDict

Team = Literal["net", "desk"]


class Filters(TypedDict, total=False):
    status: str


class TeFilters(typing_extensions.TypedDict, total=False):
    status: str
    inner: Filters


@dataclass
class Line:
    sku: str


class Note(BaseModel):
    text: str


class Loose(BaseModel):
    model_config = ConfigDict(extra="allow")
    text: str


class Desk:
    def search(self, filters: Filters | None = None, team: Team | None = None) -> list:
        """Search.

        Args:
            filters: What to match.
            team: Only this team.
        """
        return [filters, team]

    def search_te(self, filters: TeFilters) -> dict:
        """Search, typed with typing_extensions.

        Args:
            filters: What to match.
        """
        return dict(filters)

    def order(self, lines: list[Line], note: Note, loose: Loose | None = None) -> str:
        """Order.

        Args:
            lines: What to send.
            note: A note.
            loose: Anything goes here.
        """
        return ",".join(l.sku for l in lines) + note.text + (loose.text if loose else "")

    def flat(self, n: int, team: Team = "net") -> int:
        """A flat tool.

        Args:
            n: How many.
            team: Which team.
        """
        return n
'''


@pytest.fixture
def desk(tmp_path):
    path = tmp_path / "desk_tools.py"
    path.write_text(TOOLS)
    world = resolve_world(f"{path}:Desk")
    env = world.open(EnvRef())
    yield world, env
    env.close()
    world.shutdown()


def _invalid(result: object, *words: str) -> bool:
    return error_code(result) == "INVALID_PARAMETERS" and all(w in result["error"]["message"] for w in words)


def test_unknown_keys_inside_nested_arguments_are_refused_by_name(desk):
    world, env = desk
    assert env.call("search", {"filters": {"status": "open"}}) == [{"status": "open"}, None]
    assert _invalid(env.call("search", {"filters": {"stauts": "open"}}), "stauts")
    assert _invalid(env.call("search_te", {"filters": {"inner": {"stauts": "x"}}}), "stauts")
    assert _invalid(env.call("order", {"lines": [{"sku": "a", "qty": 2}], "note": {"text": "x"}}), "qty")
    assert _invalid(env.call("order", {"lines": [{"sku": "a"}], "note": {"text": "x", "colour": "red"}}), "colour")
    # a model that allows extra keys keeps allowing them
    assert env.call("order", {"lines": [{"sku": "a"}], "note": {"text": "x"}, "loose": {"text": "y", "z": 1}}) == "axy"
    params = {t.name: t.function.parameters for t in world.tools()}
    loose = next(a for a in params["order"]["properties"]["loose"]["anyOf"] if a.get("type") == "object")
    assert loose["additionalProperties"] is True
    assert params["order"]["properties"]["note"]["additionalProperties"] is False


def test_a_typing_extensions_typeddict_gets_its_nested_shape(desk):
    world, env = desk
    params = {t.name: t.function.parameters for t in world.tools()}["search_te"]
    shape = params["properties"]["filters"]
    assert shape["type"] == "object" and shape["additionalProperties"] is False
    assert shape["properties"]["status"] == {"type": "string"}
    assert shape["properties"]["inner"] == {"type": "object", "properties": {"status": {"type": "string"}},
                                            "additionalProperties": False}
    assert env.call("search_te", {"filters": {"status": "open", "inner": {"status": "x"}}}) == {
        "status": "open", "inner": {"status": "x"}}


def test_an_optional_enum_accepts_null_and_a_plain_enum_does_not(desk):
    world, env = desk
    params = {t.name: t.function.parameters for t in world.tools()}
    assert params["search"]["properties"]["team"]["enum"] == ["net", "desk", None]
    assert env.call("search", {"team": None}) == [None, None]
    assert env.call("search", {"team": "desk"}) == [None, "desk"]
    assert _invalid(env.call("search", {"team": "ops"}), "team")
    # without None in the hint, null stays refused and the flat schema is as transformers writes it
    assert params["flat"]["properties"]["team"] == {"type": "string", "enum": ["net", "desk"],
                                                    "description": "Which team."}
    assert _invalid(env.call("flat", {"n": 1, "team": None}), "team")
