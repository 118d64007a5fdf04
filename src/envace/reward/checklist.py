"""Checklist judging of a finished trajectory: reward = fraction of judged items met."""

from __future__ import annotations

import math
import re
from typing import Any, Protocol

from envace.core import safejson
from envace.core.errors import VALIDATION_CODES, error_code
from envace.core.types import ChecklistItem, Task, ToolCall, Trajectory, Verdict, trajectory_calls
from envace.envs.provider import table_digests


class Judge(Protocol):
    def judge(self, criterion: str, task: Task, trajectory: Trajectory) -> tuple[bool | None, str]: ...


class QueryableWorld(Protocol):
    def query(self, sql: str) -> list[list[Any]]: ...


# Items that only take reward away: the end state must be the reference's, the answer a reply.
GUARD_KINDS = ("end_state", "answer_plain")
GUARD_PENALTY = 0.5


def _same(a: Any, b: Any) -> bool:
    """Value equality that does not care about 42.5 vs 42.50 vs 42 or list vs tuple."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b if isinstance(a, bool) and isinstance(b, bool) else False
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-6)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def args_match(expected: dict[str, Any], actual: dict[str, Any]) -> bool:
    """Subset match: every expected argument is present with the same value."""
    return all(k in actual and _same(v, actual[k]) for k, v in expected.items())


def _parse_content(text: str) -> Any:
    return safejson.loads(text)[0] if isinstance(text, str) else None


def _made_calls(traj: Trajectory) -> list[ToolCall]:
    """The calls that reached a world: one the engine rejected before any world did not happen.
    Parsed once per trajectory, not once per ``called`` item."""
    return [call for call, answer in trajectory_calls(traj)
            if error_code(_parse_content(answer.content)) not in VALIDATION_CODES]


def _judge_called(item: ChecklistItem, calls: list[ToolCall]) -> Verdict:
    for call in calls:
        if call.name == item.tool and args_match(item.args, call.arguments):
            return Verdict(item=item, met=True, detail=f"called {call.name}")
    return Verdict(item=item, met=False, detail=f"no valid call of {item.tool} with {item.args}")


def _query_of(item: ChecklistItem, world: QueryableWorld | None) -> Any:
    """The world's ``query``, or the Verdict saying why the item cannot be judged."""
    if world is None:
        return Verdict(item=item, met=None, detail=f"{item.kind} items need a real world")
    query = getattr(world, "query", None)
    if not callable(query):
        return Verdict(item=item, met=None, detail="this world has no SQL state to query")
    return query


def _judge_state(item: ChecklistItem, world: QueryableWorld | None) -> Verdict:
    query = _query_of(item, world)
    if isinstance(query, Verdict):
        return query
    try:
        rows = query(item.query or "")
    except Exception as e:  # sqlite3.Error, or whatever a user world's query raises
        return Verdict(item=item, met=False, detail=f"SQL error: {e}")
    ok = _same([list(r) for r in rows], item.equals or [])
    return Verdict(item=item, met=ok, detail=f"rows={rows!r}"[:300])


_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")


def normalize_answer(text: str) -> str:
    """Lower case, no thousands separators: "$1,645.20" states the same amount as "1645.20"."""
    return _THOUSANDS.sub("", text.lower())


def _judge_answer(item: ChecklistItem, traj: Trajectory) -> Verdict:
    answer = traj.final_answer
    ok = bool(item.text) and normalize_answer(item.text) in normalize_answer(answer)
    return Verdict(item=item, met=ok, detail="" if ok else f"answer lacks {item.text!r}")


# An object or a list of objects/strings as tool output prints it: {"key" / [{ / ["
_PASTED_JSON = re.compile(r'\{\s*"|\[\s*[{"]')


def _judge_plain(item: ChecklistItem, traj: Trajectory) -> Verdict:
    answer = traj.final_answer.strip()
    if not answer:
        return Verdict(item=item, met=False, detail="no final answer")
    if item.max_chars is not None and len(answer) > item.max_chars:
        return Verdict(item=item, met=False, detail=f"answer of {len(answer)} chars is over the {item.max_chars} allowed")
    if _PASTED_JSON.search(answer):
        return Verdict(item=item, met=False, detail="answer pastes JSON tool output")
    return Verdict(item=item, met=True)


def _judge_end_state(item: ChecklistItem, world: QueryableWorld | None) -> Verdict:
    query = _query_of(item, world)
    if isinstance(query, Verdict):
        return query
    if not item.digests:
        return Verdict(item=item, met=None, detail="no reference end state to compare with")
    try:
        got = table_digests(query, sorted(item.digests))
    except Exception as e:  # a table the world does not have
        return Verdict(item=item, met=False, detail=f"SQL error: {e}"[:300])
    changed = [t for t in sorted(item.digests) if got.get(t) != item.digests[t]]
    return Verdict(item=item, met=not changed,
                   detail=f"tables differ from the reference's end state: {', '.join(changed)}" if changed else "")


def judge_trajectory(
    task: Task, traj: Trajectory, world: QueryableWorld | None = None, judge: Judge | None = None
) -> tuple[float, list[Verdict]]:
    """Verdict per checklist item; reward is the fraction met among the items that could be judged,
    halved for each guard item (``end_state``, ``answer_plain``) that fails.

    ``world`` is the real world after the episode (None in rehearsal: state items are skipped);
    ``judge`` answers ``judge`` items (None: skipped).
    """
    verdicts: list[Verdict] = []
    calls = _made_calls(traj) if any(i.kind == "called" for i in task.checklist) else []
    for item in task.checklist:
        if item.kind == "called":
            verdicts.append(_judge_called(item, calls))
        elif item.kind == "state":
            verdicts.append(_judge_state(item, world))
        elif item.kind == "answer_contains":
            verdicts.append(_judge_answer(item, traj))
        elif item.kind == "end_state":
            verdicts.append(_judge_end_state(item, world))
        elif item.kind == "answer_plain":
            verdicts.append(_judge_plain(item, traj))
        elif judge is None:
            verdicts.append(Verdict(item=item, met=None, detail="no judge configured"))
        else:
            try:
                met, why = judge.judge(item.criterion or "", task, traj)
            except Exception as e:  # a judge failure is no verdict, never a crashed run
                met, why = None, f"judge failed: {type(e).__name__}: {e}"
            verdicts.append(Verdict(item=item, met=met, detail=str(why)[:300]))
    judged = [v.met for v in verdicts if v.met is not None and v.item.kind not in GUARD_KINDS]
    guards = [v.met for v in verdicts if v.met is not None and v.item.kind in GUARD_KINDS]
    if judged:
        reward = sum(judged) / len(judged)
    else:
        reward = 1.0 if guards else 0.0
    # A guard adds nothing when met (doing nothing must not earn partial credit for writing
    # nothing and saying little); each failed guard halves the reward, so a cheat never reaches 1.
    reward *= GUARD_PENALTY ** guards.count(False)
    return reward, verdicts
