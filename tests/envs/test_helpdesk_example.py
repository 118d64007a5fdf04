"""The helpdesk worked example (examples/helpdesk): its task file, its Python class and its MCP
server, checked with the real objects: the class's SQLite state, a server process started here."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envace.cli.main import main
from envace.core.errors import error_code
from envace.core.types import EnvRef, Task
from envace.envs.mcp_world import MCPSpec
from envace.envs.registry import resolve_world
from envace.rollout.actors import ActorTurn, OracleActor
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.sources import RealSource

HERE = Path(__file__).resolve().parents[2] / "examples" / "helpdesk"
TASKS = HERE / "tasks.jsonl"
SPEC = str(HERE / "helpdesk.py") + ":Helpdesk"
TOOLS = {"search_tickets", "get_ticket", "create_ticket", "update_ticket", "add_comment", "list_agents"}


def _tasks() -> list[Task]:
    return [Task.model_validate_json(line) for line in TASKS.read_text().splitlines()]


def _one_per_template(tasks: list[Task]) -> list[Task]:
    return tasks[:9]  # make_tasks.py: task i uses template i % 9


def test_the_task_file_validates_against_the_class_and_holds_what_the_issue_asks(capsys):
    assert main(["tasks", "validate", str(TASKS), "--world", SPEC]) == 0
    assert "72 tasks, no problems" in capsys.readouterr().out
    tasks = _tasks()
    test = [t for t in tasks if t.split == "test"]
    assert len(tasks) >= 48 and 0.2 <= len(test) / len(tasks) <= 0.3
    assert {t.reference.calls[-1].name for t in test} >= {"get_ticket", "search_tickets", "create_ticket",
                                                          "update_ticket", "add_comment"}
    for t in tasks:
        assert t.env.args == {"seed": int(t.id.split("-")[1])} and {x.name for x in t.tools} == TOOLS
        # grounding, not the answer key: real pairs, never the reference's own calls
        assert 2 <= len(t.examples) <= 3
        ref = {(c.name, json.dumps(c.arguments, sort_keys=True)) for c in t.reference.calls}
        assert not ref & {(e.tool, json.dumps(e.arguments, sort_keys=True)) for e in t.examples}, t.id
    kinds = {i.kind for t in tasks for i in t.checklist}
    assert kinds == {"called", "answer_contains", "state", "end_state", "answer_plain"}
    nested = [i for t in tasks for i in t.checklist if i.kind == "called" and any(isinstance(v, dict)
                                                                                   for v in i.args.values())]
    assert len(nested) >= 24  # filters and changes are judged as nested arguments


def test_the_portable_file_is_the_same_tasks_without_the_sql_items_and_validates_against_the_server(
        capsys, monkeypatch, tmp_path):
    full, portable = _tasks(), [Task.model_validate_json(line) for line in
                                (HERE / "tasks_portable.jsonl").read_text().splitlines()]
    assert [t.id for t in portable] == [t.id for t in full]
    for a, b in zip(full, portable):
        assert [i for i in a.checklist if i.kind not in ("state", "end_state")] == b.checklist
        assert a.model_dump(exclude={"checklist"}) == b.model_dump(exclude={"checklist"})
    pytest.importorskip("mcp")
    monkeypatch.chdir(HERE.parents[1])  # world.yaml names the server from the repository root
    nine = tmp_path / "nine.jsonl"  # one task per template: the server is started for each line checked
    nine.write_text("".join((HERE / "tasks_portable.jsonl").read_text().splitlines(keepends=True)[:9]))
    assert main(["tasks", "validate", str(nine), "--world", str(HERE / "world.yaml")]) == 0
    assert "9 tasks, no problems" in capsys.readouterr().out


def test_the_examples_are_real_results_from_each_tasks_own_state():
    world = resolve_world(SPEC)
    for t in _tasks()[::7]:
        for ex in t.examples:
            env = world.open(EnvRef(args=t.env.args))  # fresh: a write example must not see another
            assert env.call(ex.tool, ex.arguments) == ex.result, (t.id, ex.tool)
            world.close_environment(env)


def test_every_reference_replayed_in_the_real_class_meets_its_whole_checklist():
    tasks = _tasks()
    source = RealSource(SPEC)
    try:
        trajs, _ = run_episodes(tasks, OracleActor(), source, RolloutConfig(max_turns=5))
    finally:
        source.close()
    for task, traj in zip(tasks, trajs):
        assert traj.reward == 1.0, (task.id, [v for v in traj.verdicts if v.met is not True])
        assert all(v.met is True for v in traj.verdicts), task.id  # state and end_state judged too, not skipped
        tool_msgs = [json.loads(m.content) for m in traj.messages if m.role == "tool"]
        assert len(tool_msgs) == len(task.reference.calls) and not any(error_code(r) for r in tool_msgs)


class _DoNothing:
    """An agent that answers at once, politely, without calling anything."""

    def act(self, views, turn):
        return [ActorTurn(text="I have looked into it and everything is in order.") for _ in views]


class _WrongTicket(OracleActor):
    """The reference's calls with every ticket id swapped for the ticket after it."""

    def act(self, views, turn):
        out = super().act(views, turn)
        for turn_ in out:
            turn_.text = turn_.text.replace('"HD-', '"HD-9')
        return out


def test_doing_nothing_scores_zero_and_acting_on_the_wrong_ticket_never_scores_one():
    tasks = _tasks()
    source = RealSource(SPEC)
    try:
        idle, _ = run_episodes(tasks, _DoNothing(), source, RolloutConfig(max_turns=5))
        wrong, _ = run_episodes(tasks, _WrongTicket(), source, RolloutConfig(max_turns=5))
    finally:
        source.close()
    assert [t.reward for t in idle] == [0.0] * len(tasks)
    by_id = [(task, traj) for task, traj in zip(tasks, wrong)
             if any("ticket_id" in c.arguments for c in task.reference.calls)]
    assert by_id and all(traj.reward < 1.0 for _, traj in by_id)


class _Reworded(OracleActor):
    """The reference, with the free text (a new ticket's title and description, a comment's body)
    worded otherwise around the reporter's words."""

    def act(self, views, turn):
        out = super().act(views, turn)
        for turn_ in out:
            for key, prefix in (("title", "Re: "), ("description", "Reported by phone: "), ("body", "Update: ")):
                turn_.text = turn_.text.replace(f'"{key}": "', f'"{key}": "{prefix}')
        return out


def test_free_text_worded_otherwise_still_scores_one_and_other_arguments_do_not():
    tasks = [t for t in _tasks() if {c.name for c in t.reference.calls} & {"create_ticket", "add_comment"}]
    source = RealSource(SPEC)
    try:
        reworded, _ = run_episodes(tasks, _Reworded(), source, RolloutConfig(max_turns=5))
    finally:
        source.close()
    assert len(tasks) >= 20 and [t.reward for t in reworded] == [1.0] * len(tasks)
    assert all('"description": "Reported by phone: ' in m.content or '"body": "Update: ' in m.content
               for t in reworded for m in t.messages if m.role == "assistant" and "create_ticket" in m.content)


def test_the_class_state_is_seeded_and_its_query_is_read_only():
    world = resolve_world(SPEC)
    a, b, c = (world.open(EnvRef(args={"seed": s})) for s in (5, 5, 6))
    assert a.call("search_tickets", {"limit": 50}) == b.call("search_tickets", {"limit": 50})
    assert a.call("search_tickets", {"limit": 50}) != c.call("search_tickets", {"limit": 50})
    assert len(a.call("list_agents", {})) == 8 and len(a.call("search_tickets", {"limit": 50})) == 12
    with pytest.raises(Exception, match="not authorized"):
        a.query("DELETE FROM tickets")
    assert a.query("SELECT count(*) FROM tickets") == [[12]]
    # a bad enum value inside a nested argument is refused before the tool runs
    err = a.call("search_tickets", {"filters": {"status": "opened"}})
    assert error_code(err) == "INVALID_PARAMETERS" and "filters/status" in err["error"]["message"]


def test_an_unknown_key_inside_a_nested_argument_is_an_error_not_dropped():
    env = resolve_world(SPEC).open(EnvRef(args={"seed": 5}))
    assert error_code(env.call("search_tickets", {"filters": {"stauts": "open"}})) is not None


def test_an_optional_enum_argument_accepts_null_as_its_schema_type_says():
    env = resolve_world(SPEC).open(EnvRef(args={"seed": 5}))
    assert env.call("list_agents", {"team": None}) == env.call("list_agents", {})


def test_typeddict_arguments_get_nested_schemas_and_read_only_tools_say_so():
    tools = {t.name: t for t in resolve_world(SPEC).tools()}
    filters = tools["search_tickets"].function.parameters["properties"]["filters"]
    shape = next(s for s in filters.get("anyOf", [filters]) if s.get("type") == "object")
    assert set(shape["properties"]) == {"status", "priority", "labels", "assignee", "text"}
    assert shape["properties"]["status"]["enum"] == ["open", "in_progress", "waiting", "resolved", "closed"]
    assert shape["properties"]["labels"] == {"type": "array", "items": {"type": "string"}}
    changes = tools["update_ticket"].function.parameters["properties"]["changes"]
    assert set(changes["properties"]) == {"status", "priority", "add_labels", "remove_labels", "assignee"}
    assert tools["update_ticket"].function.parameters["required"] == ["ticket_id", "changes"]
    assert tools["create_ticket"].function.parameters["properties"]["priority"]["enum"] == [
        "low", "medium", "high", "urgent"]
    read_only = {n for n, t in tools.items() if (t.annotations or {}).get("readOnlyHint")}
    assert read_only == {"search_tickets", "get_ticket", "list_agents"}


def test_the_default_prompt_shows_the_keys_of_a_nested_argument():
    """The compact tool format (the default prompt) spells out a TypedDict argument: its keys,
    each optional, their enums and list item types, not 'filters?: any' / 'changes: object'."""
    from envace.core.prompts import compact_signature

    tools = {t.name: t for t in resolve_world(SPEC).tools()}
    statuses = '"open"|"in_progress"|"waiting"|"resolved"|"closed"'
    priorities = '"low"|"medium"|"high"|"urgent"'
    assert compact_signature(tools["update_ticket"]).startswith(
        f"update_ticket(ticket_id: string, changes: {{status?: {statuses}, priority?: {priorities}, "
        "add_labels?: list[string], remove_labels?: list[string], assignee?: string}) - ")
    assert compact_signature(tools["search_tickets"]).startswith(
        f"search_tickets(filters?: {{status?: {statuses}, priority?: {priorities}, labels?: list[string], "
        "assignee?: string, text?: string}|null, limit?: integer) - ")


TE_TYPEDDICT = '''
from typing_extensions import TypedDict


class Filters(TypedDict, total=False):
    status: str


class Desk:
    def search(self, filters: Filters) -> list:
        """Search.

        Args:
            filters: What to match.
        """
        return []
'''


def test_a_typing_extensions_typeddict_argument_gets_its_nested_schema(tmp_path):
    (tmp_path / "te_desk.py").write_text(TE_TYPEDDICT)
    (tool,) = resolve_world(str(tmp_path / "te_desk.py") + ":Desk").tools()
    assert tool.function.parameters["properties"]["filters"]["properties"] == {"status": {"type": "string"}}


@pytest.fixture(scope="module")
def server():
    """The example's server over streamable HTTP, one process for the module: each episode is a
    session of its own there, reset to its task's seed (as the stdio form is, one process each)."""
    pytest.importorskip("mcp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(HERE / "server.py"), "--http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    world = None
    try:
        for _ in range(120):  # until it listens
            world = resolve_world(MCPSpec(url=f"http://127.0.0.1:{port}/mcp", reset_tool="reset", timeout_s=20,
                                          startup_timeout_s=20))
            try:
                world.tools()
                break
            except ValueError:
                world.shutdown()
                time.sleep(0.5)
        yield world
    finally:
        if world is not None:
            world.shutdown()
        proc.terminate()
        proc.wait(timeout=10)


def _params(tool) -> dict:
    """What a tool accepts: each argument's (type or enum) and, for an object, its keys. The
    server's listing names its TypedDicts by "$ref" into "$defs" (pydantic's way): followed here."""
    defs = tool.function.parameters.get("$defs", {})

    def deref(a: dict) -> dict:
        ref = a.get("$ref", "")
        return defs[ref.rsplit("/", 1)[-1]] if ref.startswith("#/$defs/") else a

    out = {}
    for name, prop in tool.function.parameters.get("properties", {}).items():
        alts = [deref(a) for a in prop.get("anyOf", [prop]) if a.get("type") != "null"]
        out[name] = sorted(json.dumps({k: a.get(k) for k in ("type", "enum")} | {
            "keys": sorted(a.get("properties", {}))}, sort_keys=True) for a in alts)
    return {"args": out, "required": sorted(tool.function.parameters.get("required", []))}


def test_the_mcp_server_lists_the_same_tools_as_the_class(server):
    by_class = {t.name: _params(t) for t in resolve_world(SPEC).tools()}
    by_server = {t.name: _params(t) for t in server.tools()}
    assert set(by_server) == TOOLS  # the reset tool is not an agent tool
    # @envace.readonly on the class, readOnlyHint on the server: the same tools read only
    assert {t.name: t.annotations for t in server.tools()} == {t.name: t.annotations for t in resolve_world(SPEC).tools()}
    for name in TOOLS:
        a, b = by_class[name], by_server[name]
        assert a["required"] == b["required"] and set(a["args"]) == set(b["args"]), name
        for arg in a["args"]:  # the class spells x | None as ["string", "null"] (and null in an
            # enum), pydantic as anyOf with a {"type": "null"} alternative
            norm = [json.loads(s) for s in a["args"][arg]]
            for n in norm:
                if isinstance(n["type"], list):
                    n["type"] = [t for t in n["type"] if t != "null"][0]
                    if isinstance(n.get("enum"), list):
                        n["enum"] = [v for v in n["enum"] if v is not None]
            assert sorted(json.dumps(n, sort_keys=True) for n in norm) == b["args"][arg], (name, arg)


def test_the_mcp_server_answers_every_call_as_the_class_does(server):
    world = resolve_world(SPEC)
    for task in _one_per_template(_tasks()):
        mine, theirs = world.open(task.env), server.open(task.env)
        try:
            for c in task.reference.calls:
                assert theirs.call(c.name, c.arguments) == mine.call(c.name, c.arguments), (task.id, c)
            # a failure reads alike: the same code, the class's message inside the server's
            bad = {"ticket_id": "HD-1", "changes": {"status": "resolved"}}
            a, b = mine.call("update_ticket", bad), theirs.call("update_ticket", bad)
            assert error_code(a) == error_code(b) == "TOOL_EXECUTION_ERROR"
            assert a["error"]["message"] in b["error"]["message"]
            # and each ends in the same state, seen through the read tools
            assert theirs.call("search_tickets", {"limit": 50}) == mine.call("search_tickets", {"limit": 50})
        finally:
            world.close_environment(mine)
            server.close_environment(theirs)


def test_the_reference_solutions_succeed_against_the_stdio_server_of_world_yaml(monkeypatch):
    """As `--world examples/helpdesk/world.yaml` runs it: a server process per episode, reset
    with the task's seed (a lost seed shows: the tickets the references name would not exist)."""
    pytest.importorskip("mcp")
    monkeypatch.chdir(HERE.parents[1])  # world.yaml names the server from the repository root
    tasks = [_tasks()[6], _tasks()[7]]  # an escalation (three nested changes) and a comment
    source = RealSource(str(HERE / "world.yaml"))
    try:
        trajs, _ = run_episodes(tasks, OracleActor(), source, RolloutConfig(max_turns=5))
    finally:
        source.close()
    for task, traj in zip(tasks, trajs):
        tool_msgs = [json.loads(m.content) for m in traj.messages if m.role == "tool"]
        assert not any(error_code(r) for r in tool_msgs), (task.id, tool_msgs)
        # an MCP server has no SQL state: state/end_state items go unjudged, the rest are met
        assert traj.reward == 1.0 and all(v.met is (None if v.item.kind in ("state", "end_state") else True)
                                          for v in traj.verdicts), task.id


TINY = ["--model", "tiny", "--set", "steps=1", "--set", "tasks_per_step=2", "--set", "group_size=2",
        "--set", "threads=1", "--set", "eval.tasks=2", "--set", "eval.samples=1", "--set", "eval.temperature=0",
        "--set", "sft.trajectories=2", "--set", "sft.epochs=1", "--set", "rollout.caller_max_new_tokens=8",
        "--set", "rollout.simulator_max_new_tokens=8", "--set", "rollout.max_turns=2", "--set", "lora.r=2"]


@pytest.mark.slow
def test_the_config_trains_on_the_class_and_schema_only_on_the_portable_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(HERE.parents[1])  # the config names its files from the repository root
    config = str(HERE / "config.yaml")
    assert main(["train", "--config", config, *TINY, "--set", f"out={tmp_path / 'real'}"]) == 0
    log = capsys.readouterr().out
    assert "evaluation: real-world" in log and "helpdesk.py:Helpdesk" in log
    assert main(["train", "--config", config, *TINY, "--set", f"out={tmp_path / 'schema'}", "--set",
                 f"task_file={HERE / 'tasks_portable.jsonl'}", "--set", "world=null"]) == 0
    log = capsys.readouterr().out
    assert "evaluation: rehearsal-judged" in log
    (run,) = (tmp_path / "schema").iterdir()
    assert "SFT warm start" in (run / "summary.md").read_text()  # the recorded examples trained the rehearse role
