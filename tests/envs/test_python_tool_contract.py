"""What a user's Python tools get from envace: nested parameter shapes from their type hints,
write annotations from a decorator, results converted to JSON the same way in every process and
capped, and a per-call timeout that leaves the episode running."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import envace
from envace.core.errors import error_code
from envace.core.types import EnvRef, Task
from envace.envs.provider import TOOL_EXECUTION_ERROR, ToolResultWarning
from envace.envs.registry import resolve_world

TOOLS = '''
from __future__ import annotations

import datetime
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import TypedDict

from pydantic import BaseModel
from typing_extensions import NotRequired

import envace


class Address(TypedDict):
    street: str
    postcode: str
    floor: NotRequired[int]


@dataclass
class Line:
    sku: str
    qty: int = 1


class Gift(BaseModel):
    message: str
    wrap: bool = False


@dataclass
class Receipt:
    order: str
    at: datetime.date


class Shop:
    def reset(self, seed: int = 0):
        # made in the episode's worker thread: a connection that only works in its own thread
        self.db = sqlite3.connect(":memory:")
        self.db.execute("CREATE TABLE orders(id TEXT)")
        self.seed = seed
        self.instance = id(self)

    def query(self, sql: str):
        return self.db.execute(sql).fetchall()

    @envace.tool(read_only=False, destructive=False)
    def order(self, to: Address, lines: list[Line], gift: Gift | None = None) -> dict:
        """Place an order.

        Args:
            to: Where to deliver.
            lines: What to send.
            gift: An optional gift note.
        """
        assert isinstance(lines[0], Line) and (gift is None or isinstance(gift, Gift))
        self.db.execute("INSERT INTO orders VALUES (?)", (f"o-{len(lines)}",))
        return {"receipt": Receipt(f"o-{len(lines)}", datetime.date(2026, 3, 4)), "skus": {l.sku for l in lines},
                "pair": (1, 2), "to": to}

    @envace.readonly
    def tags(self, n: int) -> set:
        """Every tag.

        Args:
            n: How many.
        """
        return {f"tag-{i}" for i in range(n)}

    def blob(self, size: int) -> object:
        """Something JSON cannot hold.

        Args:
            size: Its size.
        """
        if size > 100:
            return "z" * size
        return threading.Lock()

    @envace.tool(timeout_s=0.5)
    def slow(self, seconds: float) -> dict:
        """Take a while.

        Args:
            seconds: How long.
        """
        time.sleep(seconds)
        return {"instance": self.instance}

    def whoami(self) -> int:
        """This episode's instance."""
        return self.instance
'''


@pytest.fixture
def shop(tmp_path):
    path = tmp_path / "shop_tools.py"
    path.write_text(TOOLS)
    world = resolve_world(f"{path}:Shop")
    yield world, path
    world.shutdown()


def test_nested_parameters_get_their_full_shape_inlined(shop):
    world, _ = shop
    tools = {t.name: t for t in world.tools()}
    params = tools["order"].function.parameters
    assert params["properties"]["to"] == {
        "type": "object", "description": "Where to deliver.",
        "properties": {"street": {"type": "string"}, "postcode": {"type": "string"}, "floor": {"type": "integer"}},
        "required": ["street", "postcode"], "additionalProperties": False}
    lines = params["properties"]["lines"]
    assert lines["type"] == "array" and lines["items"]["properties"]["qty"] == {"type": "integer", "default": 1}
    assert lines["items"]["required"] == ["sku"]
    gift = params["properties"]["gift"]
    assert {"type": "null"} in gift["anyOf"] and gift["anyOf"][0]["properties"]["message"] == {"type": "string"}
    assert "$defs" not in json.dumps(params) and "$ref" not in json.dumps(params)  # self-contained
    assert params["required"] == ["to", "lines"] and params["additionalProperties"] is False
    Task.model_validate({"id": "a", "instruction": "x", "tools": [tools["order"].model_dump(mode="json")]})


def test_write_annotations_come_from_the_decorator_and_unknown_stays_absent(shop):
    world, _ = shop
    dumped = {t.name: t.model_dump(mode="json") for t in world.tools()}
    assert dumped["tags"]["annotations"] == {"readOnlyHint": True}
    assert dumped["order"]["annotations"] == {"readOnlyHint": False, "destructiveHint": False}
    assert "annotations" not in dumped["blob"]  # unknown: a write, and nothing added to the prompt
    from envace.envs import python_tools

    assert envace.readonly is python_tools.readonly and envace.tool is python_tools.tool


def test_nested_arguments_arrive_as_their_types_and_bad_ones_are_invalid_parameters(shop):
    world, _ = shop
    env = world.open(EnvRef(args={"seed": 1}))
    try:
        out = env.call("order", {"to": {"street": "1 High St", "postcode": "LS1"}, "lines": [{"sku": "b"},
                                 {"sku": "a", "qty": 2}], "gift": {"message": "hi"}})
        assert out == {"receipt": {"order": "o-2", "at": "2026-03-04"}, "skus": ["a", "b"], "pair": [1, 2],
                       "to": {"street": "1 High St", "postcode": "LS1"}}
        bad = env.call("order", {"to": {"street": "x"}, "lines": []})
        assert error_code(bad) == "INVALID_PARAMETERS" and "postcode" in bad["error"]["message"]
        assert env.query("SELECT id FROM orders") == [("o-2",)]  # the instance's own thread answers
    finally:
        env.close()


@pytest.mark.slow  # two fresh interpreters, each importing transformers for the schemas
def test_a_set_result_is_the_same_text_in_every_process(shop):
    _, path = shop
    script = (f"import json, warnings; warnings.simplefilter('ignore')\n"
              f"from envace.envs.registry import resolve_world\nfrom envace.core.types import EnvRef\n"
              f"w = resolve_world({str(path) + ':Shop'!r}); e = w.open(EnvRef())\n"
              f"print(json.dumps(e.call('tags', {{'n': 12}}))); e.close()")
    outs = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": str(seed), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
                                "HF_HUB_OFFLINE": "1"}).stdout
            for seed in (1, 2)}
    assert len(outs) == 1 and json.loads(outs.pop()) == sorted(f"tag-{i}" for i in range(12))


def test_str_conversion_warns_once_per_tool_and_big_results_are_capped(shop):
    world, _ = shop
    env = world.open(EnvRef())
    try:
        with pytest.warns(ToolResultWarning, match="'blob' returned lock values.*str\\(\\)") as got:
            assert isinstance(env.call("blob", {"size": 1}), str)
            env.call("blob", {"size": 1})
        assert len([w for w in got if "str()" in str(w.message)]) == 1
        with pytest.warns(ToolResultWarning, match="Make the tool return less") as got:
            capped = env.call("blob", {"size": 20000})
        assert capped.startswith("z" * 8000) and not capped.startswith("z" * 8001)
        assert capped.endswith("[envace: result truncated: 8000 of 20000 characters shown]")
        assert "token" not in str(got[0].message)  # the advice is about the tool, not the token caps
        assert env.call("blob", {"size": 8000}) == "z" * 8000  # exactly the cap: whole
    finally:
        env.close()


def test_a_hung_call_times_out_and_the_episode_goes_on_with_a_fresh_instance(shop):
    world, _ = shop
    env = world.open(EnvRef(args={"seed": 4}))
    try:
        first = env.call("whoami", {})
        t0 = time.perf_counter()
        hung = env.call("slow", {"seconds": 30})
        assert time.perf_counter() - t0 < 5
        assert error_code(hung) == TOOL_EXECUTION_ERROR and "timed out after 0.5 s" in hung["error"]["message"]
        assert env.abandoned == 1
        fresh = env.call("whoami", {})
        assert fresh != first  # the abandoned instance is never called again
        assert env.call("slow", {"seconds": 0}) == {"instance": fresh}
        assert env.query("SELECT count(*) FROM orders") == [(0,)]  # reset(**env.args) ran on the fresh one
    finally:
        env.close()


def test_a_closed_episode_refuses_at_once_instead_of_waiting_for_its_worker(shop):
    world, _ = shop
    env = world.open(EnvRef())
    assert env.query("SELECT count(*) FROM orders") == [(0,)]
    env.close()
    env.close()  # twice is fine
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="closed"):
        env.query("SELECT 1")
    assert time.perf_counter() - t0 < 1
