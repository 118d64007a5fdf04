"""Real-world eval success per task template, for training runs on the embedded worlds: where a
run gained or lost (issue #20: "if held-out success does not move, find out why").

    python benchmarks/per_template.py RUN [RUN ...] [--start RUN]

A template is a world plus the reference solution's sequence of tool names (what the task
generator's template asks for). For each run: success of every template at its first and last
eval (``--start``: the first eval comes from that run, as in eval_gain.py), tasks and episodes per
template, sorted by the gain.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from envace.experiments.config import parse_config
from envace.experiments.report import eval_task_success
from envace.experiments.rundir import RunDir
from envace.experiments.train_job import real_eval_tasks


def templates(run: RunDir) -> dict[str, str]:
    """Task id -> template name, from the run's own config (the same held-out tasks it evaluated)."""
    cfg = parse_config(run.config(), str(run.path / "config.yaml"))
    tasks = real_eval_tasks(cfg, [])
    return {t.id: f"{t.id.split('-')[0]}: " + (" > ".join(c.name for c in t.reference.calls) if t.reference else "?")
            for t in tasks}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--start", type=Path, metavar="RUN", help="the first eval comes from this run")
    args = p.parse_args(argv)
    start = None
    if args.start is not None:
        by = eval_task_success(RunDir.open(args.start))
        start = by[min(by)] if by else None
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
