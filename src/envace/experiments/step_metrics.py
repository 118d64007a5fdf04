"""A train step's metrics row and the measurements behind it: how far the engine's log-probs are
from the trainer's, how much of the prompts a kept KV cache saved, how episodes with a rehearsal
memory do against those without. The step itself is :mod:`envace.experiments.train_step`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envace.core.types import Trajectory
from envace.experiments.config import TrainConfig
from envace.rollout.diagnostics import truncated_fractions
from envace.train import distributed as dist
from envace.train.advantages import ScoredSample
from envace.train.forward import recompute_logprobs

if TYPE_CHECKING:  # train_step imports this module
    from envace.experiments.train_step import StepRollouts, Trainer


def step_row(cfg: TrainConfig, step: int, trajs: list[Trajectory], got: StepRollouts, rolled: list,
             t_roll: float, t_total: float, kv: tuple[tuple[int, int], tuple[int, int]],
             gap: tuple[float | None, float | None], own: bool, ustats: dict[str, Any],
             accelerator: Any | None) -> dict[str, Any]:
    """The step's row from every rank's trajectories (``trajs``), each rank's (tokens/s, rollout
    seconds) (``rolled``), the KV counts before and after the rollouts, the recomputed log-prob
    gap and rollout KL, and the update's stats."""
    (kv0, kv1), (gap_max, rollout_kl) = kv, gap
    n = len(trajs)
    row: dict[str, Any] = {"phase": "train", "step": step, "reward": sum(x.reward for x in trajs) / n,
                           "success": sum(x.solved for x in trajs) / n,
                           "tool_calls": sum(x.tool_calls for x in trajs) / n,
                           "parse_failures": sum(x.parse_failures for x in trajs) / n,
                           "sim_format_failures": sum(x.sim_format_failures for x in trajs) / n,
                           "gen_tokens_per_s": sum(r[0] for r in rolled), "rollout_s": max(r[1] for r in rolled),
                           "update_s": t_total - t_roll, "step_s": t_total}
    row.update(truncated_fractions(trajs))
    if kv1[1] > kv0[1]:  # rollout.kv_reuse_tokens: the share of prompt tokens not prefilled again
        row["kv_reused"] = (kv1[0] - kv0[0]) / (kv1[1] - kv0[1])
    if cfg.memory_episodes:  # does the memory help, episode for episode of the same tasks?
        row.update(memory_split(trajs, cfg.group_size - cfg.memory_episodes))
    if own:  # the update measured it in its forward
        gap_max = max((v for k, v in ustats.items() if k.endswith("/logprob_gap_max")), default=0.0)
    if gap_max is not None:
        row["logprob_gap_max"] = gap_max  # engine vs trainer, on this rank's samples
    if rollout_kl is not None:  # mean engine - trainer log-prob (with ppo_epochs 1: the update's <model>/rollout_kl)
        row["rollout_kl"] = rollout_kl
    row.update(dist.global_advantage_stats(accelerator, got.scored))  # every group rolled out, flat ones too
    if got.groups_trained is not None:
        row.update({"rollout_rounds": float(got.rounds), "groups_trained": float(got.groups_trained)})
    row.update(ustats)
    return row


def recompute_gap(t: Trainer, scored: list[ScoredSample]) -> tuple[float, float | None]:
    """The rollout log-probs of the samples each update will run (``GRPOUpdater.forwarded``),
    scored again by the model it trains (see forward.recompute_logprobs); the largest gap, and the
    mean of rollout - trainer log-prob over their tokens (None: no tokens)."""
    gap, diff, n = 0.0, 0.0, 0
    for key, samples in t.models.spec.split_by_model(scored).items():
        up = t.updaters[key]
        temps = up.config.role_temperatures()
        for role in ("caller", "simulator"):
            mine = [x.sample for x in up.forwarded(samples) if x.sample.role == role]
            if mine:
                temp = temps[role] if isinstance(temps, dict) else temps
                before = [list(s.logprobs) for s in mine]
                gap = max(gap, recompute_logprobs(up.model, mine, temp, up.config.pad_id,
                                                  up.config.micro_batch_tokens, up.config.mixed_precision))
                # a == a: an engine's missing (NaN) log-prob adds nothing
                pairs = [(a, b) for s, old in zip(mine, before) for a, b in zip(old, s.logprobs) if a == a]
                diff, n = diff + sum(a - b for a, b in pairs), n + len(pairs)
    return gap, (diff / n if n else None)


def kv_counts(*backends: Any) -> tuple[int, int]:
    """(prompt tokens reused from kept key/value caches, prompt tokens asked for) so far, over
    the distinct backends that keep caches (rollout.kv_reuse_tokens)."""
    stores = {id(s): s for b in backends if (s := getattr(b, "kv_store", None)) is not None}
    return sum(s.reused_tokens for s in stores.values()), sum(s.prompt_tokens for s in stores.values())


def memory_split(trajs: list[Trajectory], plain: int) -> dict[str, float]:
    """Success and reward of the episodes with a rehearsal memory (index >= ``plain``) and without."""
    out: dict[str, float] = {}
    for name, part in (("plain", [x for x in trajs if x.trajectory_index < plain]),
                       ("memory", [x for x in trajs if x.trajectory_index >= plain])):
        if part:
            out[f"success/{name}"] = sum(x.solved for x in part) / len(part)
            out[f"reward/{name}"] = sum(x.reward for x in part) / len(part)
    return out
