"""The worked examples' read-only marks as the writes guard reads them: the Python library
(``@envace.readonly``) and the MCP notes server (``readOnlyHint``). Each episode runs in the
example's real world; the reward must not move for an extra read and must drop for an extra write,
judged with that world and judged as a rehearsal step judges (no world)."""

import json
import sys
from pathlib import Path

import pytest

from envace.core.errors import error_code
from envace.core.tools import tool_writes
from envace.core.toolcall import format_tool_call
from envace.core.types import Task, ToolCall, Trajectory
from envace.envs.registry import resolve_world
from envace.reward.checklist import judge_trajectory
from envace.rollout.actors import ActorTurn, ActorView, OracleActor
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.sources import RealSource

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LIBRARY = EXAMPLES / "python_library"
NOTES = EXAMPLES / "mcp_notes"
LIBRARY_SPEC = str(LIBRARY / "library.py") + ":Library"


class ReferencePlusOne:
    """Plays each task's reference calls, then one more call of the test's choosing, then the
    reference answer."""

    def __init__(self, extra: dict[str, ToolCall]):
        self.extra = extra

    def act(self, views: list[ActorView], turn: int) -> list[ActorTurn | None]:
        out: list[ActorTurn | None] = []
        for v in views:
            ref = v.task.reference
            calls = [*ref.calls, self.extra[v.task.id]]
            done = sum(1 for m in v.history if m.role == "assistant")
            out.append(ActorTurn(text=format_tool_call(calls[done]) if done < len(calls) else ref.answer))
        return out


def _load(path: Path) -> list[Task]:
    return [Task.model_validate_json(line) for line in path.read_text().splitlines()]


def _run(tasks: list[Task], actor, spec: str) -> list[Trajectory]:
    source = RealSource(spec)
    try:
        trajs, _ = run_episodes(tasks, actor, source, RolloutConfig(max_turns=6))
    finally:
        source.close()
    return trajs


def _tool_errors(traj: Trajectory) -> list[str]:
    return [m.content for m in traj.messages if m.role == "tool" and error_code(json.loads(m.content))]


def _assert_full(task: Task, traj: Trajectory) -> None:
    assert not _tool_errors(traj), (task.id, _tool_errors(traj))
    assert traj.reward == 1.0 and all(v.met is True for v in traj.verdicts), (
        task.id, [v for v in traj.verdicts if v.met is not True])
    assert any(v.item.kind == "writes" for v in traj.verdicts), task.id  # the guard was judged
    # Judged as a rehearsal step judges (no world): the same full marks.
    assert judge_trajectory(task, traj, world=None)[0] == 1.0, task.id


def _assert_write_caught(task: Task, traj: Trajectory) -> None:
    assert not _tool_errors(traj), (task.id, _tool_errors(traj))  # the extra write really ran
    assert traj.reward < 1.0, task.id
    (writes,) = [v for v in traj.verdicts if v.item.kind == "writes"]
    assert writes.met is False and "write not in the reference" in writes.detail, (task.id, writes)
    reward, verdicts = judge_trajectory(task, traj, world=None)
    assert reward < 1.0 and any(v.item.kind == "writes" and v.met is False for v in verdicts), task.id


# -- the Python library (@envace.readonly) ---------------------------------------------------

def _library():
    sys.path.insert(0, str(LIBRARY))
    try:
        from library import Library
    finally:
        sys.path.remove(str(LIBRARY))
    return Library


def test_the_library_marks_its_four_lookups_read_only_and_its_task_file_carries_the_marks():
    provider = resolve_world(LIBRARY_SPEC)
    try:
        writes = {t.name: tool_writes(t) for t in provider.tools()}
    finally:
        provider.shutdown()
    assert writes == {"search_books": False, "book_status": False, "find_member": False, "list_loans": False,
                      "borrow_book": True}
    for task in _load(LIBRARY / "tasks.jsonl"):  # make_tasks.py embeds the derived schemas
        assert {t.name: tool_writes(t) for t in task.tools} == writes, task.id


def test_every_library_reference_scores_full_marks_in_the_real_library():
    tasks = _load(LIBRARY / "tasks.jsonl")
    assert len(tasks) == 36
    for task, traj in zip(tasks, _run(tasks, OracleActor(), LIBRARY_SPEC)):
        _assert_full(task, traj)


def test_library_an_extra_read_keeps_full_marks_and_an_extra_write_loses_them():
    Library = _library()
    tasks = _load(LIBRARY / "tasks.jsonl")
    reads, writes = {}, {}
    for task in tasks:
        lib = Library()
        lib.reset(**task.env.args)
        reads[task.id] = ToolCall(name="list_loans", arguments={"member_id": "m1"})
        # A book the reference did not touch with a copy on the shelf, so the extra loan succeeds.
        touched = {c.arguments.get("book_id") for c in task.reference.calls}
        book = next(b["id"] for b in lib.books.values() if b["copies"] > 0 and b["id"] not in touched)
        writes[task.id] = ToolCall(name="borrow_book", arguments={"member_id": "m1", "book_id": book})
    for task, traj in zip(tasks, _run(tasks, ReferencePlusOne(reads), LIBRARY_SPEC)):
        _assert_full(task, traj)
    for task, traj in zip(tasks, _run(tasks, ReferencePlusOne(writes), LIBRARY_SPEC)):
        _assert_write_caught(task, traj)


# -- the MCP notes server (readOnlyHint) -----------------------------------------------------

def _notes_tools(monkeypatch) -> list:
    pytest.importorskip("mcp")
    monkeypatch.chdir(EXAMPLES.parent)  # world.yaml names the server from the repository root
    world = resolve_world(str(NOTES / "world.yaml"))
    try:
        return world.tools()
    finally:
        world.shutdown()


def test_the_notes_server_lists_its_three_lookups_read_only(monkeypatch):
    assert {t.name: tool_writes(t) for t in _notes_tools(monkeypatch)} == {
        "list_notes": False, "get_note": False, "search_notes": False, "create_note": True, "delete_note": True}


@pytest.mark.slow
def test_notes_an_extra_read_keeps_full_marks_and_an_extra_write_loses_them(monkeypatch):
    tools = _notes_tools(monkeypatch)  # the tasks list none: a run gives them the server's listing
    tasks = [t.model_copy(update={"tools": tools}) for t in _load(NOTES / "tasks.jsonl")[:4]]  # one per template
    spec = str(NOTES / "world.yaml")
    reads = {t.id: ToolCall(name="search_notes", arguments={"text": "list"}) for t in tasks}
    writes = {t.id: ToolCall(name="create_note", arguments={"title": "Extra", "body": "not asked for"})
              for t in tasks}
    for task, traj in zip(tasks, _run(tasks, ReferencePlusOne(reads), spec)):
        _assert_full(task, traj)
    for task, traj in zip(tasks, _run(tasks, ReferencePlusOne(writes), spec)):
        _assert_write_caught(task, traj)
