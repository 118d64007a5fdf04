"""What a tool-use warm start trained on the embedded worlds gives a domain it never saw.

1. ``envace sft --config configs/warmstart.yaml`` (SmolLM2 + LoRA on the shop, calendar and bank
   references; skipped with ``--warm-start DIR``);
2. the real-world eval of ``examples/python_library`` (its held-out tasks against the real
   ``Library`` class) from zero-shot SmolLM2 and from that warm start, through the example's own
   config with no training step (``steps: 0``), so both score the same tasks the same way;
3. per start: success, tool calls and parse failures per episode, and the warm start's success
   gain over zero-shot paired over tasks, with its standard error.

    OMP_NUM_THREADS=1 python benchmarks/warmstart_transfer.py --out runs/transfer
    python benchmarks/warmstart_transfer.py --warm-start runs/transfer/ws/sft-.../sft --out runs/transfer

The defaults are a small measurement for two CPU cores (a 60-replay warm start, 4 sampled
episodes per held-out task); ``--trajectories`` and ``--samples`` make it larger.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from envace.experiments.report import eval_task_success
from envace.experiments.rundir import RunDir
from envace.experiments.stats import paired_gain

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "examples" / "python_library"


def envace(*args: str) -> None:
    cmd = [sys.executable, "-m", "envace.cli.main", *args]
    print("$ envace " + " ".join(args), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def only_run(parent: Path, prefix: str) -> Path:
    runs = sorted(p for p in parent.iterdir() if p.name.startswith(prefix))
    if len(runs) != 1:
        raise SystemExit(f"{parent}: expected one {prefix}* run, found {len(runs)} (use a fresh --out)")
    return runs[0]


def start_eval(run_dir: Path) -> dict[str, float]:
    """The run's step-0 real-world eval row of metrics.jsonl."""
    rows = [r for r in RunDir.open(run_dir).metrics() if r.get("phase") == "eval" and r.get("step") == 0]
    if not rows:
        raise SystemExit(f"{run_dir}: no step-0 eval in metrics.jsonl")
    return rows[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/transfer"), help="parent folder of the runs")
    p.add_argument("--warm-start", type=Path, default=None, help="an existing warm start (<run>/sft) to measure")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--trajectories", type=int, default=60, help="reference replays of the warm start")
    p.add_argument("--simulator-trajectories", type=int, default=15)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=4, help="sampled eval episodes per held-out task")
    p.add_argument("--temperature", type=float, default=0.5, help="eval sampling temperature")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    warm = args.warm_start
    if warm is None:
        envace("sft", "--config", "configs/warmstart.yaml", "--model", args.model,
               "--set", f"sft.trajectories={args.trajectories}",
               "--set", f"sft.simulator_trajectories={args.simulator_trajectories}",
               "--set", f"sft.epochs={args.epochs}", "--set", f"threads={args.threads}",
               "--set", f"out={out / 'ws'}")
        warm = only_run(out / "ws", "sft-") / "sft"
    t_warm = time.perf_counter() - t0
    evals = ["--config", str(LIBRARY / "config.yaml"), "--model", args.model, "--set", "steps=0",
             "--set", "eval.at_start=true", "--set", "eval.tasks=100", "--set", f"eval.samples={args.samples}",
             "--set", f"eval.temperature={args.temperature}", "--set", "eval.rehearsal_gap=false",
             "--set", f"threads={args.threads}"]
    starts = {"zero-shot": ["--set", "sft.enabled=false"], "warm start": ["--set", f"sft.init_from={warm}"]}
    rows = {}
    for name, extra in starts.items():
        where = out / name.replace(" ", "_")
        envace("train", *evals, *extra, "--set", f"out={where}")
        run = only_run(where, "train-")
        rows[name] = (run, start_eval(run), eval_task_success(RunDir.open(run))[0])
    print(f"\nexamples/python_library held-out tasks, real Library, {args.samples} episodes per task at "
          f"T={args.temperature}; warm start {warm} ({args.trajectories} replays x {args.epochs} epochs, "
          f"{t_warm / 60:.1f} min)")
    print(f"{'start':<12} {'tasks':>5} {'success':>8} {'tool calls':>11} {'parse fail':>11}")
    for name, (_, m, by_task) in rows.items():
        print(f"{name:<12} {len(by_task):>5} {m['eval/success']:>8.3f} {m['eval/tool_calls']:>11.2f} "
              f"{m['eval/parse_failures']:>11.2f}")
    gain, se, n = paired_gain(rows["zero-shot"][2], rows["warm start"][2])
    print(f"warm start - zero-shot success: {gain:+.3f} (paired s.e. {se:.3f}, {n} tasks); "
          f"total {(time.perf_counter() - t0) / 60:.1f} min")
    summary = {name: {"run": str(run), **{k: v for k, v in m.items() if k.startswith("eval/")}}
               for name, (run, m, _) in rows.items()}
    summary["gain"] = {"success": gain, "se": se, "tasks": n, "warm_start": str(warm)}
    (out / "transfer.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
