"""Bring your own environment, end to end through the CLI: schema-only task files, the two worked
examples (Python tools, an MCP server), the task-file checker and the LLM judge."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from envace.cli.main import main
from envace.core.jsonl import read_jsonl_dicts
from envace.core.types import Task, Trajectory
from envace.experiments.rundir import RunDir
from envace.experiments.tasks import HOLDOUT, select_tasks

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "examples" / "python_library"
NOTES = ROOT / "examples" / "mcp_notes"
TINY = ["--model", "tiny", "--set", "steps=1", "--set", "tasks_per_step=2", "--set", "group_size=2",
        "--set", "threads=1", "--set", "eval.tasks=2", "--set", "eval.samples=1", "--set", "eval.temperature=0",
        "--set", "sft.trajectories=2", "--set", "sft.epochs=1", "--set", "rollout.caller_max_new_tokens=8",
        "--set", "rollout.simulator_max_new_tokens=8", "--set", "rollout.max_turns=2", "--set", "lora.r=2"]


def _only_run(out: Path) -> RunDir:
    (path,) = [p for p in out.iterdir() if p.name.startswith("train-")]
    return RunDir.open(path)


def _trajs(run: RunDir, name: str = "trajectories.jsonl") -> list[Trajectory]:
    """A train run's trajectories (its rows also carry the step and kind they belong to)."""
    rows = read_jsonl_dicts(run.path / name)
    return [Trajectory.model_validate({k: v for k, v in r.items() if k not in ("step", "kind")}) for r in rows]


def _schema_only(tmp_path: Path, extra: list[dict] | None = None) -> Path:
    """The library tasks as a user with only schemas has them: no env, no reference."""
    rows = []
    for line in (LIBRARY / "tasks.jsonl").read_text().splitlines():
        row = json.loads(line)
        row.pop("env"), row.pop("reference")
        rows.append(row)
    path = tmp_path / "schema_only.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + (extra or [])))
    return path


def test_a_schema_only_task_file_trains_by_rehearsal_and_says_how_it_was_evaluated(tmp_path, capsys):
    tasks = _schema_only(tmp_path)
    out = tmp_path / "runs"
    assert main(["train", "--tasks-file", str(tasks), *TINY, "--set", f"out={out}"]) == 0
    log = capsys.readouterr().out
    # No world and no recorded results: the warm start trains the rehearse role on the examples alone.
    assert "warm start data: 0 caller samples" in log and "from recorded examples" in log
    assert "evaluation: rehearsal-judged" in log
    run = _only_run(out)
    evals = [r for r in run.metrics() if r["phase"] == "eval"]
    assert [r["step"] for r in evals] == [0, 1] and {r["eval_kind"] for r in evals} == {"rehearsal"}
    assert "Rehearsal-judged evaluation (no real environment)" in (run.path / "summary.md").read_text()
    train = [t for t in _trajs(run) if t.source == "rehearsal"]
    assert train and all(m.rehearsed for t in train for m in t.messages if m.role == "tool")
    # With no real world, RL against the real world is refused in one line.
    assert main(["train", "--tasks-file", str(tasks), *TINY, "--set", f"out={tmp_path / 'r2'}",
                 "--source", "real"]) == 2
    assert "source real: the train tasks have no real world" in capsys.readouterr().err


def test_the_python_tools_example_trains_by_rehearsal_and_evaluates_against_the_real_tools(tmp_path, monkeypatch,
                                                                                           capsys):
    monkeypatch.chdir(ROOT)  # the example's config names its files from the repository root
    out = tmp_path / "runs"
    assert main(["train", "--config", str(LIBRARY / "config.yaml"), *TINY, "--set", f"out={out}"]) == 0
    log = capsys.readouterr().out
    assert "evaluation: real-world" in log and "library.py:Library" in log
    run = _only_run(out)
    assert any(r["phase"] == "sft" for r in run.metrics())  # the oracle replayed references in the library
    evals = _trajs(run, "evals.jsonl")
    assert evals and all(t.source == "real" for t in evals)
    assert {r["eval_kind"] for r in run.metrics() if r["phase"] == "eval"} == {"real"}
    assert "Real-world evaluation" in (run.path / "summary.md").read_text()


def test_the_mcp_example_trains_without_calling_the_server_and_evaluates_against_it(tmp_path, monkeypatch, capsys):
    pytest.importorskip("mcp")
    monkeypatch.chdir(ROOT)
    out = tmp_path / "runs"
    assert main(["train", "--config", str(NOTES / "config.yaml"), *TINY, "--set", f"out={out}",
                 "--set", "sft.enabled=false"]) == 0
    run = _only_run(out)
    train = [t for t in _trajs(run) if t.source == "rehearsal"]
    assert train and not any(m.rehearsed is False for t in train for m in t.messages if m.role == "tool")
    evals = _trajs(run, "evals.jsonl")
    assert evals and all(t.source == "real" for t in evals)
    tools = {t.name for t in select_tasks(None, "all", 1, NOTES / "tasks.jsonl", real_world=str(NOTES / "world.yaml"))[0].tools}
    assert tools == {"list_notes", "get_note", "search_notes", "create_note", "delete_note"}
    # The trained checkpoint, evaluated with test-time rehearsal against the real server.
    ckpt = run.path / "checkpoints" / "step-00000001"
    assert main(["eval", "--model", str(ckpt), "--task-file", str(NOTES / "tasks.jsonl"), "--world",
                 str(NOTES / "world.yaml"), "--tasks", "2", "--rehearse", "parallel", "--budget", "1",
                 "--max-new-tokens", "8", "--sim-max-new-tokens", "8", "--summary-max-new-tokens", "8",
                 "--threads", "1", "--out", str(tmp_path / "eval")]) == 0
    (ev,) = (tmp_path / "eval").iterdir()
    committed = read_jsonl_dicts(ev / "committed.jsonl")
    assert len(committed) == 2 and all(r["real_calls_during_rehearsal"] == 0 for r in committed)


BAD_TASKS = [
    # line 1: fine
    {"id": "a", "instruction": "x", "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"d": {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$"}}}}}],
     "checklist": [{"kind": "called", "tool": "f"}]},
    # line 2: duplicate id, checklist tool that does not exist
    {"id": "a", "instruction": "x", "tools": [{"type": "function", "function": {"name": "f"}}],
     "checklist": [{"kind": "called", "tool": "g"}]},
    # line 3: a tool schema that is not JSON Schema
    {"id": "b", "instruction": "x", "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integr"}}}}}]},
    # line 4: a catastrophic regex
    {"id": "c", "instruction": "x", "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}}}]},
    # line 5: a state query that does not compile against the shop world, and one that attaches a file
    {"id": "d", "instruction": "x", "tools": [{"type": "function", "function": {"name": "f"}}],
     "env": {"world": "shop", "seed": 1},
     "checklist": [{"kind": "state", "query": "SELECT nope FROM orderz", "equals": [[1]]},
                   {"kind": "state", "query": "ATTACH DATABASE 'x.db' AS x", "equals": []}]},
    # line 6: not a task at all
    {"id": "e"},
]


def test_tasks_validate_names_file_line_and_field_for_each_problem(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in BAD_TASKS))
    assert main(["tasks", "validate", str(path)]) == 1
    err = capsys.readouterr().err
    expected = [f"{path}:2: field 'id': duplicate id 'a' (first on line 1)",
                f"{path}:2: field 'checklist[0].tool': unknown tool 'g'",
                f"{path}:3: field 'tools[0].function.parameters': not a valid JSON Schema",
                f"{path}:4: field 'tools[0].function.parameters': Value error, properties.s.pattern '^(a+)+$': a repeated",
                f"{path}:5: field 'checklist[0].query': does not compile against world 'shop': no such table: orderz",
                f"{path}:5: field 'checklist[1].query': a state query must be one SELECT",
                f"{path}:6: field 'instruction': Field required"]
    for line in expected:
        assert line in err, line
    assert f"{path}:1:" not in err
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps(BAD_TASKS[0]) + "\n")
    assert main(["tasks", "validate", str(good)]) == 0
    assert main(["tasks", "validate", str(LIBRARY / "tasks.jsonl")]) == 0
    capsys.readouterr()
    assert main(["tasks", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "checklist" in schema["properties"]


def test_file_tasks_without_difficulty_are_kept_and_a_file_without_splits_holds_out_tasks(tmp_path):
    path = _schema_only(tmp_path)
    every = select_tasks(None, "all", None, path, difficulties=[1])
    assert len(every) == 36  # none has a difficulty: all kept
    train, test = select_tasks(None, "train", None, path), select_tasks(None, "test", None, path)
    assert {t.id for t in train}.isdisjoint({t.id for t in test}) and len(train) + len(test) == 36
    assert 0 < len(test) < 36 / HOLDOUT * 2


class _Judge(BaseHTTPRequestHandler):
    """An OpenAI-compatible stub: YES when the transcript contains 'library', else NO; hangs on 'slow'."""

    def do_GET(self):  # noqa: N802
        self._send({"data": [{"id": "stub-judge"}]})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = body["messages"][-1]["content"]
        if "Criterion: slow" in text:
            threading.Event().wait(5)
        verdict = "YES, it does" if "Criterion: polite" in text else "NO, it does not"
        self._send({"choices": [{"message": {"role": "assistant", "content": verdict}, "finish_reason": "stop"}]})

    def _send(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except BrokenPipeError:  # the client gave up on the slow request: what the test wants
            pass

    def log_message(self, *args):
        pass


def test_judge_items_are_judged_by_an_endpoint_in_training_and_eval(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Judge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    judged = [{"kind": "judge", "criterion": "polite"}, {"kind": "judge", "criterion": "rude"},
              {"kind": "judge", "criterion": "slow"}]
    rows = [json.loads(line) for line in _schema_only(tmp_path).read_text().splitlines()]
    path = tmp_path / "judged.jsonl"
    path.write_text("".join(json.dumps({**r, "checklist": judged}) + "\n" for r in rows))
    out = tmp_path / "runs"
    try:
        assert main(["train", "--tasks-file", str(path), *TINY, "--set", f"out={out}", "--judge-url", url,
                     "--set", "judge.timeout_s=1", "--set", "judge.retries=0"]) == 0
    finally:
        server.shutdown()
    run = _only_run(out)
    for traj in _trajs(run) + _trajs(run, "evals.jsonl"):
        met = [v.met for v in traj.verdicts]
        assert met == [True, False, None], traj.verdicts  # the hung request is no verdict, not a NO
        assert "judge unavailable" in traj.verdicts[2].detail
        assert traj.reward == 0.5
    assert Task.model_validate(rows[0] | {"checklist": judged}).checklist[0].kind == "judge"


def test_tasks_tools_prints_the_derived_schemas(capsys):
    assert main(["tasks", "tools", "--world", str(LIBRARY / "library.py") + ":Library"]) == 0
    tools = json.loads(capsys.readouterr().out)
    assert {t["function"]["name"] for t in tools} == {"search_books", "book_status", "find_member", "borrow_book",
                                                     "list_loans"}
    assert main(["tasks", "tools", "--world", "no_such_world_anywhere"]) == 2
