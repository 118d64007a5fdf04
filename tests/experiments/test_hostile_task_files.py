"""A task file is data: validating it, or loading it for a run, starts no process, imports nothing
and fetches nothing, whatever it names; each hostile file gets a one-line error naming file, line
and field, and ``envace train`` refuses it before a run directory exists."""

from __future__ import annotations

import json
import socket
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace.cli.main import main
from envace.experiments.task_check import read_task_file, validate_task_file
from envace.experiments.tasks import select_tasks

TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a thing up.", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}


class Listener:
    """A TCP port that counts the connections it gets (an http $ref or MCP URL must never reach it)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=2)
        self.sock.close()


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    """Hostile task files, each one task, and the traces their attacks would leave."""
    marker = tmp_path / "PWNED"
    writes_marker = f"open({str(marker)!r}, 'w').write('ran')\n"
    (tmp_path / "evil_tools.py").write_text(writes_marker + "class Evil:\n    pass\n")
    (tmp_path / "evil_server.py").write_text(writes_marker)
    (tmp_path / "evilpkg").mkdir()
    (tmp_path / "evilpkg" / "__init__.py").write_text(writes_marker)
    (tmp_path / "evil_world.yaml").write_text(f"command: [{sys.executable}, {tmp_path / 'evil_server.py'}]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    listener = Listener()

    def task(**over):
        return {"id": "t1", "instruction": "Look it up.", "tools": [TOOL],
                "checklist": [{"kind": "called", "tool": "lookup"}], **over}

    def schema(prop):
        return {"type": "function", "function": {"name": "lookup", "parameters": {
            "type": "object", "properties": {"q": prop}}}}

    files = {
        "py_world": (task(env={"world": f"{tmp_path / 'evil_tools.py'}:Evil"}), "env.world"),
        "import_path_world": (task(env={"world": "evilpkg.mod:Evil"}), "env.world"),
        "mcp_command": (task(env={"world": f"mcp:{sys.executable} {tmp_path / 'evil_server.py'}"}), "env.world"),
        "mcp_url": (task(env={"world": f"http://127.0.0.1:{listener.port}/mcp"}), "env.world"),
        "mcp_yaml": (task(env={"world": str(tmp_path / "evil_world.yaml")}), "env.world"),
        "http_ref": (task(tools=[schema({"$ref": f"http://127.0.0.1:{listener.port}/schema.json"})]),
                     "tools[0].function.parameters.properties.q.$ref"),
        "file_ref": (task(tools=[schema({"$ref": "file:///etc/passwd"})]),
                     "tools[0].function.parameters.properties.q.$ref"),
        "unknown_type": (task(tools=[schema({"type": "strnig"})]), "tools[0].function.parameters"),
        "bad_ref": (task(tools=[schema({"$ref": "#/$defs/nowhere"})]),
                    "tools[0].function.parameters.properties.q.$ref"),
        "unknown_called_tool": (task(checklist=[{"kind": "called", "tool": "drop_tables"}]), "checklist[0].tool"),
        "writing_state_sql": (task(env={"world": "shop"}, tools=[], checklist=[
            {"kind": "state", "query": "DELETE FROM orders", "equals": []}]), "checklist[0].query"),
    }
    paths = {}
    for name, (row, field) in files.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text(json.dumps(row) + "\n")
        paths[name] = (path, field)
    yield paths, marker, listener
    listener.close()
    sys.modules.pop("evilpkg", None)


NAMES = ["py_world", "import_path_world", "mcp_command", "mcp_url", "mcp_yaml", "http_ref", "file_ref",
         "unknown_type", "bad_ref", "unknown_called_tool", "writing_state_sql"]


@pytest.mark.parametrize("name", NAMES)
def test_validate_refuses_without_running_importing_or_fetching(hostile, name, capsys):
    paths, marker, listener = hostile
    path, field = paths[name]
    assert main(["tasks", "validate", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"{path}:1: field '{field}': "), err
    assert len(err) == 2 and "problem(s) in 1 tasks" in err[1]  # one line per problem, no traceback
    assert not marker.exists() and listener.connections == 0
    assert "evilpkg" not in sys.modules


@pytest.mark.parametrize("name", NAMES)
def test_a_runs_loading_refuses_the_same_files_with_one_line(hostile, name):
    paths, marker, listener = hostile
    path, field = paths[name]
    with pytest.raises(ValueError) as e:
        select_tasks(None, "all", None, path)
    message = str(e.value)
    assert message.startswith(f"{path}:1: field '{field}': ") and "\n" not in message
    assert not marker.exists() and listener.connections == 0


def test_world_refusals_say_why_and_how_to_allow_them(hostile):
    paths, marker, _ = hostile
    _, problems = validate_task_file(paths["mcp_command"][0])
    assert "an MCP server command: envace would run it" in problems[0].message
    assert "--trust-task-worlds" in problems[0].message and "--world" in problems[0].message
    _, problems = validate_task_file(paths["file_ref"][0])
    assert "never fetches or reads" in problems[0].message
    assert not marker.exists()


@pytest.mark.parametrize("name", ["py_world", "mcp_command", "http_ref", "unknown_called_tool"])
def test_envace_train_refuses_before_a_run_directory_exists(hostile, name, tmp_path, capsys):
    paths, marker, listener = hostile
    path, field = paths[name]
    out = tmp_path / "runs"
    for command in ("train", "sft"):
        assert main([command, "--tasks-file", str(path), "--model", "tiny", "--set", f"out={out}"]) == 2
        err = capsys.readouterr().err
        assert f"{path}:1: field '{field}'" in err and "Traceback" not in err
        assert not out.exists() or not any(out.iterdir())
    assert not marker.exists() and listener.connections == 0


def test_trusting_the_file_or_naming_the_world_yourself_lets_it_run(hostile, tmp_path):
    paths, marker, _ = hostile
    path, _ = paths["py_world"]
    # the user names the same world: theirs, so it loads (and imports) as a --world does
    spec = json.loads(path.read_text())["env"]["world"]
    tools_py = tmp_path / "tools_ok.py"
    tools_py.write_text('class Ok:\n    def lookup(self, q: str) -> str:\n        """Look.\n\n        Args:\n'
                        '            q: what\n        """\n        return q\n')
    ok = tmp_path / "ok.jsonl"
    ok.write_text(json.dumps({"id": "a", "instruction": "x", "env": {"world": f"{tools_py}:Ok"},
                              "checklist": [{"kind": "called", "tool": "lookup"}]}) + "\n")
    assert validate_task_file(ok)[1][0].field == "env.world"  # refused by default
    assert validate_task_file(ok, world=f"{tools_py}:Ok")[1] == []  # named by the user
    assert validate_task_file(ok, trust_task_worlds=True)[1] == []  # trusted
    assert [t.name for t in select_tasks(None, "all", None, ok, trust_task_worlds=True)[0].tools] == ["lookup"]
    assert not marker.exists()
    validate_task_file(path, trust_task_worlds=True)  # trusting the evil file runs it: the user's call
    assert marker.exists()


def test_validate_checks_tool_names_against_the_world(tmp_path, capsys):
    library = Path(__file__).resolve().parents[2] / "examples" / "python_library" / "library.py"
    world = f"{library}:Library"
    row = {"id": "a", "instruction": "x", "tools": [
        {"type": "function", "function": {"name": "search_books", "parameters": {
            "type": "object", "properties": {"query": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "fly_to_the_moon"}}],
        "checklist": [{"kind": "called", "tool": "fly_to_the_moon"}]}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert main(["tasks", "validate", str(path)]) == 0  # schema-only: nothing to compare with
    assert main(["tasks", "validate", str(path), "--world", world]) == 1
    err = capsys.readouterr().err
    assert f"{path}:1: field 'tools[1].function.name': 'fly_to_the_moon' is not a tool of world" in err
    assert "search_books" in err  # the world's tools are listed


def test_env_args_that_nothing_receives_are_refused_with_the_reason(tmp_path):
    tools = tmp_path / "plain_tools.py"
    tools.write_text('def shout(text: str) -> str:\n    """Shout.\n\n    Args:\n        text: what\n    """\n'
                     '    return text.upper()\n')
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"id": "a", "instruction": "x", "env": {"args": {"seed": 3}}}) + "\n")
    _, problems = validate_task_file(path, world=str(tools))
    assert [(p.field, "no reset(**args)" in p.message) for p in problems] == [("env.args", True)]
    assert validate_task_file(path)[1][0].field == "tools"  # no world: nothing to list, args not judged


def test_validate_reads_what_tasks_file_reads_a_dataset_directory_and_a_parquet_file(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from envace.core.types import Task
    from envace.experiments.datasets_io import task_rows

    good = Task.model_validate({"id": "a", "instruction": "x", "tools": [TOOL], "split": "train",
                                "checklist": [{"kind": "called", "tool": "lookup"}]})
    bad = good.model_copy(update={"id": "b", "checklist": []}).model_dump(mode="json")
    bad["checklist"] = [{"kind": "called", "tool": "nope"}]
    rows = task_rows([good]) + task_rows([Task.model_validate(bad)])
    (tmp_path / "ds" / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows[:1]), tmp_path / "ds" / "data" / "train-00000-of-00001.parquet")
    assert main(["tasks", "validate", str(tmp_path / "ds")]) == 0
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "both.parquet")
    assert main(["tasks", "validate", str(tmp_path / "both.parquet")]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'both.parquet'}:row 2: field 'checklist[0].tool': unknown tool 'nope'" in err
    assert [t.id for t in select_tasks(None, "all", None, tmp_path / "ds")] == ["a"]  # the same loader
    assert main(["tasks", "validate", str(tmp_path / "missing_dir_or_file")]) == 2


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=400))
def test_any_bytes_give_problems_never_a_traceback(tmp_path, data):
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(data)
    count, problems = validate_task_file(path)
    assert all(isinstance(p.line, int) and p.line >= 1 for p in problems)
    assert not any("could not be checked" in p.message for p in problems)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=20)
SCHEMA_KEYS = st.sampled_from(["type", "properties", "items", "$ref", "required", "enum", "pattern", "anyOf",
                               "$defs", "additionalProperties", "minimum", "$schema", "$id", "format"])
SCHEMAS = st.recursive(JSON, lambda inner: st.dictionaries(SCHEMA_KEYS, inner, max_size=4), max_leaves=15)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(params=SCHEMAS, checklist=st.lists(st.dictionaries(st.sampled_from(["kind", "tool", "query", "equals", "args"]),
                                                          JSON | st.sampled_from(["called", "state", "lookup"]),
                                                          max_size=4), max_size=3),
       env=st.none() | st.dictionaries(st.sampled_from(["world", "seed", "args"]), JSON, max_size=3))
def test_task_shaped_json_gives_problems_never_a_traceback(tmp_path, params, checklist, env):
    row = {"id": "a", "instruction": "x", "checklist": checklist,
           "tools": [{"type": "function", "function": {"name": "lookup", "parameters": params}}]}
    if env is not None:
        row["env"] = env
    path = tmp_path / "fuzz.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
    _, problems = validate_task_file(path)
    assert not any("could not be checked" in p.message for p in problems), problems
    read = read_task_file(path)
    assert read.count == 2
    if read.records:  # the second copy is always caught as a duplicate
        assert any(p.line == 2 and p.field == "id" and "duplicate" in p.message for p in problems)


def test_eval_and_rollout_refuse_the_same_and_run_a_trusted_file(hostile, tmp_path, capsys):
    paths, marker, listener = hostile
    path, field = paths["mcp_command"]
    for argv in (["rollout", "--task-file", str(path), "--model", "tiny", "--out", str(tmp_path / "ro")],
                 ["eval", "--task-file", str(path), "--model", "tiny", "--out", str(tmp_path / "ev")]):
        assert main(argv) == 2
        assert f"{path}:1: field '{field}'" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "ro").exists() and not (tmp_path / "ev").exists()
    tools_py = tmp_path / "echo_tools.py"
    tools_py.write_text('def echo(text: str) -> str:\n    """Echo.\n\n    Args:\n        text: what\n    """\n'
                        '    return text\n')
    trusted = tmp_path / "trusted.jsonl"
    trusted.write_text(json.dumps({"id": "a", "instruction": "Echo hi.", "env": {"world": str(tools_py)},
                                   "checklist": [{"kind": "called", "tool": "echo"}]}) + "\n")
    argv = ["rollout", "--task-file", str(trusted), "--model", "tiny", "--out", str(tmp_path / "ro"), "--source",
            "real", "--max-turns", "1", "--max-new-tokens", "4", "--threads", "1"]
    assert main(argv) == 2
    assert main([*argv, "--trust-task-worlds"]) == 0
