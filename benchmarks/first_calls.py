"""What a run's eval episodes call first, against each task's reference: does the caller make a
call, name a tool the tasks have, and pick the reference's first tool? Reads the eval episodes a
training run saved (``evals.jsonl``), so nothing is re-run; the task file is the run's own
(``config.yaml``'s ``task_file``, relative to the current directory, or ``--tasks``).

    python benchmarks/first_calls.py runs/A runs/B --step 0

A warm start that has not learnt the tool names shows here first: many first calls to invented
names (answered TOOL_NOT_AVAILABLE) while the failure classes only say ``wrong_tool``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import yaml


def _tasks(path: Path) -> dict[str, dict]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out[row["id"]] = row
    return out


def _calls(messages: list[dict]) -> list[str]:
    names = []
    for m in messages:
        if m.get("role") == "assistant":
            for tc in m.get("tool_calls") or []:
                names.append(tc.get("name") or (tc.get("function") or {}).get("name"))
    return names


def first_calls(run: Path, step: int | None, tasks_path: Path | None) -> dict[str, float | int | str]:
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    path = tasks_path or Path(cfg.get("task_file") or "")
    if not path.is_file():
        raise SystemExit(f"{run}: its task file {path} is not here (give --tasks)")
    tasks = _tasks(path)
    rows = [json.loads(x) for x in (run / "evals.jsonl").read_text().splitlines() if x.strip()]
    steps = sorted({r["step"] for r in rows})
    at = steps[0] if step is None else step
    rows = [r for r in rows if r["step"] == at]
    if not rows:
        raise SystemExit(f"{run}: no eval episodes at step {at} (steps: {steps})")
    known = {t["function"]["name"] if "function" in t else t["name"] for task in tasks.values()
             for t in task.get("tools") or []}
    c: Counter = Counter()
    for r in rows:
        task = tasks[r["task_id"]]
        ref = [x["name"] for x in (task.get("reference") or {}).get("calls", [])]
        calls = _calls(r["messages"])
        c["episodes"] += 1
        if calls:
            c["a call"] += 1
            c["a known tool"] += calls[0] in known
            c["the reference's first tool"] += bool(ref) and calls[0] == ref[0]
    n = c["episodes"]
    return {"run": run.name, "step": at, "episodes": n,
            **{f"first call: {k}": round(c[k] / n, 3) for k in ("a call", "a known tool", "the reference's first tool")}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="training run directories")
    p.add_argument("--step", type=int, help="eval step (default: each run's first)")
    p.add_argument("--tasks", type=Path, help="the task file (default: the run's task_file)")
    args = p.parse_args(argv)
    for run in args.runs:
        print(json.dumps(first_calls(run, args.step, args.tasks)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
