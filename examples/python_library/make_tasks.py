"""Writes tasks.jsonl for the library example: 36 tasks from four templates, each with a reference
solution, a checklist, the tool schemas envace derives from library.py (the read-only tools carry
``annotations.readOnlyHint``, from ``@envace.readonly``), and real call/result examples from the
same library state (the rehearsal's grounding).

Every reference is replayed in the real class through envace before the file is written, and each
call's real result is recorded in the task (``reference.calls[i].result``): with no world, the
warm start replays the reference from those results, the very samples the class would give. Each
reference must meet its own checklist and the implicit guards (reward 1.0, the ``answer_excludes``
derived from the recorded results included) with no tool error, both in the real class and
replayed from its recorded results, judged with no world as a rehearsal step is. Rerun after
editing the tools:
    python examples/python_library/make_tasks.py
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from library import Library  # noqa: E402

from envace.core.jsonl import atomic_write_text  # noqa: E402
from envace.core.types import Task  # noqa: E402
from envace.envs.registry import resolve_world  # noqa: E402
from envace.rollout.sources import RealSource  # noqa: E402
from envace.train.sft import RecordedSource, assert_full_marks, oracle_replays, record_reference_results  # noqa: E402

SPEC = str(HERE / "library.py") + ":Library"

N = 36


def call(lib: Library, tool: str, **args):
    return getattr(lib, tool)(**args)


def task(i: int, tools: list[dict]) -> dict:
    lib = Library()
    lib.reset(seed=i)
    rng = random.Random(i)
    book = rng.choice([b for b in lib.books.values() if b["copies"] > 0] or list(lib.books.values()))
    mid, name = rng.choice(sorted(lib.members.items()))
    kind = i % 4
    if kind == 0:
        instruction = f"How many copies of {book['title']} can I borrow right now?"
        calls = [("search_books", {"query": book["title"]}), ("book_status", {"book_id": book["id"]})]
        answer = f"{book['copies']} copies of {book['title']} are available."
        checklist = [{"kind": "called", "tool": "book_status", "args": {"book_id": book["id"]}},
                     {"kind": "answer_contains", "text": str(book["copies"])}]
    elif kind == 1:
        instruction = f"Please lend {book['title']} to {name}."
        calls = [("find_member", {"name": name}), ("search_books", {"query": book["title"]}),
                 ("borrow_book", {"member_id": mid, "book_id": book["id"]})]
        ok = book["copies"] > 0
        answer = f"Done: {name} borrowed {book['title']} (loan L1)." if ok else f"No copy of {book['title']} is available."
        checklist = [{"kind": "called", "tool": "borrow_book", "args": {"member_id": mid, "book_id": book["id"]}},
                     {"kind": "answer_contains", "text": "L1" if ok else "available"}]
    elif kind == 2:
        author = book["author"]
        titles = [b["title"] for b in lib.books.values() if b["author"] == author]
        instruction = f"Which books by {author} do you have?"
        calls = [("search_books", {"query": author.split()[-1]})]
        answer = "We have " + ", ".join(titles) + "."
        checklist = [{"kind": "called", "tool": "search_books"}] + [
            {"kind": "answer_contains", "text": t} for t in titles]
    else:
        instruction = f"What is {name}'s member id?"
        calls = [("find_member", {"name": name})]
        answer = f"{name}'s member id is {mid}."
        checklist = [{"kind": "called", "tool": "find_member", "args": {"name": name}},
                     {"kind": "answer_contains", "text": mid}]
    # Grounding: the real result of the first lookup, and of another member's lookup (same state).
    other = next(n for m, n in sorted(lib.members.items()) if n != name)
    first_tool, first_args = calls[0]
    examples = [{"tool": first_tool, "arguments": first_args, "result": call(lib, first_tool, **first_args)},
                {"tool": "find_member", "arguments": {"name": other}, "result": call(lib, "find_member", name=other)}]
    return {"id": f"library-{i:03d}", "domain": "library", "instruction": instruction, "tools": tools,
            "checklist": checklist, "examples": examples, "env": {"args": {"seed": i}},
            "reference": {"calls": [{"name": t, "arguments": a} for t, a in calls], "answer": answer}}


def replay(rows: list[dict]) -> None:
    """Each reference, run by envace in the real library, makes its calls with no tool error; their
    results are recorded in the row. Then, with the results recorded (and the guards derived from
    them), the reference meets its checklist and the writes guard in the real library, and again
    replayed from the recorded results with no world, with the same messages."""
    first = oracle_replays([Task.model_validate(r) for r in rows], RealSource(SPEC))
    record_reference_results(rows, first, "in the real library")
    tasks = [Task.model_validate(r) for r in rows]
    real, recorded = oracle_replays(tasks, RealSource(SPEC)), oracle_replays(tasks, RecordedSource())
    for task_, a, b in zip(tasks, real, recorded):
        assert_full_marks(task_, a, "in the real library")
        assert_full_marks(task_, b, "replayed from its recorded results, judged with no world")
        assert [(m.role, m.content) for m in a.messages] == [(m.role, m.content) for m in b.messages], task_.id


def main() -> None:
    provider = resolve_world(SPEC)
    try:
        tools = [t.model_dump(mode="json") for t in provider.tools()]
    finally:
        provider.shutdown()
    rows = [task(i, tools) for i in range(N)]
    replay(rows)
    path = HERE / "tasks.jsonl"
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))  # never half a file
    print(f"wrote {len(rows)} tasks to {path}")


if __name__ == "__main__":
    main()
