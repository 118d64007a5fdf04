"""``envace train`` and ``envace sft``: role-wise GRPO (after an SFT warm start), or the warm start alone."""

from __future__ import annotations

import argparse
import os
import shlex

from envace.cli.config_cmd import check_override_keys

# The config, run directory and job modules are imported by the handlers that use them: every command
# module loads for `envace --help`, and the config alone pulls in torch (its update settings).


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="SFT warm start, then role-wise GRPO; real-world eval every N steps")
    _common(p)
    p.add_argument("--source", choices=["rehearsal", "real", "simulator"], default=None,
                   help="who answers tool calls during training (default: the config's, rehearsal)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    p.set_defaults(func=_train)
    s = sub.add_parser("sft", help="only the SFT warm start on scripted-oracle trajectories; saves <run>/sft")
    _common(s)
    s.set_defaults(func=_sft)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="YAML config (see configs/)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set steps=5 --set grpo.lr=1e-5")
    p.add_argument("--tasks-file", "--task-file", dest="tasks_file", default=None,
                   help="your JSONL task file (docs/tasks.md) instead of the embedded worlds' generated tasks")
    p.add_argument("--world", default=None,
                   help="the real environment of your tasks: package.module:Name, path/to/tools.py:Class, "
                        "mcp:COMMAND, http(s)://.../mcp, or a registered name. Without one, schema-only tasks "
                        "train by rehearsal and are evaluated by rehearsal")
    p.add_argument("--model", default=None, help="smollm2 | tiny | a local HF model dir (config: model)")
    p.add_argument("--report-to", default=None, metavar="T1,T2",
                   help="experiment trackers: tensorboard, wandb (offline unless wandb_mode: online), trackio")
    p.add_argument("--judge-model", default=None, help="local model judging `judge` checklist items")
    p.add_argument("--judge-url", default=None, help="OpenAI-compatible endpoint (…/v1) judging `judge` items")
    p.add_argument("--trust-task-worlds", action="store_true", default=None,
                   help="let the task file's own env.world entries run code (mcp: commands, .py files, import "
                        "paths); refused by default (docs/tasks.md)")


def _values(args: argparse.Namespace) -> dict:
    """Command-line settings, set as given (not YAML-parsed: a spec like mcp:python s.py stays whole)."""
    values: dict = {}
    if args.tasks_file:
        values["task_file"] = args.tasks_file
    if getattr(args, "trust_task_worlds", None):
        values["trust_task_worlds"] = True
    if args.world:
        values["world"] = args.world
    if args.model:
        values["model"] = args.model
    if getattr(args, "report_to", None):
        values["report_to"] = [t.strip() for t in args.report_to.split(",") if t.strip()]
    if args.judge_model or args.judge_url:
        values["judge"] = {k: v for k, v in (("model", args.judge_model), ("url", args.judge_url)) if v}
    return values


def _config(args: argparse.Namespace):
    from envace.experiments.config import apply_overrides, load_config, parse_config
    from envace.experiments.rundir import RunDir

    check_override_keys(args.set)  # a typo is the flag's fault, not the YAML's: say so, and the nearest field
    overrides = list(args.set)
    if getattr(args, "source", None):
        overrides.append(f"source={args.source}")
    if getattr(args, "resume", None):
        # The run's own resolved config is what continues; only explicit overrides apply on top.
        base = RunDir.open(args.resume).config()
        return parse_config({**apply_overrides(base, overrides), **_values(args)}, f"{args.resume}/config.yaml")
    return load_config(args.config, overrides, values=_values(args))


def _train(args: argparse.Namespace) -> int:
    from envace.experiments.train_job import train

    made: list = []
    try:
        run = train(_config(args), resume=args.resume, on_run=made.append)
    except KeyboardInterrupt:
        where = made[-1] if made else args.resume
        if where is None:  # interrupted before the run directory existed: nothing to resume
            raise
        # Said last, after the progress lines, so it does not scroll away.
        raise KeyboardInterrupt(f"run directory: {where}\nresume with: envace train --resume {shlex.quote(str(where))}") from None
    if os.environ.get("RANK", "0") == "0":  # under accelerate launch, rank 0 speaks for the run
        print(f"done: {run.path} (summary.md, learning_curve.png, metrics.jsonl, checkpoints/)\n"
              f"look at the results: cat {run.path / 'summary.md'}")
    return 0


def _sft(args: argparse.Namespace) -> int:
    from envace.experiments.rundir import RunDir
    from envace.experiments.train_job import SFT_DIR, run_policy, warm_start

    cfg = _config(args)
    if cfg.task_file is not None:
        from envace.experiments.tasksets import train_tasks

        train_tasks(cfg)  # a task file that fails its check is refused before a run directory exists
    run = RunDir.create(cfg.out, "sft", cfg.model_dump(mode="json"), seed=cfg.seed)
    policy, tok = run_policy(cfg)
    warm_start(policy, tok, cfg.model_copy(update={"sft": cfg.sft.model_copy(update={"enabled": True})}), run, print)
    print(f"done: {run.path / SFT_DIR}")
    return 0
