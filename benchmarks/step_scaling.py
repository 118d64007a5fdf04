"""Step time vs group size and vs turns per episode, and peak memory (issue #6, item 3).

Usage: python benchmarks/step_scaling.py [--model llama:128x2] [--tasks 4] [--groups 4 8 16]
           [--turns 1 2 3] [--base-group 4] [--base-turns 3] [--threads 1]

One training step as ``envace train`` runs it with configs/demo.yaml's settings (4 tasks per
step, caller 64 / simulator 96 new tokens, T=1, ``micro_batch_tokens`` 8192, rehearsal source,
share mode): rollout (``run_episodes``), role-wise advantages, one ``GRPOUpdater.step``. The
caller is forced to call tools (see rollout_throughput.py, ``--caller forced``) so every
episode runs all its turns, and the trajectory rewards are replaced by seeded random values so
every group has signal and the update does real work (the demo's untrained model earns 0).
Swept: G in ``--groups`` at ``--base-turns`` turns, then turns in ``--turns`` at
``--base-group``. Printed per point: rollout s, update s, samples, generated and trained
tokens, RSS after the step; at the end, the process's peak RSS.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import current_rss_mib, load1, make_parser, peak_rss_mib, start  # noqa: E402
from rollout_throughput import ForcedCallActor  # noqa: E402

from envace.core.prompts import PromptStyle  # noqa: E402
from envace.experiments.tasks import select_tasks  # noqa: E402
from envace.policy.loading import load_model  # noqa: E402
from envace.policy.transformers_backend import TransformersBackend  # noqa: E402
from envace.rollout.actors import PolicyActor  # noqa: E402
from envace.rollout.engine import RolloutConfig, run_episodes  # noqa: E402
from envace.rollout.rehearse import ModelSource  # noqa: E402
from envace.train.advantages import compute_advantages  # noqa: E402
from envace.train.batching import sequence_length  # noqa: E402
from envace.train.step import GRPOUpdater, UpdaterConfig  # noqa: E402


def one_step(backend, updater, tasks, style, group: int, turns: int, args, seed: int) -> dict:
    actor = ForcedCallActor(PolicyActor(backend, style=style, max_new_tokens=args.caller_tokens,
                                        max_prompt_tokens=1024, temperature=1.0, seed=seed))
    source = ModelSource(backend, style=style, max_new_tokens=args.sim_tokens, temperature=1.0, seed=seed + 1)
    t0 = time.perf_counter()
    trajs, stats = run_episodes(tasks, actor, source, RolloutConfig(group_size=group, max_turns=turns))
    t_roll = time.perf_counter() - t0
    rng = random.Random(seed)
    for t in trajs:
        t.reward = rng.random()
    scored = compute_advantages(trajs)
    t1 = time.perf_counter()
    ustats = updater.step(scored)
    t_upd = time.perf_counter() - t1
    return {"rollout_s": t_roll, "update_s": t_upd, "samples": len(scored),
            "gen_tokens": stats.caller_tokens + stats.simulator_tokens,
            "train_tokens": sum(sequence_length(s) for s in scored),
            "micro_batches": int(ustats.get("micro_batches", 0)), "padding": ustats.get("padding_frac", 0.0),
            "rss": current_rss_mib()}


def main() -> None:
    p = make_parser(__doc__, model="llama:128x2", world="shop", tasks=4)
    p.add_argument("--groups", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--turns", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--base-group", type=int, default=4)
    p.add_argument("--base-turns", type=int, default=3)
    p.add_argument("--caller-tokens", type=int, default=64)
    p.add_argument("--sim-tokens", type=int, default=96)
    p.add_argument("--micro-batch-tokens", type=int, default=8192)
    p.add_argument("--max-batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    args = start(p, "step time vs group size and turns per episode")
    t0 = time.perf_counter()
    model, tok = load_model(args.model)
    rss_loaded = current_rss_mib()
    print(f"load        {args.model}: {time.perf_counter() - t0:.1f} s, "
          f"{sum(q.numel() for q in model.parameters()) / 1e6:.1f} M parameters, RSS {rss_loaded:.0f} MiB")
    backend = TransformersBackend(model, tok, max_batch=args.max_batch)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    updater = GRPOUpdater(model, UpdaterConfig(lr=3e-4, micro_batch_tokens=args.micro_batch_tokens, pad_id=pad))
    tasks = select_tasks(args.world, "train", limit=args.tasks, tool_distractors=1)
    style = PromptStyle(max_examples=2, max_history_results=3)
    one_step(backend, updater, tasks[:1], style, 2, 1, args, args.seed)  # warm-up
    points = [(g, args.base_turns) for g in args.groups] + [(args.base_group, t) for t in args.turns]
    points = list(dict.fromkeys(points))
    print(f"{'G':>3} {'turns':>5} {'episodes':>8} {'samples':>7} {'gen tok':>7} {'train tok':>9} "
          f"{'rollout s':>9} {'update s':>8} {'step s':>7} {'pad':>5} {'RSS MiB':>7} {'load1':>5}")
    for k, (g, turns) in enumerate(points):
        la = load1()
        r = one_step(backend, updater, tasks, style, g, turns, args, args.seed + k)
        print(f"{g:>3} {turns:>5} {g * len(tasks):>8} {r['samples']:>7} {r['gen_tokens']:>7} {r['train_tokens']:>9} "
              f"{r['rollout_s']:>9.1f} {r['update_s']:>8.1f} {r['rollout_s'] + r['update_s']:>7.1f} "
              f"{r['padding']:>5.1%} {r['rss']:>7.0f} {la:>5.2f}", flush=True)
    print(f"peak RSS    {peak_rss_mib():.0f} MiB (after load {rss_loaded:.0f} MiB)")


if __name__ == "__main__":
    main()
