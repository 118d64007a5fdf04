"""Real-world success of saved checkpoints on a training config's evaluation tasks, with several
sampled episodes per task, and each checkpoint's difference from the first one paired over tasks.

A greedy eval of one episode per task moves in whole tasks: on 150 held-out tasks one task is
0.007, and two checkpoints can differ by three tasks from the luck of which ties break where.
GRPO trains the policy as it samples (temperature 1), so its success at that temperature,
averaged over k episodes per task, is what training moves first; the paired standard error says
whether a difference is more than noise.

    python benchmarks/eval_checkpoints.py --config configs/compare.yaml --tasks 150 --samples 4 \\
        start=RUN/sft/step-00000000 rehearsal=RUN2/checkpoints/step-00000040 ...

The tasks are the config's eval tasks (``eval.split``; with ``--set rl_pool=16 --set
eval.split=pool``, the GRPO pool a fit check trains on). ``--temperature 0 --samples 1`` gives
the greedy eval of a training run. Every checkpoint runs with the same seed, so the episodes of
two checkpoints share their random stream.
"""

from __future__ import annotations

import time
from collections import defaultdict

from _common import make_parser, start
from envace.experiments.config import load_config
from envace.experiments.stats import paired_gain
from envace.experiments.tasksets import real_eval_tasks
from envace.experiments.train_job import evaluate_real, grpo_pool
from envace.policy.loading import load_model


def per_task(trajs: list) -> dict[str, float]:
    """Mean success of each task's episodes."""
    by_task: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        by_task[t.task_id].append(float(t.solved))
    return {k: sum(v) / len(v) for k, v in by_task.items()}


def main() -> None:
    p = make_parser(__doc__)
    p.add_argument("--config", required=True, help="the training config whose eval tasks to use")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--tasks", type=int, default=150, help="eval.tasks")
    p.add_argument("--samples", type=int, default=4, help="eval.samples: episodes per task")
    p.add_argument("--temperature", type=float, default=1.0, help="eval.temperature")
    p.add_argument("checkpoints", nargs="+", metavar="LABEL=DIR", help="saved models (a policy dir or a "
                   "checkpoint's policy/ subdirectory); the first is the one the others are compared with")
    args = start(p, "real-world success of checkpoints, sampled episodes per task")
    cfg = load_config(args.config, [*args.overrides, f"eval.tasks={args.tasks}", f"eval.samples={args.samples}",
                                    f"eval.temperature={args.temperature}"])
    # the GRPO pool only matters for eval.split: pool; building it generates every train task
    tasks = real_eval_tasks(cfg, grpo_pool(cfg) if cfg.eval.split == "pool" else [])
    print(f"{len(tasks)} {cfg.eval.split} tasks x {cfg.eval.samples} episodes at T={cfg.eval.temperature}")
    print("| checkpoint | success | tasks solved (any episode) | reward | minus the first (paired s.e.) | seconds |")
    print("|---|---|---|---|---|---|")
    first: dict[str, float] | None = None
    for item in args.checkpoints:
        label, sep, path = item.partition("=")
        if not sep:
            p.error(f"checkpoint {item!r}: expected LABEL=DIR")
        model, tok = load_model(path)
        t0 = time.perf_counter()
        metrics, trajs = evaluate_real(model.eval(), tok, tasks, cfg)
        seconds = time.perf_counter() - t0
        scores = per_task(trajs)
        if first is None:
            first, diff = scores, "-"
        else:
            d, se, _ = paired_gain(first, scores)
            diff = f"{d:+.3f} ({se:.3f})"
        print(f"| {label} | {metrics['eval/success']:.3f} | {metrics['eval/tasks_solved']:.3f} | "
              f"{metrics['eval/reward']:.3f} | {diff} | {seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
