"""``envace export model``: a checkpoint as a plain transformers model directory."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a trained model as a plain transformers directory")
    what = p.add_subparsers(dest="what", required=True)
    m = what.add_parser("model", help="RUN or RUN/checkpoints/step-N -> a transformers model dir (LoRA merged, "
                                      "tokenizer, chat template, model card)")
    m.add_argument("source", help="a training run directory (its latest checkpoint), a checkpoint, or a model dir")
    m.add_argument("--to", required=True, help="the output directory")
    m.add_argument("--role", default="caller", help="caller (default) or simulator: which model of a two-model "
                                                    "checkpoint")
    m.add_argument("--no-merge", dest="merge", action="store_false",
                   help="keep a LoRA checkpoint as an adapter instead of merging it")
    m.add_argument("--force", action="store_true", help="replace a non-empty --to directory")
    m.set_defaults(func=_export_model)


def _export_model(args: argparse.Namespace) -> int:
    from envace.experiments.export import export_model

    export_model(args.source, args.to, role=args.role, merge=args.merge, force=args.force)
    return 0
