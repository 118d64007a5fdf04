"""``envace report``: markdown summary and PNG plots of one run, or one plot comparing several."""

from __future__ import annotations

import argparse
from pathlib import Path

# Every command module loads for `envace --help`: the run directory and report modules are imported by
# the handler.


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write summary.md and plots of run directories")
    p.add_argument("runs", nargs="+", help="run directories")
    p.add_argument("--compare", default=None, metavar="PNG", help="one learning-curve plot over all the runs")
    p.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    from envace.experiments.report import missing_parts, plot_learning_curve, run_labels, write_report
    from envace.experiments.rundir import RunDir

    runs = [RunDir.open(r) for r in args.runs]
    for run in runs:
        for note in missing_parts(run):
            print(f"{run.path.name}: {note}")
        print(f"wrote {write_report(run)}")
    if args.compare:
        print(f"wrote {plot_learning_curve(run_labels(runs), Path(args.compare))}")
    return 0
