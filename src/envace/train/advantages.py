"""Role-wise GRPO advantages (docs/design.md §1).

Every generated turn is a sample. Its reward is its trajectory's reward (the same for both
roles), minus a small penalty when it generated nothing. Advantages are centred per
``(group_id, role)``: the pool is every turn-sample of that role in the task's G trajectories,
so a trajectory with five caller turns weighs five times in its caller group's mean.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from envace.core.types import Role, Trajectory, TurnSample


@dataclass(frozen=True)
class ScoredSample:
    """A turn-sample with what GRPO needs: its (penalised) reward and its group advantage."""

    sample: TurnSample
    advantage: float
    reward: float

    @property
    def role(self) -> Role:
        return self.sample.role

    @property
    def n_tokens(self) -> int:
        """Tokens that carry loss."""
        return self.sample.target_count


def is_empty_generation(sample: TurnSample, content_free_ids: Collection[int] = ()) -> bool:
    """True when the turn generated no token, or only tokens in ``content_free_ids`` (e.g. EOS)."""
    return all(t in content_free_ids for t in sample.gen_ids)


def sample_reward(
    sample: TurnSample,
    trajectory_reward: float,
    empty_penalty: float = 0.1,
    content_free_ids: Collection[int] = (),
) -> float:
    if is_empty_generation(sample, content_free_ids):
        return trajectory_reward - empty_penalty
    return trajectory_reward


def compute_advantages(
    trajectories: Iterable[Trajectory],
    norm_by_std: bool = False,
    empty_penalty: float = 0.1,
    eps: float = 1e-6,
    roles: Collection[Role] | None = None,
    content_free_ids: Collection[int] = (),
    format_bonus: float = 0.0,
) -> list[ScoredSample]:
    """Score every turn-sample of ``trajectories``; output order = input order of samples.

    ``A = R - mean(R)`` over the sample's ``(group_id, role)`` pool, divided by the pool's
    population std (+ ``eps``) when ``norm_by_std``. A pool whose rewards are all equal gets
    exactly zero advantages (no signal, and no 0/0). ``roles`` keeps only those roles' samples
    in the output (a frozen role's samples need no forward pass); pools are unaffected by it.
    ``content_free_ids``: token ids that do not count as content for the empty penalty
    (pass the EOS id if the policy keeps it in ``gen_ids``).
    ``format_bonus``: added to a simulator sample's reward when its output parsed as JSON in the
    tags (``TurnSample.format_ok``), before centring: the optional simulator format term.
    """
    scored: list[tuple[TurnSample, float]] = []
    for traj in trajectories:
        for s in traj.samples:
            r = sample_reward(s, traj.reward, empty_penalty, content_free_ids)
            if format_bonus and s.role == "simulator" and s.format_ok:
                r += format_bonus
            if _example_match(s) is not None:  # rollout.example_reward: scored against the recorded result
                r = _example_match(s)
            scored.append((s, r))

    pools: dict[tuple[str, Role, bool], list[float]] = defaultdict(list)
    for s, r in scored:
        pools[_pool(s)].append(r)
    centring = {key: _pool_centring(rs, norm_by_std, eps) for key, rs in pools.items()}

    out: list[ScoredSample] = []
    for s, r in scored:
        if roles is not None and s.role not in roles:
            continue
        mean, scale = centring[_pool(s)]
        adv = 0.0 if scale == 0.0 else (r - mean) / scale
        out.append(ScoredSample(sample=s, advantage=adv, reward=r))
    return out


def _example_match(sample: TurnSample) -> float | None:
    """A rehearse-role sample's match against a recorded result (rollout.example_reward), else None."""
    return getattr(sample, "example_match", None) if sample.role == "simulator" else None


def _pool(sample: TurnSample) -> tuple[str, Role, bool]:
    # Samples rewarded by example match are centred among themselves: their 0..1 match and the
    # trajectory's success are different scales, and one pool would shift the other's advantages.
    return sample.group_id, sample.role, _example_match(sample) is not None


def _pool_centring(rewards: Sequence[float], norm_by_std: bool, eps: float) -> tuple[float, float]:
    """(mean, divisor) of a pool; divisor 0 marks a zero-variance pool (all advantages 0)."""
    if max(rewards) == min(rewards):
        return rewards[0], 0.0
    mean = math.fsum(rewards) / len(rewards)
    if not norm_by_std:
        return mean, 1.0
    var = math.fsum((r - mean) ** 2 for r in rewards) / len(rewards)
    return mean, math.sqrt(var) + eps


def advantage_stats(scored: Sequence[ScoredSample]) -> dict[str, float]:
    """Per-role diagnostics: mean reward, mean |A|, and the fraction of samples with A == 0."""
    stats: dict[str, float] = {}
    by_role: dict[str, list[ScoredSample]] = defaultdict(list)
    for s in scored:
        by_role[s.role].append(s)
    for role, items in sorted(by_role.items()):
        n = len(items)
        stats[f"reward/{role}"] = math.fsum(s.reward for s in items) / n
        stats[f"adv_abs/{role}"] = math.fsum(abs(s.advantage) for s in items) / n
        stats[f"adv_zero_frac/{role}"] = sum(s.advantage == 0.0 for s in items) / n
        stats[f"samples/{role}"] = float(n)
    return stats


def groups_with_signal(scored: Iterable[ScoredSample]) -> set[str]:
    """The task groups (``group_id``) at least one of whose samples, of any role, has a non-zero
    advantage: the only groups that give the policy gradient a term."""
    return {s.sample.group_id for s in scored if s.advantage != 0.0}
