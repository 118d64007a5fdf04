"""``envace export model | trajectories | tasks``: a checkpoint as a plain transformers model
directory; trajectories and tasks as Hugging Face (Parquet) datasets."""

from __future__ import annotations

import argparse

# Every command module loads for `envace --help`: the export and dataset modules are imported by the
# handlers that use them.


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a trained model as a plain transformers directory")
    what = p.add_subparsers(dest="what", required=True)
    m = what.add_parser("model", help="RUN or RUN/checkpoints/step-N -> a transformers model dir (LoRA merged, "
                                      "tokenizer, a chat template that renders tools= as training did, model card)")
    m.add_argument("source", help="a training run directory (its latest checkpoint), a checkpoint, or a model dir")
    m.add_argument("--to", required=True, help="the output directory")
    m.add_argument("--role", default="caller", help="caller (default) or simulator: which model of a two-model "
                                                    "checkpoint")
    m.add_argument("--no-merge", dest="merge", action="store_false",
                   help="keep a LoRA checkpoint as an adapter, with its base model in DIR/base, instead of "
                        "merging it (peft's AutoPeftModelForCausalLM loads DIR)")
    m.add_argument("--force", action="store_true", help="replace a non-empty --to directory")
    m.set_defaults(func=_export_model)

    t = what.add_parser("trajectories", help="a run's trajectories as a conversational tool-calling dataset "
                                             "(OpenAI/TRL messages and tools; datasets.load_dataset(DIR))")
    t.add_argument("run", help="a train, eval or rollout run directory")
    t.add_argument("--to", required=True)
    t.add_argument("--force", action="store_true")
    t.set_defaults(func=_export_trajectories)

    k = what.add_parser("tasks", help="tasks as a Parquet dataset with train and test splits (--tasks-file "
                                      "takes it back)")
    k.add_argument("task_file", nargs="?", default=None, help="a JSONL task file (or --world)")
    k.add_argument("--world", default=None, help="embedded world(s): shop, calendar, bank, a comma list or all")
    k.add_argument("--split", default="all", help="train | test | all (default all)")
    k.add_argument("--tasks-per-world", type=int, default=300)
    k.add_argument("--tool-distractors", type=int, default=None)
    k.add_argument("--to", required=True)
    k.add_argument("--force", action="store_true")
    k.set_defaults(func=_export_tasks)


def _export_model(args: argparse.Namespace) -> int:
    from envace.experiments.export import export_model

    export_model(args.source, args.to, role=args.role, merge=args.merge, force=args.force)
    return 0


def _export_trajectories(args: argparse.Namespace) -> int:
    from envace.experiments.datasets_io import export_trajectories

    print(f"exported to {export_trajectories(args.run, args.to, force=args.force)}")
    return 0


def _export_tasks(args: argparse.Namespace) -> int:
    from envace.experiments.datasets_io import export_tasks
    from envace.experiments.tasks import select_tasks

    if (args.task_file is None) == (args.world is None):
        raise ValueError("export tasks: give a task file or --world, not both")
    tasks = select_tasks(args.world, args.split, None, args.task_file, tool_distractors=args.tool_distractors,
                         tasks_per_world=args.tasks_per_world)
    print(f"exported {len(tasks)} tasks to "
          f"{export_tasks(tasks, args.to, args.task_file or args.world, force=args.force)}")
    return 0
