"""Test-time rehearsal budget sweep on a paper benchmark (issue #20): for each budget, one
`envace eval --bench ...` run (budget 0: no rehearsal; b > 0: `--rehearse MODE --budget b`), all on
the same entries and seed, then a table of the benchmark's score per budget with the paired gain
over budget 0 (95% bootstrap CI over entries) and the tokens generated per entry.

    python benchmarks/bench_testtime.py --bench bfcl --category multi_turn_base --limit 4 \
        --model RUN/sft/step-00000000 --budgets 0,1,2 --memory plan --out OUT [-- extra eval flags]

Flags after `--` go to every `envace eval` call unchanged (e.g. `--max-steps 3 --dtype bfloat16`).
Each budget's run directory is OUT/b<budget>; a budget whose scores.jsonl exists is not run again.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envace.cli.main import main as envace
from envace.core.jsonl import read_jsonl_dicts as _rows
from envace.experiments.stats import paired_bootstrap_diff


def scores(run: Path) -> dict[str, float]:
    """entry id -> the benchmark's reward of the committed episode."""
    return {r["item_id"]: float(r["reward"]) for r in _rows(run / "scores.jsonl")}


def tokens(run: Path) -> float:
    """Generated tokens per entry: the committed episodes' caller turns plus every rehearsed turn
    (the imagined caller and the imagined tool responses)."""
    committed = _rows(run / "trajectories.jsonl")
    n = len(committed) or 1
    total = sum(len(s.get("gen_ids", [])) for t in committed for s in t.get("samples", []))
    total += sum(r.get("caller_tokens", 0) + r.get("simulator_tokens", 0) for r in _rows(run / "rehearsals.jsonl"))
    return total / n


def table(out: Path, budgets: list[int]) -> list[str]:
    base = scores(out / "b0") if 0 in budgets else {}
    lines = ["| budget | entries | score | gain over budget 0 [95% CI] | tokens/entry |", "|---|---|---|---|---|"]
    for b in budgets:
        s = scores(out / f"b{b}")
        if not s:
            continue
        gain = "-"
        common = sorted(set(s) & set(base))
        if b and common:
            d, lo, hi = paired_bootstrap_diff([s[i] for i in common], [base[i] for i in common])
            gain = f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]"
        lines.append(f"| {b} | {len(s)} | {sum(s.values()) / len(s):.3f} | {gain} | {tokens(out / f'b{b}'):.0f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bench", required=True)
    p.add_argument("--category", required=True)
    p.add_argument("--limit", type=int, default=4)
    p.add_argument("--model", required=True)
    p.add_argument("--budgets", default="0,1,2")
    p.add_argument("--mode", default="parallel", choices=["parallel", "sequential"])
    p.add_argument("--memory", default="plan", choices=["rule", "plan"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    budgets = sorted({int(b) for b in a.budgets.split(",") if b.strip()})
    out = Path(a.out)
    for b in budgets:
        if scores(out / f"b{b}"):
            continue
        cmd = ["eval", "--bench", a.bench, "--category", a.category, "--limit", str(a.limit), "--model", a.model,
               "--seed", str(a.seed), "--out", str(out), "--name", f"b{b}", *extra]
        if b:
            cmd += ["--rehearse", a.mode, "--budget", str(b), "--memory", a.memory]
        if envace(cmd) != 0:
            return 1
    print(f"{a.bench} {a.category}, {a.limit} entries per category, {a.model}, {a.mode} rehearsal, {a.memory} memory")
    print("\n".join(table(out, budgets)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
