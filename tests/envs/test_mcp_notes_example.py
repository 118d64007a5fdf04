"""The MCP notes example (examples/mcp_notes) run as `--world examples/mcp_notes/world.yaml` runs
it: its server started over stdio by the test, one process per episode, reset to each task's seed."""

import json
from pathlib import Path

import pytest

from envace.core.errors import error_code
from envace.core.types import EnvRef, Task
from envace.envs.registry import resolve_world
from envace.rollout.actors import OracleActor
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.sources import RealSource

pytest.importorskip("mcp")

HERE = Path(__file__).resolve().parents[2] / "examples" / "mcp_notes"


def _tasks() -> list[Task]:
    return [Task.model_validate_json(line) for line in (HERE / "tasks.jsonl").read_text().splitlines()]


def test_the_stdio_server_keeps_the_seed_its_reset_was_given(monkeypatch):
    """Each tool call over stdio must see the store ``reset`` seeded (notes.py: seed k numbers
    its notes from 100 + 10k), not a fresh seed-0 store of its own."""
    monkeypatch.chdir(HERE.parents[1])  # world.yaml names the server from the repository root
    world = resolve_world(str(HERE / "world.yaml"))
    env = world.open(EnvRef(args={"seed": 1}))
    try:
        assert [n["id"] for n in env.call("list_notes", {})] == ["n110", "n111", "n112", "n113"]
        assert env.call("create_note", {"title": "x", "body": "y"})["id"] == "n114"
        assert len(env.call("list_notes", {})) == 5  # the write is seen by the next call
    finally:
        world.close_environment(env)
        world.shutdown()


@pytest.mark.slow
def test_every_reference_replayed_through_world_yaml_meets_its_checklist(monkeypatch):
    """A lost seed shows here: the ids the references name exist only in their own seed's notes."""
    monkeypatch.chdir(HERE.parents[1])
    world = resolve_world(str(HERE / "world.yaml"))
    try:  # the tasks list no tools: a run gives them the server's listing, as here
        tools = world.tools()
    finally:
        world.shutdown()
    assert {t.name for t in tools} == {"list_notes", "get_note", "search_notes", "create_note", "delete_note"}
    tasks = [t.model_copy(update={"tools": tools}) for t in _tasks()]
    source = RealSource(str(HERE / "world.yaml"))
    try:
        trajs, _ = run_episodes(tasks, OracleActor(), source, RolloutConfig(max_turns=5))
    finally:
        source.close()
    assert len(tasks) == 36
    for task, traj in zip(tasks, trajs):
        tool_msgs = [json.loads(m.content) for m in traj.messages if m.role == "tool"]
        assert len(tool_msgs) == len(task.reference.calls), task.id
        assert not any(error_code(r) for r in tool_msgs), (task.id, tool_msgs)
        assert traj.reward == 1.0 and all(v.met is True for v in traj.verdicts), (
            task.id, [v for v in traj.verdicts if v.met is not True])
