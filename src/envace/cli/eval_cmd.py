"""``envace eval``: test-time private rehearsal, the budget sweep, and world-model fidelity."""

from __future__ import annotations

import argparse

from envace.cli.bench_cmd import add_eval_arguments, job_from_args
from envace.cli.task_args import add_task_source_args


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval", help="evaluate in the real world, with test-time private rehearsal and/or world-model fidelity",
        description="Examples: envace eval --model smollm2 --rehearse parallel --budget 4 | "
                    "envace eval --model runs/ID/checkpoints/step-00000020 --sweep | envace eval --model X --fidelity | "
                    "envace eval --bench bfcl --category multi_turn_base --limit 20 (a paper benchmark; envace bench list)")
    p.add_argument("--model", default="smollm2",
                   help="smollm2 | tiny | a HF model or peft adapter dir | a training checkpoint dir "
                        "(its policy/ or caller/ sub-directory is found automatically)")
    add_task_source_args(
        p, "embedded world(s): shop (default), calendar, bank, a comma list or 'all'; with --task-file: "
           "the real environment of tasks that name none (package.module:Name, path/to/tools.py:Class, "
           "mcp:COMMAND, http(s)://.../mcp, a registered name)")
    p.add_argument("--split", default="test", help="train | test")
    p.add_argument("--tasks", type=int, default=10, help="tasks per world (default 10)")
    p.add_argument("--rehearse", default="none", help="none | parallel | sequential (default none)")
    p.add_argument("--budget", type=int, default=None,
                   help="imagined episodes per task before the committed run (default 4 with --rehearse)")
    p.add_argument("--sweep", action="store_true", help="every budget of --budgets for every mode of --modes")
    p.add_argument("--budgets", default=None, help="sweep budgets, 0 = no rehearsal (default 0,1,2,4,8)")
    p.add_argument("--modes", default="parallel,sequential", help="sweep modes (default parallel,sequential)")
    p.add_argument("--memory", default=None,
                   help="model (default; the policy summarises its rehearsals, rule-based fallback on garbage) | rule "
                   "(failed and working calls, the answer reached; the default with --bench) | plan (only the calls "
                   "of the best-looking attempt)")
    p.add_argument("--fidelity", action="store_true",
                   help="measure how well the model's rehearsed tool responses match the real world")
    p.add_argument("--fidelity-source", default="oracle", help="real trajectories to rehearse: oracle | policy | both")
    p.add_argument("--fidelity-tasks", type=int, default=None, help="tasks per world for --fidelity (default --tasks)")
    p.add_argument("--no-error-probes", action="store_true",
                   help="fidelity without the probes (real calls with an id that does not exist)")
    p.add_argument("--difficulties", default=None,
                   help="comma list of task difficulties (default: the training run's, else all)")
    p.add_argument("--tool-distractors", type=int, default=None,
                   help="needed tools + N others in each task (default: the training run's, else every tool)")
    p.add_argument("--tasks-per-world", type=int, default=None,
                   help="generated tasks per embedded world (default: the training run's, else 300)")
    p.add_argument("--max-turns", type=int, default=None, help="(default: the training run's, else 4)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="per caller turn (default: the run's, else 96)")
    p.add_argument("--sim-max-new-tokens", type=int, default=None,
                   help="per rehearsed tool response in rehearsal (default: the run's, else 96)")
    p.add_argument("--fidelity-max-new-tokens", type=int, default=256, help="per rehearsed response in --fidelity")
    p.add_argument("--simulator-context", default=None, choices=["call", "conversation"],
                   help="what the rehearse role sees (default: the run's prompt.simulator_context, else call): "
                   "conversation adds the user's request and the whole tool list")
    p.add_argument("--no-rehearsal-gap", action="store_true",
                   help="skip the rehearsal gap (by default the plain real run is repeated with the model rehearsing "
                   "every tool response, and its fidelity on the real calls and recorded examples is measured)")
    p.add_argument("--examples-as-recorded", default=None, choices=["on", "off"],
                   help="answer a rehearsed call that matches a recorded example with the recorded result (default: "
                   "the training run's rollout.examples_as_recorded, else on)")
    p.add_argument("--summary-max-new-tokens", type=int, default=96, help="per model-written rehearsal memory")
    p.add_argument("--rehearsal-temperature", type=float, default=0.7)
    p.add_argument("--temperature", type=float, default=0.0, help="committed run (0 = greedy)")
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: one per idle core)")
    p.add_argument("--device", default="cpu", help="torch device of the model(s): cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="generate in this dtype (bfloat16: faster on CPUs with AVX512-BF16; compare checkpoints "
                        "in one dtype)")
    p.add_argument("--backend", default="transformers", choices=["transformers", "llamacpp"],
                   help="generation engine: transformers (the reference) or llama.cpp (pip install "
                        "'envace[llamacpp]'; the weights written as GGUF in --llamacpp-quant)")
    p.add_argument("--llamacpp-quant", default="Q8_0", choices=["F32", "BF16", "Q8_0", "Q4_1"])
    p.add_argument("--kv-reuse-tokens", type=int, default=0,
                   help="keep up to this many tokens of key/value cache between turns, so a later turn "
                        "prefills only its new tokens (0: off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs", help="parent folder of the run directory")
    p.add_argument("--name", default=None, help="run directory name (default eval-<time>-<id>)")
    add_eval_arguments(p, bench_required=False, common=False)
    p.set_defaults(func=_run)


def _run_bench(args: argparse.Namespace) -> int:
    from envace.experiments.bench_job import run_bench_job

    wrong = [flag for flag, on in (("--sweep", args.sweep),
                                   ("--fidelity", args.fidelity), ("--task-file", args.task_file is not None))
             if on]
    if wrong:
        raise ValueError(f"{', '.join(wrong)} cannot be combined with --bench (benchmark evaluation runs one "
                         "committed episode per entry, after --rehearse parallel|sequential --budget N if asked; "
                         "use --source rehearsal for rehearsed tool responses)")
    if args.max_new_tokens is None:  # the plain eval's default caller cap (there is no training run here)
        args.max_new_tokens = 96
    run_bench_job(job_from_args(args))
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.bench:
        return _run_bench(args)
    # Imported here: `envace --help` must not load torch and transformers.
    from envace.experiments.eval_job import DEFAULT_BUDGETS, EvalJob, parse_int_list, run_eval_job

    job = EvalJob(
        model=args.model, world=args.world if not args.task_file else None,
        real_world=args.world if args.task_file else None, task_file=args.task_file,
        trust_task_worlds=args.trust_task_worlds,
        judge_model=args.judge_model, sim_model=args.sim_model, split=args.split, tasks=args.tasks,
        rehearse=args.rehearse, budget=args.budget, sweep=args.sweep,
        budgets=parse_int_list(args.budgets, "--budgets") if args.budgets else list(DEFAULT_BUDGETS),
        modes=[m.strip() for m in args.modes.split(",") if m.strip()], memory=args.memory or "model",
        fidelity=args.fidelity, fidelity_source=args.fidelity_source, fidelity_tasks=args.fidelity_tasks,
        error_probes=not args.no_error_probes, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens,
        sim_max_new_tokens=args.sim_max_new_tokens,
        difficulties=parse_int_list(args.difficulties, "--difficulties") if args.difficulties else None,
        tool_distractors=args.tool_distractors, tasks_per_world=args.tasks_per_world, fidelity_max_new_tokens=args.fidelity_max_new_tokens,
        summary_max_new_tokens=args.summary_max_new_tokens, device=args.device, dtype=args.dtype,
        kv_reuse_tokens=args.kv_reuse_tokens,
        llamacpp_quant=args.llamacpp_quant if args.backend == "llamacpp" else None,
        rehearsal_temperature=args.rehearsal_temperature, temperature=args.temperature, max_batch=args.max_batch,
        threads=args.threads, seed=args.seed, out=args.out, name=args.name,
        simulator_context=args.simulator_context, rehearsal_gap=not args.no_rehearsal_gap,
        examples_as_recorded=None if args.examples_as_recorded is None else args.examples_as_recorded == "on")
    run_eval_job(job)
    return 0
