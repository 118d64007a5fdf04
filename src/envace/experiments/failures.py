"""Why an episode failed, in one word per episode, so the next lever is chosen from data.

The calls a task needs are its checklist's ``called`` items (tool + arguments, subset match, as
the reward judges them) or, when it has none, its reference solution's calls. A call *matches*
a needed one when it names the tool with the needed arguments and reached a world (a call the
engine rejected as malformed or schema-invalid did not happen). Classes, first that applies:

* ``solved`` — every checklist item met (full reward);
* ``no_call`` — the policy made no parseable tool call, though the task needs one;
* ``wrong_answer`` — right calls, wrong answer: every needed call was made and matched, yet an
  answer / state / judge item failed (or the task needs no call and the answer failed);
* ``wrong_arguments`` — a needed call is missing and the policy did call its tool, with other
  arguments (or arguments the tool's schema rejects);
* ``wrong_tool`` — a needed tool was never called, and the policy called a tool that neither the
  needed calls nor the reference solution use (or one that does not exist);
* ``gave_up`` — a needed tool was never called and every call it made was to tools the needed
  calls or the reference use (a lookup, say): it stopped short, with a final answer or at the
  turn limit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from envace.core import safejson
from envace.core.errors import VALIDATION_CODES, error_code
from envace.core.types import Task, ToolCall, Trajectory, trajectory_calls
from envace.reward.checklist import args_match

FAILURE_CLASSES = ("solved", "no_call", "wrong_tool", "wrong_arguments", "wrong_answer", "gave_up")
CLASS_WORDS = {
    "solved": "solved",
    "no_call": "no call",
    "wrong_tool": "wrong tool",
    "wrong_arguments": "wrong arguments",
    "wrong_answer": "right calls, wrong answer",
    "gave_up": "gave up (stopped short)",
}


def needed_calls(task: Task) -> list[tuple[str, dict[str, Any]]]:
    """(tool, arguments) the task needs: its ``called`` items, else its reference calls."""
    called = [(i.tool, i.args) for i in task.checklist if i.kind == "called" and i.tool]
    if called:
        return called
    if task.reference is not None:
        return [(c.name, c.arguments) for c in task.reference.calls]
    return []


def _reached(answer_text: str) -> bool:
    value = safejson.loads(answer_text)[0] if isinstance(answer_text, str) else None
    return error_code(value) not in VALIDATION_CODES


def failure_class(task: Task, traj: Trajectory) -> str:
    """One of :data:`FAILURE_CLASSES` for a scored trajectory of ``task`` (definitions above)."""
    if traj.solved:
        return "solved"
    pairs = trajectory_calls(traj)
    calls: list[ToolCall] = [c for c, _ in pairs]
    made = [c for c, answer in pairs if _reached(answer.content)]
    needed = needed_calls(task)
    if not calls:
        return "no_call" if needed else "wrong_answer"
    missing = [(tool, args) for tool, args in needed
               if not any(c.name == tool and args_match(args, c.arguments) for c in made)]
    if not missing:
        return "wrong_answer"
    called = {c.name for c in calls}
    if any(tool in called for tool, _ in missing):
        return "wrong_arguments"
    useful = {tool for tool, _ in needed} | {c.name for c in (task.reference.calls if task.reference else [])}
    if any(c.name not in useful for c in calls):
        return "wrong_tool"
    return "gave_up"


def failure_rows(tasks: Iterable[Task], trajectories: Iterable[Trajectory], **tags: Any) -> list[dict[str, Any]]:
    """One row per trajectory: task id, episode index, class, and ``tags`` (step, source, ...)."""
    by_id = {t.id: t for t in tasks}
    return [{**tags, "task_id": tr.task_id, "trajectory_index": tr.trajectory_index,
             "class": failure_class(by_id[tr.task_id], tr)} for tr in trajectories if tr.task_id in by_id]


def class_shares(rows: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Share of episodes in each class (every class present, 0 where none)."""
    counts = Counter(r["class"] for r in rows)
    n = sum(counts.values())
    return {c: (counts[c] / n if n else 0.0) for c in FAILURE_CLASSES}


def failure_table(before: list[dict[str, Any]], after: list[dict[str, Any]], labels: tuple[str, str]) -> list[str]:
    """Markdown: episodes per class before and after (e.g. the first and last eval)."""
    cb, ca = Counter(r["class"] for r in before), Counter(r["class"] for r in after)
    lines = [f"| class | {labels[0]} | {labels[1]} |", "|---|---|---|"]
    for c in FAILURE_CLASSES:
        lines.append(f"| {CLASS_WORDS[c]} | {cb[c]} | {ca[c]} |")
    lines.append(f"| episodes | {sum(cb.values())} | {sum(ca.values())} |")
    return lines


def transition_table(before: list[dict[str, Any]], after: list[dict[str, Any]], limit: int = 40) -> list[str]:
    """Markdown: each task's class before -> after (first episode of each), changed tasks first."""
    first = {r["task_id"]: r["class"] for r in reversed(before)}
    last = {r["task_id"]: r["class"] for r in reversed(after)}
    ids = [t for t in dict.fromkeys([*first, *last])]
    ids.sort(key=lambda t: first.get(t) == last.get(t))
    lines = ["| task | before | after |", "|---|---|---|"]
    for t in ids[:limit]:
        lines.append(f"| {t} | {CLASS_WORDS.get(first.get(t, ''), '–')} | {CLASS_WORDS.get(last.get(t, ''), '–')} |")
    if len(ids) > limit:
        lines.append(f"| ({len(ids) - limit} more tasks) | | |")
    return lines
