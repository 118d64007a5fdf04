"""Does a code change leave training's figures as they were? Runs `envace train` on a config (fixed
seed) and compares its metrics.jsonl row by row with an earlier run's: every value except the
timings must be equal.

    # once, before the change (from a checkout of the old revision):
    python benchmarks/same_rewards.py --config configs/smoke.yaml --save /tmp/smoke_before
    # after it:
    python benchmarks/same_rewards.py --config configs/smoke.yaml --against /tmp/smoke_before

    # the demo's first steps, short (about a minute; `--demo` adds the overrides below):
    python benchmarks/same_rewards.py --demo --save /tmp/demo_before
    python benchmarks/same_rewards.py --demo --against /tmp/demo_before

Prints the differing values and exits 1 when any differ; metrics only the later run logs are
listed, not compared. Run it with OMP_NUM_THREADS=1 on both sides: float sums, and so the sampled
episodes, depend on the thread count. A setting that changes what is rehearsed (e.g.
rollout.examples_as_recorded, on by default) changes the figures by design: to check a refactor
against a run from before it, `--set` it to the old behaviour.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

# the demo's pipeline (copy warm-up, SFT, rehearsal GRPO, real-world eval) at a size that runs in minutes
DEMO = ["steps=2", "sft.copy_warmup_steps=50", "sft.trajectories=60", "sft.simulator_trajectories=60",
        "sft.epochs=1", "eval.every=2", "eval.samples=2", "tasks_per_step=4"]
# wall-clock figures: they differ run to run
TIMING = ("_s", "seconds", "tokens_per_s", "tok/s")


def run(config: str, overrides: list[str], out: Path) -> Path:
    cmd = [sys.executable, "-m", "envace.cli.main", "train", "--config", config, "--set", f"out={out}"]
    for o in overrides:
        cmd += ["--set", o]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir / "metrics.jsonl"


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def differences(before: list[dict], after: list[dict]) -> tuple[list[str], set[str]]:
    """(the values that differ, the keys only the later run logs: a new metric changes no figure)."""
    out, new = [], set()
    if len(before) != len(after):
        out.append(f"{len(before)} rows before, {len(after)} after")
    for i, (a, b) in enumerate(zip(before, after)):
        for key in sorted(set(a) | set(b)):
            if key.endswith(TIMING):
                continue
            if key not in a:
                new.add(key)
                continue
            x, y = a.get(key), b.get(key)
            same = x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
            if not same:
                out.append(f"row {i + 1} ({a.get('phase')} step {a.get('step')}): {key}: {x} -> {y}")
    return out, new


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/smoke.yaml")
    ap.add_argument("--demo", action="store_true", help="configs/demo.yaml, shortened (see DEMO)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more overrides")
    ap.add_argument("--metrics", type=Path, help="compare this run's metrics.jsonl instead of running one")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--save", type=Path, help="keep this run's metrics.jsonl in DIR")
    where.add_argument("--against", type=Path, help="compare with DIR/metrics.jsonl")
    args = ap.parse_args()
    config = "configs/demo.yaml" if args.demo else args.config
    overrides = (DEMO if args.demo else []) + args.set
    with tempfile.TemporaryDirectory() as tmp:
        metrics = args.metrics or run(config, overrides, Path(tmp))
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            (args.save / "metrics.jsonl").write_text(metrics.read_text(encoding="utf-8"), encoding="utf-8")
            print(f"saved {len(rows(metrics))} rows to {args.save / 'metrics.jsonl'}")
            return 0
        before, after = rows(args.against / "metrics.jsonl"), rows(metrics)
    if not any("global_step" in r for r in before):  # per-optimiser-step rows a later version logs
        skipped = [r for r in after if "global_step" in r]
        after = [r for r in after if "global_step" not in r]
        if skipped:
            print(f"{len(skipped)} per-step warm-start rows (global_step) the earlier run did not log: not compared")
    diff, new = differences(before, after)
    for line in diff:
        print(line)
    if new:
        print(f"new keys (not compared): {', '.join(sorted(new))}")
    print(f"{len(after)} rows, {'the same' if not diff else f'{len(diff)} differences'} (timings left out)")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
