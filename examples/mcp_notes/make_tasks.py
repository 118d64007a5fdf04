"""Writes tasks.jsonl for the MCP notes example: 36 tasks from four templates. The tasks list no
tools: envace takes them from the server's listing, read-only marks (``readOnlyHint``) included.
Expected results and the grounding examples come from the service's logic (notes.py) at the same
seed the episode's reset tool will use.

Every reference is then replayed through envace against the real server (``world.yaml``: one
server process per episode), and each call's result is recorded in the task
(``reference.calls[i].result``): with no world, the warm start replays the reference from those
results, the very samples the server would give. Each reference must meet its own checklist and
the implicit guards (reward 1.0, the ``answer_excludes`` derived from the recorded results
included) with no tool error, against the server and replayed from its recorded results judged
with no world as a rehearsal step is. Needs the ``mcp`` extra:
    python examples/mcp_notes/make_tasks.py
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from notes import TAGS, Notes  # noqa: E402

from envace.core.jsonl import atomic_write_text  # noqa: E402
from envace.core.types import Task  # noqa: E402
from envace.envs.registry import resolve_world  # noqa: E402
from envace.rollout.sources import RealSource  # noqa: E402
from envace.train.sft import RecordedSource, assert_full_marks, oracle_replays, record_reference_results  # noqa: E402

N = 36
WORLD = str(HERE / "world.yaml")
ROOT = HERE.parents[1]  # world.yaml names the server from the repository root


def task(i: int) -> dict:
    notes = Notes(seed=i)
    rng = random.Random(i)
    note = rng.choice(list(notes.notes.values()))
    topic = note["title"].split()[0]
    kind = i % 4
    if kind == 0:
        instruction = f"What is on my {topic.lower()} list?"
        calls = [("search_notes", {"text": topic}), ("get_note", {"note_id": note["id"]})]
        item = note["body"].split(", ")[0]
        answer = f"Your {topic.lower()} list says: {note['body']}."
        checklist = [{"kind": "called", "tool": "get_note", "args": {"note_id": note["id"]}},
                     {"kind": "answer_contains", "text": item}]
    elif kind == 1:
        instruction = f"Delete my {topic.lower()} list, please."
        calls = [("search_notes", {"text": topic}), ("delete_note", {"note_id": note["id"]})]
        answer = f"I deleted note {note['id']} ({note['title']})."
        checklist = [{"kind": "called", "tool": "delete_note", "args": {"note_id": note["id"]}}]
    elif kind == 2:
        tag = rng.choice(TAGS)
        title = rng.choice(["Call mom", "Pay rent", "Fix bike", "Book dentist", "Water plants"])
        instruction = f"Add a note titled '{title}' saying 'this week', tagged {tag}."
        new_id = f"n{notes.next_id}"
        calls = [("create_note", {"title": title, "body": "this week", "tag": tag})]
        answer = f"Created note {new_id}: {title}."
        checklist = [{"kind": "called", "tool": "create_note", "args": {"title": title, "tag": tag}},
                     {"kind": "answer_contains", "text": new_id}]
    else:
        tag = note["tag"]
        titles = [n["title"] for n in notes.list_notes(tag)]
        instruction = f"Which of my notes are tagged {tag}?"
        calls = [("list_notes", {"tag": tag})]
        answer = "Tagged " + tag + ": " + ", ".join(titles) + "."
        checklist = [{"kind": "called", "tool": "list_notes", "args": {"tag": tag}}] + [
            {"kind": "answer_contains", "text": t} for t in titles]
    shown = Notes(seed=i)  # grounding from the untouched state, as the episode starts
    examples = [{"tool": "list_notes", "arguments": {}, "result": shown.list_notes()},
                {"tool": calls[0][0], "arguments": calls[0][1],
                 "result": getattr(shown, calls[0][0])(**calls[0][1])}]
    return {"id": f"notes-{i:03d}", "domain": "notes", "instruction": instruction, "checklist": checklist,
            "examples": examples, "env": {"args": {"seed": i}},
            "reference": {"calls": [{"name": t, "arguments": a} for t, a in calls], "answer": answer}}


def replay(rows: list[dict]) -> None:
    """Each reference, run by envace against the server, makes its calls with no tool error; their
    results are recorded in the row. Then, with the results recorded (and the guards derived from
    them), it meets its whole checklist against the server, and again replayed from the recorded
    results with no world, with the same messages."""
    with contextlib.chdir(ROOT):
        world = resolve_world(WORLD)
        try:  # the tasks list no tools: a run gives them the server's listing, as here
            tools = world.tools()
        finally:
            world.shutdown()
        listed = lambda: [Task.model_validate(r).model_copy(update={"tools": tools}) for r in rows]  # noqa: E731
        record_reference_results(rows, oracle_replays(listed(), RealSource(WORLD)), "against the server")
        tasks = listed()
        real, recorded = oracle_replays(tasks, RealSource(WORLD)), oracle_replays(tasks, RecordedSource())
    for task_, a, b in zip(tasks, real, recorded):
        assert_full_marks(task_, a, "against the server")
        assert_full_marks(task_, b, "replayed from its recorded results, judged with no world")
        assert [(m.role, m.content) for m in a.messages] == [(m.role, m.content) for m in b.messages], task_.id


def main() -> None:
    rows = [task(i) for i in range(N)]
    replay(rows)
    path = HERE / "tasks.jsonl"
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))  # never half a file
    print(f"wrote {len(rows)} tasks to {path}")


if __name__ == "__main__":
    main()
