"""The ``envace`` command: thin argument parsing over the experiments layer."""

from __future__ import annotations

import argparse
import os
import sys

# No model hub is used, ever: without this, peft and transformers try the network on save/load.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from envace import __version__
from envace.cli import bench_cmd, config_cmd, eval_cmd, export_cmd, report_cmd, rollout_cmd, serve_cmd, tasks_cmd, train_cmd

COMMANDS = [rollout_cmd, train_cmd, eval_cmd, report_cmd, serve_cmd, bench_cmd, tasks_cmd, export_cmd, config_cmd]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="envace", description="World-rehearsal agentic RL for tool-using LLMs")
    parser.add_argument("--version", action="version", version=f"envace {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for mod in COMMANDS:
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError,
            PermissionError) as e:
        # Bad input: one clear line, no traceback.
        print(f"envace {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        hint = f"\n{e}" if str(e) else ""  # e.g. train's run directory and resume command
        print(f"envace {args.command}: interrupted{hint}", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
