"""One rank of the 2-process test (run by ``accelerate launch --multi_gpu --num_processes 2``,
which on a machine without GPUs runs 2 CPU processes on the gloo backend).

Each rank keeps its share of the tasks, computes advantages over the whole group, and takes
one distributed update (``ddp_worker.py OUT [ddp|fsdp]``); rank r writes its parameters (under
FSDP: its whole-weight replicas), stats and the optimiser state a checkpoint would save to
OUT/rank{r}.pt. It also checks, on every rank, that group advantages are exact when a group's
trajectories are split across ranks (exit code 3 if not)."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

from scale_helpers import make_anchor, make_trajectories, make_updaters, tiny_models  # noqa: E402

from envace.train import distributed as dist  # noqa: E402
from envace.train.advantages import compute_advantages  # noqa: E402
from envace.train.modes import ModeSpec  # noqa: E402
from envace.train.step import update_for_mode  # noqa: E402


def main(out_dir: str, parallel: str = "ddp") -> int:
    accelerator = dist.make_accelerator()
    assert accelerator is not None and accelerator.num_processes == 2, "launch with 2 processes"
    rank = accelerator.process_index
    caller, simulator, tok = tiny_models()
    trajs = make_trajectories(caller, len(tok))

    # 1. Group advantages when a group's G trajectories sit on different ranks.
    split = trajs[rank::2]
    got = dist.compute_advantages_global(accelerator, split, content_free_ids={0}, format_bonus=0.3, norm_by_std=True)
    want_all = compute_advantages(trajs, content_free_ids={0}, format_bonus=0.3, norm_by_std=True)
    want = {(s.sample.group_id, s.sample.trajectory_index, s.sample.turn, s.sample.role): s for s in want_all}
    for s in got:
        ref = want[(s.sample.group_id, s.sample.trajectory_index, s.sample.turn, s.sample.role)]
        if s.advantage != ref.advantage or s.reward != ref.reward:
            print(f"rank {rank}: advantage mismatch {s.advantage} vs {ref.advantage}", file=sys.stderr)
            return 3

    # 2. The training step: whole tasks per rank.
    mine = set(dist.shard_tasks(sorted({t.task_id for t in trajs}), accelerator))
    local = [t for t in trajs if t.task_id in mine]
    scored = dist.compute_advantages_global(accelerator, local)
    spec = ModeSpec.for_mode("noshare")
    updaters = dist.prepare_updaters(accelerator, make_updaters(caller, simulator), parallel)
    stats = update_for_mode(spec, updaters, scored, anchor=make_anchor(len(tok)))  # every rank: the same anchor
    optimizers = dist.optimizers_of(updaters)  # under FSDP: gathered, a collective
    saved = {k: o if isinstance(o, dict) else o.state_dict() for k, o in optimizers.items()}
    torch.save({"rank": rank, "stats": stats,
                "caller": {k: v.detach().clone() for k, v in caller.state_dict().items()},
                "simulator": {k: v.detach().clone() for k, v in simulator.state_dict().items()},
                "local_samples": len(scored), "optimizers": saved},
               os.path.join(out_dir, f"rank{rank}.pt"))
    accelerator.wait_for_everyone()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
