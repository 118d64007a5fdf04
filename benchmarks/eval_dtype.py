"""The bf16 generation lever on a real-world eval: one checkpoint evaluated on a training config's
held-out tasks with generation in fp32 and in bf16 (``rollout.dtype``, ``envace eval --dtype``),
rounds alternated (fp32, bf16, bf16, fp32, ...) so that load drifting on a shared machine hits
both alike. Prints seconds and success of every round, the median time ratio, and success paired
over tasks (bf16 minus fp32: what the rounding of the weights costs the policy).

    python benchmarks/eval_dtype.py --config configs/smollm2_cpu.yaml --model WARM/sft/step-00000000 \\
        --tasks 16 --samples 2 --rounds 2
"""

from __future__ import annotations

import time

from _common import make_parser, median, start
from eval_checkpoints import per_task
from envace.experiments.config import load_config
from envace.experiments.stats import paired_gain
from envace.experiments.train_job import evaluate_real, real_eval_tasks
from envace.policy.loading import load_model


def main() -> None:
    p = make_parser(__doc__)
    p.add_argument("--config", required=True, help="the training config whose eval tasks and settings to use")
    p.add_argument("--model", required=True, help="a saved model (policy dir, checkpoint or spec)")
    p.add_argument("--tasks", type=int, default=16)
    p.add_argument("--samples", type=int, default=2, help="episodes per task")
    p.add_argument("--rounds", type=int, default=2, help="rounds per dtype, alternated")
    args = start(p, "real-world eval, generation in fp32 vs bf16")
    model, tok = load_model(args.model)
    model.eval()
    seconds: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    scores: dict[str, dict[str, float]] = {}
    order = [d for r in range(args.rounds) for d in (("float32", "bfloat16") if r % 2 == 0 else ("bfloat16", "float32"))]
    print("| round | dtype | seconds | success | generated tokens |")
    print("|---|---|---|---|---|")
    for i, dtype in enumerate(order, 1):
        cfg = load_config(args.config, [f"eval.tasks={args.tasks}", f"eval.samples={args.samples}",
                                        f"rollout.dtype={dtype}"])
        tasks = real_eval_tasks(cfg, [])
        t0 = time.perf_counter()
        metrics, trajs = evaluate_real(model, tok, tasks, cfg)
        seconds[dtype].append(time.perf_counter() - t0)
        scores[dtype] = per_task(trajs)
        gen = sum(len(s.gen_ids) for t in trajs for s in t.samples)
        print(f"| {i} | {dtype} | {seconds[dtype][-1]:.0f} | {metrics['eval/success']:.3f} | {gen} |", flush=True)
    ratio = median(seconds["float32"]) / median(seconds["bfloat16"])
    d, se, n = paired_gain(scores["float32"], scores["bfloat16"])
    print(f"\nbf16 speed-up (median fp32 s / median bf16 s): {ratio:.2f}x")
    print(f"success, bf16 minus fp32, paired over {n} tasks: {d:+.3f} (s.e. {se:.3f})")


if __name__ == "__main__":
    main()
