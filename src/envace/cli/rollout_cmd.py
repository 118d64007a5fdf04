"""``envace rollout``: run a policy on tasks against one response source and write a run dir."""

from __future__ import annotations

import argparse

from envace.cli.task_args import add_task_source_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rollout", help="run episodes against a response source (real | rehearsal | simulator)")
    add_task_source_args(
        p, "embedded world(s) to generate tasks from: shop (default), calendar, bank, comma list or "
           "'all'; with --task-file: the real environment of tasks that name none (a registered "
           "name, package.module:Name, path/to/tools.py:Class, mcp:COMMAND, http(s)://.../mcp)")
    p.add_argument("--split", default=None, choices=["train", "test", "all"],
                   help="default: test for embedded worlds, all for a task file")
    p.add_argument("--tasks", type=int, default=4, help="number of tasks")
    p.add_argument("--source", default="real", choices=["real", "rehearsal", "simulator"])
    p.add_argument("--model", default="smollm2", help="smollm2 | tiny | a local HF model/adapter dir")
    p.add_argument("--sim-model", default=None, help="model for --source simulator (default: same as --model)")
    p.add_argument("--group-size", type=int, default=1, help="trajectories per task (G)")
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs", help="parent folder of the run directory")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: one per idle core)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from envace.experiments.rollout_job import RolloutJob, run_rollout_job  # heavy: only when run

    job = RolloutJob(world=args.world, task_file=args.task_file, split=args.split, tasks=args.tasks,
                     source=args.source, model=args.model, sim_model=args.sim_model, group_size=args.group_size,
                     max_turns=args.max_turns, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                     max_batch=args.max_batch, seed=args.seed, out=args.out, threads=args.threads,
                     trust_task_worlds=args.trust_task_worlds)
    run_rollout_job(job)
    return 0
