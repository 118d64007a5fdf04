"""Real-world eval success per task template, for training runs on the embedded worlds: where a
run gained or lost (issue #20: "if held-out success does not move, find out why").

    python benchmarks/per_template.py RUN [RUN ...] [--start RUN] [--failures]

A template is a world plus the reference solution's sequence of tool names (what the task
generator's template asks for). For each run: success of every template at its first and last
eval (``--start``: the first eval comes from that run, as in eval_gain.py), tasks and episodes per
template, sorted by the gain. ``--failures``: also how the episodes failed, start -> end, as shares
of the template's episodes: a malformed tool call (one that did not parse), a
tool-side check unmet (``called``, ``state``, ``end_state``, ``writes``: the wrong call or
arguments, or a write the reference does not make), or only the answer wrong.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from envace.core.jsonl import read_jsonl_dicts
from envace.core.types import solved
from envace.experiments.config import parse_config
from envace.experiments.report import eval_task_success
from envace.experiments.rundir import RunDir
from envace.experiments.tasksets import real_eval_tasks


def templates(run: RunDir) -> dict[str, str]:
    """Task id -> template name, from the run's own config (the same held-out tasks it evaluated)."""
    cfg = parse_config(run.config(), str(run.path / "config.yaml"))
    tasks = real_eval_tasks(cfg, [])
    return {t.id: f"{t.id.split('-')[0]}: " + (" > ".join(c.name for c in t.reference.calls) if t.reference else "?")
            for t in tasks}


# The writes guard (every successful write against the reference's) judges calls, not the answer.
CALL_CHECKS = frozenset({"called", "state", "end_state", "writes"})
MODES = ("malformed", "call", "answer")


def failure_modes(run: RunDir, step: int, names: dict[str, str]) -> dict[str, dict[str, float]]:
    """Template -> failure mode -> share of the template's eval episodes at ``step``: ``malformed``
    (at least one tool call that did not parse), ``call`` (a tool-side check unmet), ``answer``
    (failed with every tool-side check met)."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(("episodes", *MODES), 0))
    for row in read_jsonl_dicts(run.path / "evals.jsonl"):
        if row["step"] != step:
            continue
        c = counts[names.get(row["task_id"], "?")]
        c["episodes"] += 1
        c["malformed"] += row.get("parse_failures", 0) > 0
        if not solved(row["reward"]):
            # met None is an item that could not be judged (no judge, no reference), not a failure
            unmet = {v["item"]["kind"] for v in row.get("verdicts", []) if v["met"] is False}
            c["call" if unmet & CALL_CHECKS else "answer"] += 1
    return {name: {m: c[m] / c["episodes"] for m in MODES} for name, c in counts.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--start", type=Path, metavar="RUN", help="the first eval comes from this run")
    p.add_argument("--failures", action="store_true", help="also how the episodes failed, start -> end")
    args = p.parse_args(argv)
    start = start_run = start_step = None
    if args.start is not None:
        start_run = RunDir.open(args.start)
        by = eval_task_success(start_run)
        start_step = min(by, default=None)
        start = by[start_step] if by else None
    for path in args.runs:
        run = RunDir.open(path)
        by_step = eval_task_success(run)
        if not by_step:
            p.error(f"{path}: no eval episodes (evals.jsonl)")
        first = start if start is not None else by_step[min(by_step)]
        last = by_step[max(by_step)]
        names = templates(run)
        groups: dict[str, list[str]] = defaultdict(list)
        for tid in last:
            groups[names.get(tid, "?")].append(tid)
        print(f"\n{path} (source {run.config().get('source')}, eval step {max(by_step)})")
        print("| template | tasks | start | end | gain |\n|---|---|---|---|---|")
        rows = []
        for name, ids in groups.items():
            a = sum(first.get(t, 0.0) for t in ids) / len(ids)
            b = sum(last[t] for t in ids) / len(ids)
            rows.append((b - a, name, len(ids), a, b))
        for gain, name, n, a, b in sorted(rows, reverse=True):
            print(f"| {name} | {n} | {a:.3f} | {b:.3f} | {gain:+.3f} |")
        if args.failures:
            before = (failure_modes(start_run, start_step, names) if start_run is not None
                      else failure_modes(run, min(by_step), names))
            after = failure_modes(run, max(by_step), names)
            print("\nshare of episodes, start -> end\n| template | malformed call | tool check unmet | only the answer wrong |"
                  "\n|---|---|---|---|")
            for _, name, *_ in sorted(rows, reverse=True):
                b, e = before.get(name, dict.fromkeys(MODES, 0.0)), after[name]
                print(f"| {name} | " + " | ".join(f"{b[m]:.3f} -> {e[m]:.3f}" for m in MODES) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
