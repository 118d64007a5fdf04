"""benchmarks/testtime_failures.py: why a committed run failed, read from real episodes in the real
calendar world (a wrong pick out of a real list, an unknown tool, a malformed call, a wrong answer),
and whether a rehearsal showed a problem."""

import functools
import json
import subprocess
import sys
from pathlib import Path

from envace.core import safejson
from envace.core.toolcall import format_tool_call
from envace.core.types import ToolCall
from envace.envs.tasks import load_tasks
from envace.rollout.actors import ActorTurn
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.sources import RealSource

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from testtime_failures import failure_kind, showed_problem  # noqa: E402


class PlanActor:
    """Turn k: ``steps[k](view)`` (a tool-call text), then the answer."""

    def __init__(self, steps, answer="Done."):
        self.steps, self.answer = steps, answer

    def act(self, views, turn):
        return [ActorTurn(text=self.steps[turn](v) if turn < len(self.steps) else self.answer) for v in views]


@functools.cache
def _task():
    """A list-then-read task whose real list holds another event to pick by mistake."""
    for t in load_tasks("calendar", "test", limit=60):
        if [c.name for c in t.reference.calls] == ["list_events", "get_event"]:
            tool = next(m for m in _play(t, [_listing(t)])["messages"] if m["role"] == "tool")
            listed = safejson.loads(tool["content"])[0]["events"]
            if len(listed) > 1:
                return t
    raise AssertionError("no such task in the first 60")


def _play(task, steps, answer="Done."):
    [traj], _ = run_episodes([task], PlanActor(steps, answer), RealSource(), RolloutConfig(max_turns=4))
    return traj.model_dump(mode="json")


def _listing(task):
    return lambda v: format_tool_call(task.reference.calls[0])


def _read(task):
    return lambda v: format_tool_call(task.reference.calls[1])


def _unknown_event(view):
    return format_tool_call(ToolCall(name="get_event", arguments={"event_id": "e-0000"}))


def _other_event(task):
    def step(view):
        listed = safejson.loads(view.history[-1].content)[0]["events"]
        wrong = next(e["event_id"] for e in listed if e["event_id"] != task.reference.calls[1].arguments["event_id"])
        return format_tool_call(ToolCall(name="get_event", arguments={"event_id": wrong}))
    return step


def test_each_kind_from_real_episodes():
    task = _task()
    right = _read(task)
    oracle = _play(task, [_listing(task), right], task.reference.answer)
    assert oracle["reward"] == 1.0
    wrong_pick = _play(task, [_listing(task), _other_event(task)], task.reference.answer)
    assert wrong_pick["reward"] < 1.0 and failure_kind(wrong_pick) == "wrong pick"
    # an id it was never shown is not a pick
    unseen = _play(task, [_unknown_event])
    assert failure_kind(unseen) == "tool error"  # the real world does not know e-0000
    never = _play(task, [_listing(task)], task.reference.answer)
    assert failure_kind(never) == "other call"  # get_event never called
    assert failure_kind(_play(task, [lambda v: "<tool_call>{oops</tool_call>"])) == "malformed"
    assert failure_kind(_play(task, [_listing(task), right], "I don't know.")) == "answer only"
    assert not showed_problem(oracle) and showed_problem(unseen)


def test_report_counts_failures_and_rehearsal_problems(tmp_path):
    task = _task()
    trajs = {"wrong": _play(task, [_listing(task), _other_event(task)], task.reference.answer),
             "solved": _play(task, [_listing(task), _read(task)], task.reference.answer),
             "unknown": _play(task, [_unknown_event])}
    committed = [{"condition": "none", "task_id": k, "success": t["reward"] == 1.0, "trajectory": t}
                 for k, t in trajs.items()]
    # the rehearsal of "wrong" showed an error (here: the unknown-id episode); the others none
    rehearsals = [{"mode": "parallel", "attempt": 0, "task_id": "wrong", "trajectory": trajs["unknown"]},
                  {"mode": "parallel", "attempt": 0, "task_id": "solved", "trajectory": trajs["solved"]}]
    (tmp_path / "committed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in committed))
    (tmp_path / "rehearsals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rehearsals))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/testtime_failures.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line.split("|")[1].strip(): line.split("|")[2:4] for line in out.stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| why")}
    assert [int(x) for x in rows["wrong pick"]] == [1, 1]
    assert [int(x) for x in rows["tool error"]] == [1, 0]
    assert [int(x) for x in rows["(solved: a false alarm)"]] == [1, 0]
    assert "3 tasks, 2 failed" in out.stdout
    missing = subprocess.run([sys.executable, str(ROOT / "benchmarks/testtime_failures.py"), str(tmp_path / "no")],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert missing.returncode != 0 and "committed.jsonl: not found" in missing.stderr
    # a torn line inside the file: one line naming the file and the line, no traceback
    lines = (tmp_path / "committed.jsonl").read_text().splitlines()
    (tmp_path / "committed.jsonl").write_text("\n".join([lines[0], lines[1][:40], lines[2]]) + "\n")
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks/testtime_failures.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode != 0 and "committed.jsonl:2: not valid JSON" in bad.stderr
    assert "Traceback" not in bad.stderr
