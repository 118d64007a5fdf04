"""One GRPO step three ways, from the same warm start, on the same tasks and batch (issue #43, item 4):
envace with llama.cpp rollouts, envace with transformers rollouts, and TRL's ``GRPOTrainer``
(generation with ``model.generate``, its loss and AdamW). Seconds per step, generated tokens per
second and peak RSS, each side a fresh process run one after the other.

Usage: python benchmarks/trl_side_by_side.py --start RUN/sft [--steps 3] [--tasks 8] [--group-size 4]
           [--sides llamacpp transformers trl] [--threads 1] [--out DIR]

The setting is TRL's: one caller turn per episode (``rollout.max_turns: 1``; TRL's trainer rolls
out single completions), ``configs/smollm2_cpu.yaml``'s model, LoRA r=16, lr, temperature 0.7,
bf16 autocast and caller cap (96 tokens), activation checkpointing on every side. The tasks are
the first ``--tasks`` train tasks GRPO would draw at each step (``step_tasks``), the prompt is the
caller prompt envace renders, and TRL's reward is whether the completion calls the reference's
first tool (the sides' rewards differ: the figures here are time and memory, not learning).
The step's time excludes the process start and model load; the first step (warm-up) is shown
apart from the median of the rest.
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _common import cpu_model, loads, median, print_header  # noqa: E402

CONFIG = ROOT / "configs" / "smollm2_cpu.yaml"


def _peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def envace_side(args: argparse.Namespace, backend: str, out: Path) -> dict:
    """`envace train` for ``--steps`` steps; its metrics.jsonl rows give the figures."""
    cmd = [sys.executable, "-m", "envace.cli.main", "train", "--config", str(CONFIG),
           "--set", f"sft.init_from={args.start}", "--set", f"steps={args.steps}",
           "--set", f"tasks_per_step={args.tasks}", "--set", f"group_size={args.group_size}",
           "--set", "rollout.max_turns=1", "--set", "eval.at_start=false", "--set", "eval.tasks=1",
           "--set", "eval.samples=1", "--set", "eval.rehearsal_gap=false", "--set", f"threads={args.threads}",
           "--set", "grpo.gradient_checkpointing=true", "--set", f"rollout.backend={backend}",
           "--set", f"out={out}"]
    if backend == "llamacpp":
        cmd += ["--set", "rollout.llamacpp_ctx=32768"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"envace ({backend}) failed:\n{done.stderr[-3000:]}")
    run = sorted(out.glob("train-*"))[-1]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r.get("phase") == "train" and "step_s" in r]
    made: dict[int, int] = {}  # generated tokens per step, the trajectories file read once
    for line in (run / "trajectories.jsonl").read_text().splitlines():
        if line.strip():
            t = json.loads(line)
            made[t["step"]] = made.get(t["step"], 0) + sum(len(s["gen_ids"]) for s in t["samples"])
    tokens = [made.get(r["step"], 0) for r in steps]
    return {"side": f"envace, {backend} rollouts", "step_s": [r["step_s"] for r in steps],
            "rollout_s": [r["rollout_s"] for r in steps], "update_s": [r["update_s"] for r in steps],
            "gen_tokens": tokens, "peak_gib": max(r["mem/peak_rss_gib"] for r in steps),
            "wall_s": time.perf_counter() - t0}


def trl_side(args: argparse.Namespace) -> dict:
    """TRL's GRPOTrainer in this process (run by the parent as ``--worker trl``)."""
    import datasets
    import torch
    from trl import GRPOConfig, GRPOTrainer
    from transformers import TrainerCallback

    from envace.core.prompts import render_caller_prompt
    from envace.core.toolcall import CALL_CLOSE, parse_tool_calls
    from envace.experiments.config import load_config
    from envace.experiments.models import load_policy
    from envace.experiments.tasksets import step_tasks, task_set
    from envace.experiments.train_job import rl_tasks

    torch.set_num_threads(args.threads)
    cfg = load_config(CONFIG, [f"tasks_per_step={args.tasks}", f"group_size={args.group_size}"])
    pool = task_set(cfg, rl_tasks).train_pool
    tasks = [t for step in range(1, args.steps + 1) for t in step_tasks(pool, cfg, step)]
    model, tok = load_policy(str(args.start), cfg.lora)
    rows = [{"prompt": tok.decode(render_caller_prompt(tok, t, [], cfg.prompt)),
             "first_tool": t.reference.calls[0].name if t.reference and t.reference.calls else ""} for t in tasks]

    def first_tool_reward(completions, first_tool, **_):
        out = []
        for text, want in zip(completions, first_tool):
            calls = parse_tool_calls(text if isinstance(text, str) else str(text)).calls
            out.append(1.0 if calls and calls[0].name == want else 0.0)
        return out

    batch = args.tasks * args.group_size
    conf = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="trl-side-"), use_cpu=True, bf16=cfg.mixed_precision == "bf16",
                      per_device_train_batch_size=batch, gradient_accumulation_steps=1, num_generations=args.group_size,
                      max_completion_length=cfg.rollout.caller_max_new_tokens, temperature=cfg.rollout.temperature,
                      learning_rate=cfg.grpo.lr, max_steps=args.steps, shuffle_dataset=False, logging_steps=1,
                      gradient_checkpointing=True, save_strategy="no", report_to=[], beta=0.0, seed=cfg.seed,
                      # envace's caller turn ends at its first </tool_call> (one call a turn): the same here
                      generation_kwargs={"stop_strings": [CALL_CLOSE]})
    times: list[float] = []
    tokens: list[float] = []
    clipped: list[float] = []  # completions cut at the cap: TRL must stop where envace does

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)

        def on_log(self, _args, _state, _control, logs=None, **k):
            if logs and "completions/mean_length" in logs:
                tokens.append(logs["completions/mean_length"] * batch)
                clipped.append(logs.get("completions/clipped_ratio", float("nan")))

    # TRL does not hand generate() the tokenizer, which stop strings need
    model.generate = functools.partial(model.generate, tokenizer=tok)
    trainer = GRPOTrainer(model=model, reward_funcs=first_tool_reward, args=conf, processing_class=tok,
                          train_dataset=datasets.Dataset.from_list(rows), callbacks=[Timer()])
    trainer.train()
    return {"side": "TRL GRPOTrainer", "step_s": times, "gen_tokens": tokens, "clipped": clipped,
            "eos": [tok.eos_token, model.generation_config.eos_token_id], "peak_gib": _peak_gib()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--start", required=True, help="a warm start's sft dir (e.g. RUN/sft/step-00000000)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sides", nargs="+", default=["llamacpp", "transformers", "trl"],
                   choices=["llamacpp", "transformers", "trl"])
    p.add_argument("--out", default=None, help="where the envace runs go (default: a temporary dir)")
    p.add_argument("--worker", choices=["trl"], help=argparse.SUPPRESS)
    args = p.parse_args()
    start = Path(args.start)
    if start.is_dir() and (start / "latest").exists():
        start = start / (start / "latest").read_text().strip()
    args.start = start
    if args.worker == "trl":
        print("RESULT " + json.dumps(trl_side(args)))
        return
    print_header("one GRPO step: envace (llama.cpp / transformers rollouts) vs TRL GRPOTrainer", args)
    out = Path(args.out or tempfile.mkdtemp(prefix="side-by-side-"))
    results = []
    for side in args.sides:
        print(f"running {side} ... (load {loads()})", flush=True)
        if side == "trl":
            done = subprocess.run([sys.executable, __file__, "--worker", "trl", "--start", str(args.start),
                                   "--steps", str(args.steps), "--tasks", str(args.tasks), "--group-size",
                                   str(args.group_size), "--threads", str(args.threads)], capture_output=True, text=True)
            line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                raise SystemExit(f"TRL side failed:\n{done.stderr[-3000:]}")
            results.append(json.loads(line[7:]))
        else:
            results.append(envace_side(args, side, out / side))
        print(json.dumps(results[-1]), flush=True)
    print(f"\n{cpu_model()}, {args.threads} thread(s) each, {args.tasks} tasks x G={args.group_size}, one turn, "
          f"load now {loads()}")
    print(f"{'side':<32} {'step 1 s':>9} {'later steps s (median)':>23} {'gen tok / step s':>16} {'peak RSS GiB':>13}")
    for r in results:
        later = r["step_s"][1:] or r["step_s"]
        tok_s = sum(r["gen_tokens"]) / sum(r["step_s"]) if r["gen_tokens"] else float("nan")
        print(f"{r['side']:<32} {r['step_s'][0]:>9.1f} {median(later):>23.1f} {tok_s:>16.1f} {r['peak_gib']:>13.2f}")


if __name__ == "__main__":
    main()
