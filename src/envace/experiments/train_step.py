"""One GRPO step of the training job: roll out -> advantages -> update -> sync -> a metrics row.

On several processes (accelerate) each rank rolls out its share of the step's tasks, advantages
are centred over every rank's samples and the update is one synchronised optimiser step on the
global batch; with one process every collective below is the plain single-process call.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from envace.core.types import Task, Trajectory
from envace.experiments.config import TrainConfig
from envace.experiments.factory import GenerationSettings, make_actor, make_source
from envace.experiments.models import RunModels
from envace.experiments.rollout_backends import RolloutBackends
from envace.experiments.tasksets import TaskSet, step_tasks
from envace.experiments.step_metrics import kv_counts, recompute_gap, step_row
from envace.policy.allocator import release_freed_memory
from envace.train import distributed as dist
from envace.train.advantages import ScoredSample, groups_with_signal
from envace.train.collectives import reduce_sum
from envace.train.step import update_for_mode, warmup_lr


@dataclass
class StepRollouts:
    """What a step rolled out (this rank's share of it) and which of it trains."""

    trajectories: list[Trajectory]  # every round's
    scored: list[ScoredSample]  # every round's samples, flat groups too
    tasks: list[Task]  # every round's tasks, all ranks', in draw order
    tokens_per_s: float
    rounds: int = 1
    signal: set[str] | None = None  # dynamic_sampling: the groups that train (None: all of them)
    groups_trained: int | None = None  # of them, over all ranks

    def to_train(self) -> list[ScoredSample]:
        return self.scored if self.signal is None else [s for s in self.scored if s.sample.group_id in self.signal]


@dataclass
class Trainer:
    """What every step uses, built once by the training job."""

    cfg: TrainConfig
    tasks: TaskSet
    models: RunModels
    updaters: dict
    backends: RolloutBackends
    gen: GenerationSettings
    eos_ids: set[int]  # an EOS-only turn is empty (advantages.empty_penalty)
    judge: Any = None
    anchors: list | None = None  # grpo.anchor_coef: the warm start's SFT samples
    accelerator: Any | None = None  # several processes (accelerate); None: one process

    def roll(self, step: int, round_: int, tasks: list[Task]) -> StepRollouts:
        """One rollout round of ``tasks``: this rank plays its share (all of them in one process)
        and scores its samples against every rank's of the same (task, role) group."""
        cfg, acc, b = self.cfg, self.accelerator, self.backends
        mine = dist.shard_tasks(tasks, acc)
        # Rollouts depend on (seed, step, round) only: resumable. Rank 0 keeps the seed, others shift it.
        seed = dist.rank_seed(cfg.seed * 10_007 + step + 100_003 * round_, acc)
        actor = make_actor(b.caller, self.gen, seed)
        # Rehearsal uses the simulator-role model (the policy itself in share mode); None: the real world.
        source = None if cfg.source == "real" else make_source(cfg.source, b.simulator, self.gen, seed,
                                                              simulator=b.simulator)
        trajs, tok_s = self.tasks.play(mine, actor, source, b.caller, seed, judge=self.judge)
        g = cfg.grpo
        scored = dist.compute_advantages_global(acc, trajs, norm_by_std=g.norm_by_std, empty_penalty=g.empty_penalty,
                                                content_free_ids=self.eos_ids, format_bonus=g.sim_format_reward)
        return StepRollouts(trajs, scored, list(tasks), tok_s)


def dynamic_sampling(cfg: TrainConfig, pool: list, step: int, first: StepRollouts, roll: Any,
                     accelerator: Any | None = None) -> StepRollouts:
    """DAPO's dynamic sampling: only task groups with signal (a sample with non-zero advantage)
    train; while fewer than ``tasks_per_step`` of them are in hand, up to ``cfg.dynamic_sampling``
    more rounds of ``tasks_per_step`` fresh tasks are rolled out. ``roll(step, round, tasks)``
    rolls out this rank's share of a round's tasks. Every group with signal trains: a step trains
    from none up to twice ``tasks_per_step`` groups."""
    got, speeds = first, [first.tokens_per_s]
    while True:
        signal = groups_with_signal(got.scored)
        have = int(reduce_sum(accelerator, [float(len(signal))])[0])
        if have >= cfg.tasks_per_step or got.rounds > cfg.dynamic_sampling:
            break
        more = step_tasks(pool, cfg, step, got.rounds, frozenset(t.id for t in got.tasks))
        if not more:  # the pool is used up
            break
        new = roll(step, got.rounds, more)
        speeds.append(new.tokens_per_s)
        got = StepRollouts(got.trajectories + new.trajectories, got.scored + new.scored, got.tasks + more,
                           0.0, got.rounds + 1)
    got.tokens_per_s = sum(speeds) / len(speeds)
    got.signal, got.groups_trained = signal, have
    return got


def train_step(t: Trainer, step: int) -> tuple[dict[str, Any], list[Trajectory]]:
    """One GRPO step: its metrics row and every rank's trajectories, in task order."""
    cfg, acc, b = t.cfg, t.accelerator, t.backends
    t0 = time.perf_counter()
    kv0 = kv_counts(b.caller, b.simulator)
    got = t.roll(step, 0, step_tasks(t.tasks.train_pool, cfg, step))
    if cfg.dynamic_sampling:
        got = dynamic_sampling(cfg, t.tasks.train_pool, step, got, t.roll, acc)
    scored = got.to_train()
    release_freed_memory()  # the rollouts' caches and buffers, before the update allocates its own
    t_roll = time.perf_counter() - t0
    kv1 = kv_counts(b.caller, b.simulator)
    own = own_forward_logprobs(cfg)  # the update's forward scores the rollouts itself
    gap = recompute_gap(t, scored) if b.recompute and not own else (None, None)
    anchor = step_anchor(t.anchors, cfg, step) if t.anchors else ()
    ustats = update_for_mode(t.models.spec, t.updaters, scored, lr=warmup_lr(cfg.grpo.lr, step, cfg.grpo.warmup_steps),
                             anchor=anchor)
    b.sync()  # the serving engine generates the next rollouts with the new weights
    release_freed_memory()
    t_total = time.perf_counter() - t0
    rolled = dist.gather_objects(acc, [(got.tokens_per_s, t_roll)])
    trajs = dist.gather_in_task_order(acc, got.trajectories, got.tasks)
    row = step_row(cfg, step, trajs, got, rolled, t_roll, t_total, (kv0, kv1), gap, own, ustats, acc)
    return row, trajs


def own_forward_logprobs(cfg: TrainConfig) -> bool:
    """Rollouts whose log-probs the trainer must score itself, updated once per batch: the update's
    own forward gives those log-probs (the PPO ratio is 1 at the first optimiser step), so no
    separate scoring pass runs. With several ``ppo_epochs`` the later epochs need them stored first."""
    return cfg.rollout.recomputes_logprobs and cfg.grpo.ppo_epochs == 1


def step_anchor(samples: list, cfg: TrainConfig, step: int) -> list:
    """A step's anchor samples: a function of (seed, step), so every rank and a resumed run agree."""
    return random.Random(cfg.seed * 1_000_033 + step).sample(samples, min(cfg.grpo.anchor_samples, len(samples)))
