"""Role-wise advantages against hand-worked examples."""

from __future__ import annotations

import math

import pytest

from envace.core.types import Message, Trajectory, TurnSample
from envace.train.advantages import advantage_stats, compute_advantages


def _sample(role: str, group: str, traj: int, turn: int, gen: list[int] | None = None) -> TurnSample:
    gen = [5, 6] if gen is None else gen
    return TurnSample(
        role=role, group_id=group, trajectory_index=traj, turn=turn,
        prompt_ids=[1, 2], gen_ids=gen, logprobs=[-1.0] * len(gen),
    )


def _traj(group: str, index: int, reward: float, samples: list[TurnSample]) -> Trajectory:
    return Trajectory(task_id=group, source="rehearsal", trajectory_index=index,
                      messages=[Message(role="user", content="hi")], samples=samples, reward=reward)


def _three_trajectories() -> list[Trajectory]:
    # Group t1, G=3, unequal turn counts:
    #   traj0 R=1.0: 2 caller, 1 simulator;  traj1 R=0.0: 1 caller, 1 simulator;  traj2 R=0.5: 3 caller.
    return [
        _traj("t1", 0, 1.0, [_sample("caller", "t1", 0, 0), _sample("simulator", "t1", 0, 0), _sample("caller", "t1", 0, 1)]),
        _traj("t1", 1, 0.0, [_sample("caller", "t1", 1, 0), _sample("simulator", "t1", 1, 0)]),
        _traj("t1", 2, 0.5, [_sample("caller", "t1", 2, t) for t in range(3)]),
    ]


def test_pools_turn_samples_per_group_and_role():
    scored = compute_advantages(_three_trajectories())
    # Caller pool: rewards [1, 1, 0, .5, .5, .5] -> mean 3.5/6.
    caller_mean = 3.5 / 6
    sim_mean = 0.5  # simulator pool: [1, 0]
    expected = [
        1 - caller_mean, 1 - sim_mean, 1 - caller_mean,
        0 - caller_mean, 0 - sim_mean,
        0.5 - caller_mean, 0.5 - caller_mean, 0.5 - caller_mean,
    ]
    assert [s.sample.role for s in scored] == ["caller", "simulator", "caller", "caller", "simulator", "caller", "caller", "caller"]
    assert [s.advantage for s in scored] == pytest.approx(expected, abs=1e-12)
    assert [s.reward for s in scored] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.5]
    # Both roles' samples of a trajectory carry the same reward.
    assert math.fsum(s.advantage for s in scored if s.role == "caller") == pytest.approx(0.0, abs=1e-12)


def test_groups_do_not_mix_and_zero_variance_gives_zero():
    trajs = _three_trajectories() + [
        _traj("t2", 0, 1.0, [_sample("caller", "t2", 0, 0)]),
        _traj("t2", 1, 1.0, [_sample("caller", "t2", 1, 0), _sample("caller", "t2", 1, 1)]),
    ]
    for norm in (False, True):
        scored = compute_advantages(trajs, norm_by_std=norm)
        t2 = [s for s in scored if s.sample.group_id == "t2"]
        assert [s.advantage for s in t2] == [0.0, 0.0, 0.0]
        assert all(math.isfinite(s.advantage) for s in scored)
        t1 = [s.advantage for s in scored if s.sample.group_id == "t1"]
        assert t1 == pytest.approx([s.advantage for s in compute_advantages(trajs[:3], norm_by_std=norm)])


def test_zero_variance_with_inexact_float_mean_is_exactly_zero():
    trajs = [_traj("t", i, 0.1, [_sample("caller", "t", i, 0)]) for i in range(3)]
    assert [s.advantage for s in compute_advantages(trajs, norm_by_std=True)] == [0.0, 0.0, 0.0]


def test_norm_by_std():
    scored = compute_advantages(_three_trajectories(), norm_by_std=True, eps=1e-6)
    sim = [s.advantage for s in scored if s.role == "simulator"]
    # Pool [1, 0]: mean .5, population std .5.
    assert sim == pytest.approx([0.5 / (0.5 + 1e-6), -0.5 / (0.5 + 1e-6)], rel=1e-12)
    caller_rewards = [1, 1, 0, 0.5, 0.5, 0.5]
    mean = sum(caller_rewards) / 6
    std = math.sqrt(sum((r - mean) ** 2 for r in caller_rewards) / 6)
    caller = [s.advantage for s in scored if s.role == "caller"]
    assert caller == pytest.approx([(r - mean) / (std + 1e-6) for r in caller_rewards], rel=1e-12)


def test_empty_generation_penalty():
    trajs = [
        _traj("t", 0, 1.0, [_sample("caller", "t", 0, 0, gen=[])]),
        _traj("t", 1, 1.0, [_sample("caller", "t", 1, 0)]),
    ]
    scored = compute_advantages(trajs, empty_penalty=0.1)
    assert [s.reward for s in scored] == pytest.approx([0.9, 1.0])
    assert [s.advantage for s in scored] == pytest.approx([-0.05, 0.05])
    # Without the penalty the group has no variance.
    assert [s.advantage for s in compute_advantages(trajs, empty_penalty=0.0)] == [0.0, 0.0]
    # A generation of only content-free ids (e.g. EOS) counts as empty when asked.
    eos_only = [_traj("t", 0, 1.0, [_sample("caller", "t", 0, 0, gen=[2])]), trajs[1]]
    assert [s.reward for s in compute_advantages(eos_only)] == [1.0, 1.0]
    assert [s.reward for s in compute_advantages(eos_only, content_free_ids={2})] == pytest.approx([0.9, 1.0])


def test_roles_filter_keeps_pools_intact():
    all_scored = compute_advantages(_three_trajectories())
    sim_only = compute_advantages(_three_trajectories(), roles={"simulator"})
    assert [s.role for s in sim_only] == ["simulator", "simulator"]
    assert [s.advantage for s in sim_only] == [s.advantage for s in all_scored if s.role == "simulator"]


def test_advantage_stats():
    stats = advantage_stats(compute_advantages(_three_trajectories()))
    assert stats["samples/caller"] == 6 and stats["samples/simulator"] == 2
    assert stats["reward/simulator"] == pytest.approx(0.5)
    assert stats["adv_zero_frac/caller"] == 0.0


def test_format_bonus_rewards_parsable_simulator_turns_only():
    from envace.core.types import Message, Trajectory, TurnSample
    from envace.train.advantages import compute_advantages

    def sample(role, ok):
        return TurnSample(role=role, group_id="g", trajectory_index=0, turn=0, prompt_ids=[1], gen_ids=[5],
                          logprobs=[-1.0], format_ok=ok)

    traj = Trajectory(task_id="g", source="rehearsal", messages=[Message(role="user", content="x")], reward=0.5,
                      samples=[sample("simulator", True), sample("simulator", False), sample("caller", None)])
    scored = compute_advantages([traj], format_bonus=0.2)
    assert [s.reward for s in scored] == [0.7, 0.5, 0.5]
    assert [round(s.advantage, 6) for s in scored] == [0.1, -0.1, 0.0]
