"""How much each training run's real-world eval rose, paired over tasks, and the runs pooled.

Reads the eval episodes the runs already saved (``evals.jsonl``), so nothing is re-run: for each
run, success at its first and last eval step (or ``--from``/``--to``), the gain averaged over tasks
with its paired standard error, and for several runs the gain over all their tasks together. The
pooled figure treats the runs' tasks as independent: pool runs on different task sets (e.g. the
demo with ``--set seed=0|1|2``), not two runs on the same pool.

    python benchmarks/eval_gain.py runs/demo-s0/train-* runs/demo-s1/train-* runs/demo-s2/train-*
"""

from __future__ import annotations

import argparse
from pathlib import Path

from envace.experiments.report import eval_gain, eval_task_success
from envace.experiments.rundir import RunDir
from envace.experiments.stats import paired_gain


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="training run directories")
    p.add_argument("--from", dest="first", type=int, help="eval step to start from (default: each run's first)")
    p.add_argument("--to", dest="last", type=int, help="eval step to compare (default: each run's last)")
    args = p.parse_args(argv)
    lines = ["| run | tasks | start | end | gain (paired s.e.) |", "|---|---|---|---|---|"]
    before: dict[tuple[str, str], float] = {}
    after: dict[tuple[str, str], float] = {}
    for path in args.runs:
        try:
            run = RunDir.open(path)
            first, last, gain, se, n = eval_gain(run, args.first, args.last)
        except (FileNotFoundError, ValueError) as e:
            p.error(str(e))
        by_step = eval_task_success(run)
        a, b = by_step[first], by_step[last]
        before.update({(str(path), t): v for t, v in a.items()})
        after.update({(str(path), t): v for t, v in b.items()})
        lines.append(f"| {path} | {n} | {sum(a.values()) / len(a):.3f} (step {first}) | "
                     f"{sum(b.values()) / len(b):.3f} (step {last}) | {gain:+.3f} ({se:.3f}) |")
    if len(args.runs) > 1:
        gain, se, n = paired_gain(before, after)
        lines.append(f"| pooled | {n} | {sum(before.values()) / len(before):.3f} | "
                     f"{sum(after.values()) / len(after):.3f} | {gain:+.3f} ({se:.3f}) |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
