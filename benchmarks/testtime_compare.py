"""Paired table of two `envace eval --sweep` runs on the same tasks (e.g. a trained checkpoint and
its warm start): per condition, success, the paired gain over no rehearsal with its 95% bootstrap
CI, and tokens per task; then the difference of the two gains (trained minus warm), paired over tasks.

    python benchmarks/testtime_compare.py OUT/trained OUT/warm
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from envace.experiments.eval_report import condition_table
from envace.experiments.stats import paired_bootstrap_diff


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "committed.jsonl").read_text().splitlines() if line.strip()]


def gains(rs: list[dict]) -> dict[str, dict[str, float]]:
    """condition -> task -> success minus that task's no-rehearsal success."""
    base = {r["task_id"]: float(r["success"]) for r in rs if r["condition"] == "none"}
    out: dict[str, dict[str, float]] = {}
    for r in rs:
        if r["condition"] != "none" and r["task_id"] in base:
            out.setdefault(r["condition"], {})[r["task_id"]] = float(r["success"]) - base[r["task_id"]]
    return out


def main(a: str, b: str) -> None:
    ra, rb = rows(Path(a)), rows(Path(b))
    ta, tb = ({t["condition"]: t for t in condition_table(r)} for r in (ra, rb))
    ga, gb = gains(ra), gains(rb)
    print(f"A = {a}, B = {b}; tasks: {len({r['task_id'] for r in ra})}")
    print("| condition | A success | A gain [95% CI] | B success | B gain [95% CI] | A gain - B gain [95% CI] | "
          "tokens/task A, B |")
    print("|---|---|---|---|---|---|---|")
    for cond, x in ta.items():
        y = tb.get(cond)
        if y is None:
            continue

        def gain(t: dict) -> str:
            return f"{t['delta']:+.3f} [{t['delta_lo']:+.3f}, {t['delta_hi']:+.3f}]" if "delta" in t else "-"

        diff = "-"
        if cond in ga and cond in gb:
            common = sorted(set(ga[cond]) & set(gb[cond]))
            d, lo, hi = paired_bootstrap_diff([ga[cond][t] for t in common], [gb[cond][t] for t in common])
            diff = f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]"
        print(f"| {cond} | {x['success']:.3f} | {gain(x)} | {y['success']:.3f} | {gain(y)} | {diff} | "
              f"{x['tokens_per_task']:.0f}, {y['tokens_per_task']:.0f} |")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
