"""Behaviour every world shares: schemas, validation errors, call recording, determinism, query."""

from __future__ import annotations

import json
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from envace.core.errors import INVALID_PARAMETERS, TOOL_NOT_AVAILABLE, error_code, is_error
from envace.core.types import ToolCall
from envace.envs import WORLDS, World, make_world, world_names
from envace.envs.tasks import generate_tasks, task_set

NAMES = world_names()


def dump(world: World) -> list[str]:
    return list(world.db.iterdump())


def test_registry_lists_the_three_worlds():
    assert set(NAMES) == {"shop", "calendar", "bank"}
    assert all(WORLDS[n].name == n for n in NAMES)
    assert isinstance(make_world("bank", 3), WORLDS["bank"])


def test_unknown_world_names_the_known_ones():
    with pytest.raises(ValueError, match="shop.*calendar.*bank"):
        make_world("casino", 0)


@pytest.mark.parametrize("name", NAMES)
def test_tool_schemas_are_complete(name):
    tools = make_world(name, 0).tools()
    assert 6 <= len(tools) <= 12
    assert len({t.name for t in tools}) == len(tools)
    for t in tools:
        params = t.function.parameters
        Draft202012Validator.check_schema(params)
        assert t.function.description
        assert params["type"] == "object" and params["additionalProperties"] is False
        assert set(params["required"]) <= set(params["properties"])
        for prop in params["properties"].values():
            assert prop.get("description") and ("type" in prop or "enum" in prop)


@pytest.mark.parametrize("name", NAMES)
def test_tools_returns_copies(name):
    w = make_world(name, 0)
    original = [t.model_dump() for t in w.tools()]
    for t in w.tools():
        t.function.parameters.clear()
        t.function.description = "changed"
    assert [t.model_dump() for t in w.tools()] == original == [
        t.model_dump() for t in make_world(name, 1).tools()]


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_world_other_seed_other_world(name):
    assert dump(make_world(name, 7)) == dump(make_world(name, 7))
    assert dump(make_world(name, 7)) != dump(make_world(name, 8))


def _replay_write_task(name: str, world: World | None = None) -> World:
    """Run the reference of the first generated task that changes state; returns its world."""
    task = next(t for t in generate_tasks(name, n=6, n_examples=0)
                if any(i.kind == "state" for i in t.checklist))
    world = world or make_world(name, task.env.seed)
    for c in task.reference.calls:
        assert not is_error(world.call(c.name, c.arguments))
    return world


@pytest.mark.parametrize("name", NAMES)
def test_fresh_world_is_a_reset(name):
    changed = _replay_write_task(name)
    pristine = dump(make_world(name, changed.seed))
    assert dump(changed) != pristine
    assert dump(make_world(name, changed.seed)) == pristine


@pytest.mark.parametrize("name", NAMES)
def test_validation_errors(name):
    w = make_world(name, 0)
    assert error_code(w.call("no_such_tool", {})) == TOOL_NOT_AVAILABLE
    assert error_code(w.call(None, {})) == TOOL_NOT_AVAILABLE  # type: ignore[arg-type]
    tool = next(t for t in w.tools() if t.function.parameters["required"])
    params = tool.function.parameters
    assert error_code(w.call(tool.name, {})) == INVALID_PARAMETERS  # missing required
    assert error_code(w.call(tool.name, [1, 2])) == INVALID_PARAMETERS  # type: ignore[arg-type]
    bad = {k: 12345 if params["properties"][k].get("type") == "string" else "x"
           for k in params["required"]}
    assert error_code(w.call(tool.name, bad)) == INVALID_PARAMETERS  # wrong types
    extra = w.call(tool.name, {"unexpected": 1})
    assert error_code(extra) == INVALID_PARAMETERS and "message" in extra["error"]


@pytest.mark.parametrize("name", NAMES)
def test_every_call_is_recorded_even_invalid_ones(name):
    w = make_world(name, 0)
    args = {"a": [1, {"b": 2}]}
    results = [w.call("nope", args), w.call(w.tools()[0].name, {"zzz": 1})]
    args["a"].append(3)  # the record is a copy, not the caller's object
    assert [c for c, _ in w.calls] == [ToolCall(name="nope", arguments={"a": [1, {"b": 2}]}),
                                       ToolCall(name=w.tools()[0].name, arguments={"zzz": 1})]
    assert [r for _, r in w.calls] == results


@pytest.mark.parametrize("name", NAMES)
def test_query_is_read_only(name):
    w = make_world(name, 0)
    table = w.query("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
    assert table and all(isinstance(r, list) for r in table)
    before = dump(w)
    with pytest.raises(sqlite3.Error):
        w.query(f"DELETE FROM {table[-1][0]}")
    with pytest.raises(sqlite3.Error):
        w.query("SELECT * FROM no_such_table")
    assert dump(w) == before
    seeded = make_world(name, _replay_write_task(name).seed)
    with pytest.raises(sqlite3.Error):
        seeded.query(f"DROP TABLE {table[-1][0]}")
    _replay_write_task(name, seeded)  # tools can still write after a refused query


@pytest.mark.parametrize("name", NAMES)
def test_sampled_calls_of_every_tool_give_json_results(name):
    """Plausible arguments for every tool, over several seeds: JSON out, errors well formed."""
    import random

    ts = task_set(name)
    assert set(ts.samplers) == {t.name for t in make_world(name, 0).tools()}
    ok = set()
    for seed in range(6):
        w = make_world(name, seed)
        rng = random.Random(seed)
        for tool, sampler in ts.samplers.items():
            for _ in range(3):
                args = sampler(w, rng)
                if args is None:
                    continue
                result = w.call(tool, args)
                json.dumps(result)
                assert isinstance(result, dict)
                if is_error(result):
                    assert set(result) == {"error"} and result["error"]["message"]
                    assert result["error"]["code"] not in (TOOL_NOT_AVAILABLE, INVALID_PARAMETERS)
                else:
                    ok.add(tool)
    assert ok == set(ts.samplers)  # every tool succeeds at least sometimes


# -- property tests: no input makes call() raise --------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _ids(world: World) -> list[str]:
    """Real ids and names from the world, so fuzzed calls also reach the domain logic."""
    out = []
    tables = [r[0] for r in world.query("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for t in tables:
        cols = [r[1] for r in world.query(f"PRAGMA table_info({t})")]
        for col in {"id", "email", "name", "product_id", "order_id"} & set(cols):
            out += [r[0] for r in world.query(f"SELECT {col} FROM {t} LIMIT 8") if r[0]]
    return out


def _value(schema: dict, ids: list[str]) -> st.SearchStrategy:
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True) | st.sampled_from(
                ["2025-06-03", "2025-03-01", "2025-09-10", "2024-02-30", "09:30", "23:59"])
        return st.sampled_from(ids) | st.text(max_size=15)
    if kind == "integer":
        return st.integers(schema.get("minimum", -5), schema.get("maximum", 10**6))
    if kind == "number":
        return st.floats(0, 5000) | st.integers(0, 5000) | st.sampled_from([0.01, 12.5, 100.125])
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        return st.lists(st.sampled_from(ids) | st.text(max_size=8), max_size=3)
    return JSON


def _arguments(tool, ids: list[str]) -> st.SearchStrategy:
    props, required = tool.function.parameters["properties"], tool.function.parameters["required"]
    shaped = st.fixed_dictionaries(
        {k: _value(v, ids) for k, v in props.items() if k in required},
        optional={k: _value(v, ids) for k, v in props.items() if k not in required})
    loose = st.dictionaries(st.sampled_from([*props, "extra"]), JSON, max_size=4)
    return shaped | loose


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_calls_never_raise(name, data):
    world = make_world(name, data.draw(st.integers(0, 3)))
    ids = _ids(world)
    for _ in range(3):  # a few calls in a row, so writes meet changed state
        tool = data.draw(st.sampled_from(world.tools()))
        name_ = data.draw(st.just(tool.name) | st.text(max_size=8))
        args = data.draw(_arguments(tool, ids) | JSON)
        result = world.call(name_, args)
        json.dumps(result)
        assert isinstance(result, dict)
    assert len(world.calls) == 3
