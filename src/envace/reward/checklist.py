"""Checklist judging of a finished trajectory: reward = fraction of judged items met, times the
guards (items that only take reward away).

What can be judged without a world is judged the same way with or without one: the calls
(``called``, and ``writes``: every successful write against the reference's) and the answer
(``answer_contains``, ``answer_plain``, ``answer_excludes``). A real world adds ``state`` and
``end_state``. So a rehearsal-judged reward pays for no side effect the real world would not.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from envace.core import safejson
from envace.core.errors import VALIDATION_CODES, error_code
from envace.core.tools import writes_of
from envace.core.types import ChecklistItem, Task, ToolCall, Trajectory, Verdict, trajectory_calls
from envace.core.values import excludes_items, mentions, norm_text
from envace.envs.provider import ENVIRONMENT_ERROR, TOOL_EXECUTION_ERROR, table_digests


class Judge(Protocol):
    def judge(self, criterion: str, task: Task, trajectory: Trajectory) -> tuple[bool | None, str]: ...


class QueryableWorld(Protocol):
    def query(self, sql: str) -> list[list[Any]]: ...


# Items that only take reward away: the end state and the writes must be the reference's, the
# answer a reply that names what was asked for and not everything seen.
GUARD_KINDS = ("end_state", "answer_plain", "answer_excludes", "writes")
GUARD_PENALTY = 0.5
# Answers that mean the call never ran: rejected before any world, or the tool / its server failed.
NOT_RUN_CODES = frozenset({*VALIDATION_CODES, TOOL_EXECUTION_ERROR, ENVIRONMENT_ERROR})


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


def _subset(expected: Any, actual: Any) -> bool:
    """``expected`` is found in ``actual``: objects by a subset of their keys, at every depth;
    lists item by item (same length, same order); other values by ``_same``."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(k in actual and _subset(v, actual[k]) for k, v in expected.items())
    if isinstance(expected, (list, tuple)):
        return (isinstance(actual, (list, tuple)) and len(expected) == len(actual)
                and all(_subset(x, y) for x, y in zip(expected, actual)))
    return _same(expected, actual)


def args_match(expected: dict[str, Any], actual: dict[str, Any]) -> bool:
    """Subset match: every expected argument is present with the same value; nested objects
    match by a subset of their keys too."""
    return _subset(expected, actual)


def _parse_content(text: str) -> Any:
    return safejson.loads(text)[0] if isinstance(text, str) else None


@dataclass(frozen=True)
class MadeCall:
    """A call the episode made and how it was answered."""

    call: ToolCall
    code: str | None  # the structured error's code; None for a result

    @property
    def ran(self) -> bool:
        """It ran and returned something: a result, or a refusal by the tool's own logic."""
        return self.code not in NOT_RUN_CODES

    @property
    def succeeded(self) -> bool:
        return self.code is None


def made_calls(traj: Trajectory) -> list[MadeCall]:
    """Every call of the trajectory with its answer's error code (parsed once per trajectory)."""
    return [MadeCall(call, error_code(_parse_content(answer.content))) for call, answer in trajectory_calls(traj)]


def _judge_called(item: ChecklistItem, calls: list[MadeCall]) -> Verdict:
    for made in calls:
        if made.ran and made.call.name == item.tool and args_match(item.args, made.call.arguments):
            return Verdict(item=item, met=True, detail=f"called {made.call.name}")
    return Verdict(item=item, met=False, detail=f"no call of {item.tool} with {item.args} that ran")


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


def normalize_answer(text: str) -> str:
    """The form answers are compared in as text (NFKC, case folded); numbers are compared as
    numbers by ``core.values.mentions``."""
    return norm_text(text)


def _judge_answer(item: ChecklistItem, traj: Trajectory) -> Verdict:
    ok = bool(item.text) and mentions(traj.final_answer, item.text)
    return Verdict(item=item, met=ok, detail="" if ok else f"answer lacks {item.text!r}")


def _judge_excludes(item: ChecklistItem, traj: Trajectory) -> Verdict:
    answer = traj.final_answer
    found = [t for t in item.texts or [] if mentions(answer, t)]
    allowed = item.max_found or 0
    return Verdict(item=item, met=len(found) <= allowed,
                   detail=f"answer states {len(found)} of these values (at most {allowed} allowed): "
                          f"{', '.join(map(repr, found[:5]))}"[:300] if found else "")


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


# -- writes against the reference -----------------------------------------------------------

def _same_arg(a: Any, b: Any) -> bool:
    """Argument equality of the writes guard: ``_same``, with text compared normalised
    ("Coffee chat" and "coffee  chat" name the same title)."""
    if isinstance(a, str) and isinstance(b, str):
        return norm_text(a) == norm_text(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_arg(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_arg(x, y) for x, y in zip(a, b))
    return _same(a, b)


def _canonical(task: Task, call: ToolCall) -> dict[str, Any]:
    """A write's arguments as compared: schema defaults filled in (``notify_attendees`` left out
    is ``true`` when the schema says so), the task's free arguments dropped."""
    spec = task.tool(call.name)
    props = spec.function.parameters.get("properties", {}) if spec is not None else {}
    defaults = {k: p["default"] for k, p in props.items() if isinstance(p, dict) and "default" in p}
    free = set(task.reference.free_args.get(call.name, [])) if task.reference is not None else set()
    args = call.arguments if isinstance(call.arguments, dict) else {}
    return {k: v for k, v in {**defaults, **args}.items() if k not in free}


def _show(call: ToolCall) -> str:
    return f"{call.name}({', '.join(f'{k}={v!r}' for k, v in call.arguments.items())})"[:120]


def _judge_writes(item: ChecklistItem, task: Task, calls: list[MadeCall]) -> Verdict:
    """Every successful write of the episode is one of the reference's, tool and every argument
    (but the task's free ones), and every reference write was made. Judged on the calls, so it
    holds in rehearsal, and it sees what a world's state cannot: a write undone later, a flag
    the world does not store."""
    if task.reference is None:
        return Verdict(item=item, met=None, detail="no reference to compare the writes with")
    writes = writes_of(task)
    missing = [(c, _canonical(task, c)) for c in task.reference.calls if writes(c.name)]
    extra: list[ToolCall] = []
    for made in calls:
        if not (made.succeeded and writes(made.call.name)):
            continue
        args = _canonical(task, made.call)
        hit = next((i for i, (c, a) in enumerate(missing) if c.name == made.call.name and _same_arg(a, args)), None)
        if hit is None:
            extra.append(made.call)
        else:
            missing.pop(hit)
    parts = ([f"write not in the reference: {', '.join(_show(c) for c in extra[:3])}"] if extra else []) + \
            ([f"reference write not made: {', '.join(_show(c) for c, _ in missing[:3])}"] if missing else [])
    return Verdict(item=item, met=not parts, detail="; ".join(parts)[:300])


# -- the reward -----------------------------------------------------------------------------

def implicit_items(task: Task) -> list[ChecklistItem]:
    """Guards a task gets from its reference without listing them: ``writes`` whenever it has a
    reference, and ``answer_excludes`` derived from the reference's recorded results (when every
    call has one) unless the checklist declares its own."""
    ref = task.reference
    if ref is None:
        return []
    kinds = {i.kind for i in task.checklist}
    out = [] if "writes" in kinds else [ChecklistItem(kind="writes")]
    if "answer_excludes" not in kinds and ref.calls and all(c.result is not None for c in ref.calls):
        out += excludes_items([(c.name, c.result) for c in ref.calls], ref.answer,
                              [i.text for i in task.checklist if i.kind == "answer_contains" and i.text],
                              task.instruction)
    return out


def reference_progress(task: Task, calls: list[MadeCall]) -> float:
    """The share of the reference's calls the episode made in order (calls that ran, same tool,
    same arguments but the free ones): a greedy in-order match, so making the first two of three
    reference calls is 2/3 whatever else was called between them."""
    ref = task.reference
    if ref is None or not ref.calls:
        return 0.0
    done = 0
    for made in calls:
        if done == len(ref.calls):
            break
        want = ref.calls[done]
        if made.ran and made.call.name == want.name and _same_arg(_canonical(task, want), _canonical(task, made.call)):
            done += 1
    return done / len(ref.calls)


def judge_trajectory(
    task: Task, traj: Trajectory, world: QueryableWorld | None = None, judge: Judge | None = None,
    progress_weight: float = 0.0,
) -> tuple[float, list[Verdict]]:
    """Verdict per checklist item (and per implicit guard, see ``implicit_items``); reward is the
    fraction met among the items that could be judged, halved for each guard that fails.

    ``world`` is the real world after the episode (None in rehearsal: ``state`` and ``end_state``
    are skipped); ``judge`` answers ``judge`` items (None: skipped). ``progress_weight`` (default 0:
    off) lets a task with a reference pay for partial progress along it: an unsolved episode gets
    ``r + w * (1 - r) * p``, ``r`` the checklist fraction, ``p`` the share of reference calls made
    in order (``reference_progress``); full marks still need every item.
    """
    verdicts: list[Verdict] = []
    calls = made_calls(traj)
    items = [*task.checklist, *implicit_items(task)]
    handlers: dict[str, Callable[[ChecklistItem], Verdict]] = {
        "called": lambda i: _judge_called(i, calls),
        "state": lambda i: _judge_state(i, world),
        "answer_contains": lambda i: _judge_answer(i, traj),
        "end_state": lambda i: _judge_end_state(i, world),
        "answer_plain": lambda i: _judge_plain(i, traj),
        "answer_excludes": lambda i: _judge_excludes(i, traj),
        "writes": lambda i: _judge_writes(i, task, calls),
    }
    for item in items:
        if item.kind in handlers:
            verdicts.append(handlers[item.kind](item))
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
    else:  # a checklist of guards only: met is success; implicit guards alone judge nothing
        declared = verdicts[:len(task.checklist)]
        reward = 1.0 if any(v.met is not None and v.item.kind in GUARD_KINDS for v in declared) else 0.0
    if progress_weight > 0 and reward < 1.0:
        reward += min(progress_weight, 1.0) * (1.0 - reward) * reference_progress(task, calls)
        reward = min(reward, 1.0 - 1e-6)  # progress alone never makes an episode "solved"
    # A guard adds nothing when met (doing nothing must not earn partial credit for writing
    # nothing and saying little); each failed guard halves the reward, so a cheat never reaches 1.
    reward *= GUARD_PENALTY ** guards.count(False)
    return reward, verdicts
