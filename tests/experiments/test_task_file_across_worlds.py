"""One task file serves a Python class, an MCP server and a schema-only run: 'state' items a run
cannot query are one warning line, not an error; an unloadable --world is reported once."""

from __future__ import annotations

import warnings
from pathlib import Path

from envace.experiments.task_check import TaskFileWarning, load_checked_tasks, validate_task_file

TASKS = Path(__file__).resolve().parents[2] / "examples" / "helpdesk" / "tasks.jsonl"


def test_state_items_without_a_world_are_one_warning_line_and_the_tasks_load(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checked = load_checked_tasks(TASKS)  # world null: schema-only
    assert len(checked.tasks) == 72
    lines = [str(w.message) for w in caught if issubclass(w.category, TaskFileWarning)
             and "will not be judged" in str(w.message)]
    n_state = sum(i.kind == "state" for t in checked.tasks for i in t.checklist)
    assert n_state > 0 and lines == [lines[0]] and lines[0].startswith(f"{TASKS}: {n_state} state items will not")
    _, problems = validate_task_file(TASKS)  # validate still lists each, as a warning
    assert sum("will not be judged" in p.message for p in problems) == n_state
    assert all(p.severity == "warning" for p in problems)


def test_an_unloadable_world_is_reported_once(tmp_path):
    rows = TASKS.read_text().splitlines(keepends=True)[:9]
    path = tmp_path / "nine.jsonl"
    path.write_text("".join(rows))
    _, problems = validate_task_file(path, world=str(tmp_path / "missing.py") + ":Desk")
    loads = [p for p in problems if p.message.startswith("cannot load world")]
    assert len(loads) == 1 and loads[0].severity == "error"
