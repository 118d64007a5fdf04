"""How much each training run's real-world eval rose, paired over tasks, and the runs pooled.

Reads the eval episodes the runs already saved (``evals.jsonl``), so nothing is re-run: for each
run, success at its first and last eval step (or ``--from``/``--to``), the gain averaged over tasks
with its paired standard error, and for several runs of one training source the gain over all
their tasks together. The pooled figure treats the runs' tasks as independent: pool runs on
different task sets (e.g. the demo with ``--set seed=0|1|2``), not two runs on the same pool.

    python benchmarks/eval_gain.py runs/demo-s0/train-* runs/demo-s1/train-* runs/demo-s2/train-*

``--plot PNG`` draws, per training source among the runs, the success over all their tasks at
each eval step, with the paired standard error of the gain since the first step as error bars.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from envace.experiments.report import eval_steps, eval_task_success
from envace.experiments.rundir import RunDir
from envace.experiments.stats import paired_gain


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="training run directories")
    p.add_argument("--from", dest="first", type=int, help="eval step to start from (default: each run's first)")
    p.add_argument("--to", dest="last", type=int, help="eval step to compare (default: each run's last)")
    p.add_argument("--plot", type=Path, metavar="PNG", help="success by step per source, the runs pooled")
    p.add_argument("--start", type=Path, metavar="RUN", help="the start figures come from this run's first eval: "
                   "for runs from its warm start that skipped their own (eval.at_start: false)")
    p.add_argument("--start-step", type=int, metavar="K", help="with --start: that run's eval at step K instead "
                   "of its first (e.g. two runs from one start compared at the same step)")
    args = p.parse_args(argv)
    start, start_where = None, "start run"
    if args.start is not None:
        try:
            start_by_step = eval_task_success(RunDir.open(args.start))
        except (FileNotFoundError, ValueError) as e:
            p.error(str(e))
        if not start_by_step:
            p.error(f"{args.start}: no eval episodes (evals.jsonl)")
        k = min(start_by_step) if args.start_step is None else args.start_step
        if k not in start_by_step:
            p.error(f"{args.start}: no eval at step {k} (steps: {sorted(start_by_step)})")
        start = start_by_step[k]
        if args.start_step is not None:
            start_where = f"start run, step {k}"
    elif args.start_step is not None:
        p.error("--start-step needs --start")
    lines = ["| run | tasks | start | end | gain (paired s.e.) |", "|---|---|---|---|---|"]
    # pooled per training source: a run and its baseline share their tasks, so never pool across
    before: dict[str, dict[tuple[str, str], float]] = {}
    after: dict[str, dict[tuple[str, str], float]] = {}
    runs_of: dict[str, list[dict[int, dict[str, float]]]] = {}  # source -> each run's eval_task_success
    for path in args.runs:
        try:
            run = RunDir.open(path)
            by_step = eval_task_success(run)
            if start is not None:  # the run may hold only its final eval
                by_step = {-1: start, **by_step}
            first, last = eval_steps(run, by_step, args.first, args.last)
        except (FileNotFoundError, ValueError) as e:
            p.error(str(e))
        a, b = by_step[first], by_step[last]
        if set(a) != set(b):
            p.error(f"{path}: the start and end evals are on different tasks")
        gain, se, n = paired_gain(a, b)
        source = run.config().get("source", "?")
        runs_of.setdefault(source, []).append(by_step)
        before.setdefault(source, {}).update({(str(path), t): v for t, v in a.items()})
        after.setdefault(source, {}).update({(str(path), t): v for t, v in b.items()})
        where = start_where if first == -1 else f"step {first}"
        lines.append(f"| {path} | {n} | {sum(a.values()) / len(a):.3f} ({where}) | "
                     f"{sum(b.values()) / len(b):.3f} (step {last}) | {gain:+.3f} ({se:.3f}) |")
    for source, members in runs_of.items():
        if len(members) > 1:
            a, b = before[source], after[source]
            gain, se, n = paired_gain(a, b)
            lines.append(f"| pooled {source} | {n} | {sum(a.values()) / len(a):.3f} | "
                         f"{sum(b.values()) / len(b):.3f} | {gain:+.3f} ({se:.3f}) |")
    print("\n".join(lines))
    if args.plot:
        print(f"wrote {plot_by_source(runs_of, args.plot)}")
    return 0


def plot_by_source(runs_of: dict[str, list[dict[int, dict[str, float]]]], path: Path) -> Path:
    """Pooled success per source (its runs' eval_task_success) at the eval steps they all share."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for source, by_run in runs_of.items():
        steps = sorted(set.intersection(*(set(b) for b in by_run)))
        pooled = {s: {(i, t): v for i, b in enumerate(by_run) for t, v in b[s].items()} for s in steps}
        means = [sum(pooled[s].values()) / len(pooled[s]) for s in steps]
        errs = [0.0 if s == steps[0] else paired_gain(pooled[steps[0]], pooled[s])[1] for s in steps]
        n = len(pooled[steps[0]])
        ax.errorbar(steps, means, yerr=errs, marker="o", capsize=3,
                    label=f"{source} ({len(by_run)} run{'s' if len(by_run) > 1 else ''}, {n} tasks)")
    ax.set_xlabel("step"), ax.set_ylabel("real-world success (runs pooled)")
    ax.set_title("error bars: paired s.e. of the gain since the first eval", fontsize=9)
    ax.grid(alpha=0.3), ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
