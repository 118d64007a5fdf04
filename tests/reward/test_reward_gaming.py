"""The reward cannot be gamed: the five cheat strategies of benchmarks/reward_gaming.py never
score full marks on a task where the cheat was carried out, while the reference still does."""

import sys
from pathlib import Path

import pytest

from envace.core.toolcall import format_tool_call
from envace.envs.registry import world_names
from envace.envs.tasks import load_tasks
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.sources import RealSource

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from reward_gaming import STRATEGIES, Cheat, play, unguarded_reward  # noqa: E402

SAMPLE = 24  # test tasks per world


@pytest.mark.parametrize("world", world_names())
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_no_cheat_scores_full_marks(world, strategy):
    tried, n = play(world, strategy, SAMPLE)
    full = [tr.task_id for _, tr in tried if tr.reward >= 1.0]
    assert not full, f"{strategy} scored 1.0 on {full}"
    if strategy in ("blind_dump", "dump_answer", "read_everything"):
        assert len(tried) == n
    else:
        assert len(tried) >= 3, f"{strategy} could be carried out on only {len(tried)} {world} tasks"


def test_without_the_guards_the_cheats_would_pay():
    """The guards are what stops them: the reward without them gives full marks to a cheat."""
    tried, _ = play("shop", "collateral_writes", SAMPLE)
    assert any(unguarded_reward(t, tr) >= 1.0 for t, tr in tried)
    tried, _ = play("calendar", "dump_answer", SAMPLE)
    assert any(unguarded_reward(t, tr) >= 1.0 for t, tr in tried)


def test_the_reference_solution_still_scores_full_marks():
    for world in world_names():
        tasks = load_tasks(world, "test", limit=SAMPLE)

        class Oracle(Cheat):
            def turn(self, task, history):
                done = sum(1 for m in history if m.role == "assistant")
                calls = task.reference.calls
                return format_tool_call(calls[done]) if done < len(calls) else task.reference.answer

        trajs, _ = run_episodes(tasks, Oracle("oracle", set()), RealSource(), RolloutConfig(max_turns=12))
        assert all(t.reward == 1.0 for t in trajs)
