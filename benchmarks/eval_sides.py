"""A generation lever on a real-world eval: one checkpoint evaluated on a training config's
held-out tasks under two sets of config overrides (e.g. ``rollout.dtype=float32`` against
``rollout.dtype=bfloat16``, or ``rollout.kv_reuse_tokens=0`` against ``=65536``), rounds
alternated (A, B, B, A, ...) so that load drifting on a shared machine hits both alike. Prints
seconds and success of every round, the median time ratio, and success paired over tasks
(B minus A: what the lever costs or gains the policy).

    python benchmarks/eval_sides.py --config configs/smollm2_cpu.yaml --model WARM/sft/step-00000000 \\
        --a rollout.kv_reuse_tokens=0 --b rollout.kv_reuse_tokens=65536 --tasks 16 --samples 2 --rounds 2
"""

from __future__ import annotations

import time

from _common import make_parser, median, start
from eval_checkpoints import per_task
from envace.experiments.config import load_config
from envace.experiments.stats import paired_gain
from envace.experiments.tasksets import real_eval_tasks
from envace.experiments.train_job import evaluate_real
from envace.policy.loading import load_model


def compare(args, a: list[str], b: list[str]) -> None:
    model, tok = load_model(args.model)
    model.eval()
    sides = {"A": a, "B": b}
    seconds: dict[str, list[float]] = {"A": [], "B": []}
    scores: dict[str, dict[str, float]] = {}
    order = [s for r in range(args.rounds) for s in (("A", "B") if r % 2 == 0 else ("B", "A"))]
    print(f"A: {' '.join(a) or '(config)'}\nB: {' '.join(b) or '(config)'}\n")
    print("| round | side | seconds | success | generated tokens |")
    print("|---|---|---|---|---|")
    for i, side in enumerate(order, 1):
        cfg = load_config(args.config, [f"eval.tasks={args.tasks}", f"eval.samples={args.samples}", *sides[side]])
        tasks = real_eval_tasks(cfg, [])
        t0 = time.perf_counter()
        metrics, trajs = evaluate_real(model, tok, tasks, cfg)
        seconds[side].append(time.perf_counter() - t0)
        scores[side] = per_task(trajs)
        gen = sum(len(s.gen_ids) for t in trajs for s in t.samples)
        print(f"| {i} | {side} | {seconds[side][-1]:.0f} | {metrics['eval/success']:.3f} | {gen} |", flush=True)
    ratio = median(seconds["A"]) / median(seconds["B"])
    d, se, n = paired_gain(scores["A"], scores["B"])
    print(f"\nB speed-up (median A s / median B s): {ratio:.2f}x")
    print(f"success, B minus A, paired over {n} tasks: {d:+.3f} (s.e. {se:.3f})")


def add_arguments(p) -> None:
    p.add_argument("--config", required=True, help="the training config whose eval tasks and settings to use")
    p.add_argument("--model", required=True, help="a saved model (policy dir, checkpoint or spec)")
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--samples", type=int, default=2, help="episodes per task")
    p.add_argument("--rounds", type=int, default=2, help="rounds per side, alternated")


def main() -> None:
    p = make_parser(__doc__)
    add_arguments(p)
    p.add_argument("--a", nargs="*", default=[], metavar="KEY=VALUE", help="side A's config overrides")
    p.add_argument("--b", nargs="*", default=[], metavar="KEY=VALUE", help="side B's config overrides")
    args = start(p, "real-world eval, side A vs side B")
    compare(args, args.a, args.b)


if __name__ == "__main__":
    main()
