"""A user's own environment: Python tool functions or classes, import paths, the entry-point group."""

import sys

import pytest

from envace.core.errors import error_code
from envace.core.types import EnvRef, Reference, Task, ToolCall
from envace.envs.provider import SQLiteWorlds, TOOL_EXECUTION_ERROR
from envace.envs.python_tools import PythonTools, ToolSchemaError
from envace.envs.registry import registered_worlds, resolve_world
from envace.rollout.actors import OracleActor
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.sources import RealSource

CLASS_TOOLS = '''
from datetime import date


class Counter:
    """Tools as methods; one instance per episode."""

    def reset(self, start: int = 0):
        self.value = start

    def add(self, amount: int, note: str | None = None) -> dict:
        """Add to the counter.

        Args:
            amount: How much to add.
            note: Why.
        """
        if amount < 0:
            raise ValueError("amount must not be negative")
        self.value += amount
        return {"value": self.value, "on": date(2026, 1, 2)}

    def read(self) -> int:
        """The counter's value."""
        return self.value

    def _secret(self):
        return 1
'''

FUNCTION_TOOLS = '''
import json  # imported names are not tools


def shout(text: str) -> str:
    """Upper-case a text.

    Args:
        text: What to shout.
    """
    return text.upper()


def _helper():
    pass
'''


@pytest.fixture
def tools_dir(tmp_path, monkeypatch):
    (tmp_path / "counter_tools.py").write_text(CLASS_TOOLS)
    (tmp_path / "shout_tools.py").write_text(FUNCTION_TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("counter_tools", "shout_tools"):
        sys.modules.pop(name, None)


def test_a_class_gives_derived_schemas_and_one_reset_instance_per_episode(tools_dir):
    world = resolve_world("counter_tools:Counter")
    assert isinstance(world, PythonTools)
    specs = {t.name: t.function for t in world.tools()}
    assert set(specs) == {"add", "read"}  # reset / private methods are not tools
    add = specs["add"].parameters
    assert add["properties"]["amount"] == {"type": "integer", "description": "How much to add."}
    assert add["properties"]["note"]["type"] == ["string", "null"] and add["required"] == ["amount"]
    assert specs["add"].description == "Add to the counter."
    a, b = world.open(EnvRef(args={"start": 10})), world.open(EnvRef())
    assert a.call("add", {"amount": 5}) == {"value": 15, "on": "2026-01-02"}  # a date answers as text
    assert b.call("read", {}) == 0  # episodes do not share the instance
    err = a.call("add", {"amount": -1})
    assert error_code(err) == TOOL_EXECUTION_ERROR and "must not be negative" in err["error"]["message"]
    assert error_code(a.call("add", {"amount": "5"})) == "INVALID_PARAMETERS"
    assert error_code(a.call("add", {"amount": 1, "extra": 2})) == "INVALID_PARAMETERS"
    assert error_code(a.call("_secret", {})) == "TOOL_NOT_AVAILABLE"
    assert a.call("read", {}) == 15 and len(a.calls) == 6  # every call recorded, rejected ones too


def test_a_module_of_functions_and_a_file_path(tools_dir):
    by_module = resolve_world("shout_tools")
    assert [t.name for t in by_module.tools()] == ["shout"]
    by_file = resolve_world(str(tools_dir / "shout_tools.py"))
    assert by_file.open(EnvRef()).call("shout", {"text": "hi"}) == "HI"
    with pytest.raises(ValueError, match="reset"):
        by_file.open(EnvRef(args={"seed": 1}))


def test_tools_without_docs_or_hints_are_refused_with_the_reason(tmp_path, monkeypatch):
    (tmp_path / "bad_tools.py").write_text("def f(x):\n    return x\n")
    with pytest.raises(ToolSchemaError, match="tool 'f'.*Args"):
        resolve_world(str(tmp_path / "bad_tools.py"))


def test_unknown_specs_say_what_a_spec_can_be():
    with pytest.raises(ValueError, match="unknown world 'nowhere'.*import path"):
        resolve_world("nowhere")
    with pytest.raises(ValueError, match="cannot import"):
        resolve_world("no_such_pkg.mod:Thing")
    with pytest.raises(ValueError, match="is not a file"):
        resolve_world("missing/tools.py:X")


def test_builtin_worlds_and_a_users_package_register_through_entry_points(tmp_path, monkeypatch):
    assert isinstance(resolve_world("shop"), SQLiteWorlds)
    (tmp_path / "acme_tools.py").write_text(FUNCTION_TOOLS)
    dist = tmp_path / "acme_tools-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-tools\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[envace.worlds]\nacme = acme_tools\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert registered_worlds()["acme"] == "acme_tools"
    assert [t.name for t in resolve_world("acme").tools()] == ["shout"]
    sys.modules.pop("acme_tools", None)


def test_episodes_in_python_tools_with_the_runs_world(tools_dir):
    world = resolve_world("counter_tools:Counter")
    task = Task(id="t", instruction="add 2", tools=world.tools(), env=EnvRef(args={"start": 1}),
                checklist=[{"kind": "called", "tool": "add", "args": {"amount": 2}},
                           {"kind": "answer_contains", "text": "3"},
                           {"kind": "state", "query": "SELECT 1", "equals": [[1]]}],
                reference=Reference(calls=[ToolCall(name="add", arguments={"amount": 2})], answer="now 3"))
    source = RealSource("counter_tools:Counter")
    (traj,), _ = run_episodes([task], OracleActor(), source, RolloutConfig(max_turns=3))
    source.close()
    assert traj.reward == 1.0
    assert traj.verdicts[2].met is None and "no SQL state" in traj.verdicts[2].detail
    no_world = task.model_copy(update={"env": None})
    with pytest.raises(ValueError, match="no 'env' world and the run names none"):
        RealSource().start(no_world)


SQLITE_WORLD = '''
from envace.envs.world import World, tool, ToolFailure


class Ledger(World):
    name = "ledger"
    schema = "CREATE TABLE entries(id TEXT PRIMARY KEY, amount INT);"

    def populate(self, rng):
        for i in range(3):
            self.db.execute("INSERT INTO entries VALUES (?, ?)", (f"x-{i}", rng.randint(1, 9)))

    @tool("Delete an entry.", {"entry_id": {"type": "string"}}, ("entry_id",), writes=True)
    def delete_entry(self, entry_id):
        if self.scalar("SELECT count(*) FROM entries WHERE id = ?", entry_id) == 0:
            raise ToolFailure("NOT_FOUND", f"no entry {entry_id}")
        self.db.execute("DELETE FROM entries WHERE id = ?", (entry_id,))
        return {"deleted": entry_id}
'''


def test_a_users_world_subclass_by_file_path_runs_state_items(tmp_path):
    (tmp_path / "ledger.py").write_text(SQLITE_WORLD)
    spec = str(tmp_path / "ledger.py") + ":Ledger"
    world = resolve_world(spec)
    assert isinstance(world, SQLiteWorlds) and [t.name for t in world.tools()] == ["delete_entry"]
    task = Task(id="l", instruction="delete x-1", tools=world.tools(), env=EnvRef(world=spec, seed=4),
                checklist=[{"kind": "state", "query": "SELECT id FROM entries ORDER BY id", "equals": [["x-0"], ["x-2"]]}],
                reference=Reference(calls=[ToolCall(name="delete_entry", arguments={"entry_id": "x-1"})], answer="ok"))
    source = RealSource()
    (traj,), _ = run_episodes([task], OracleActor(), source, RolloutConfig(max_turns=3))
    source.close()
    assert traj.reward == 1.0
    env = world.open(EnvRef(seed=4))
    assert error_code(env.call("delete_entry", {"entry_id": "x-9"})) == "NOT_FOUND"
