"""No cheat of benchmarks/reward_gaming.py scores full marks on a task where it was carried out,
judged against the real world and judged as a rehearsal step judges (no world); value soup at
most on 5% of the tasks; a right answer written with a decimal comma and the reference solution
keep full marks."""

import sys
from pathlib import Path

import pytest

from envace.core.toolcall import format_tool_call
from envace.envs.registry import world_names
from envace.envs.tasks import load_tasks
from envace.reward.checklist import judge_trajectory
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.sources import RealSource

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from reward_gaming import CHEATS, SOUP_MAX_SHARE, WRITE_CHEATS, Cheat, play, unguarded_reward  # noqa: E402

SAMPLE = 24  # test tasks per world


@pytest.mark.parametrize("world", world_names())
@pytest.mark.parametrize("strategy", [c for c in CHEATS if c != "value_soup"])
def test_no_cheat_scores_full_marks_real_or_rehearsal_judged(world, strategy):
    tried, n = play(world, strategy, SAMPLE)
    real = [tr.task_id for _, tr, _ in tried if tr.reward >= 1.0]
    rehearsal = [tr.task_id for _, tr, r in tried if r >= 1.0]
    assert not real, f"{strategy} scored 1.0 against the real world on {real}"
    assert not rehearsal, f"{strategy} scored 1.0 rehearsal-judged on {rehearsal}"
    if strategy in WRITE_CHEATS:
        assert len(tried) >= 3, f"{strategy} could be carried out on only {len(tried)} {world} tasks"
    else:
        assert len(tried) == n


def test_value_soup_rarely_scores_full_marks():
    full = tried = 0
    for world in world_names():
        episodes, _ = play(world, "value_soup", SAMPLE)
        tried += len(episodes)
        full += sum(tr.reward >= 1.0 or r >= 1.0 for _, tr, r in episodes)
    assert tried == SAMPLE * len(world_names()) and full <= SOUP_MAX_SHARE * tried


@pytest.mark.parametrize("world", ["shop", "bank"])
def test_a_decimal_comma_answer_keeps_full_marks(world):
    tried, _ = play(world, "decimal_comma", SAMPLE)
    assert len(tried) >= SAMPLE // 2  # most answers of these worlds state an amount
    assert all(tr.reward == 1.0 and r == 1.0 for _, tr, r in tried), [tr.task_id for _, tr, _ in tried]


def test_without_the_guards_the_cheats_would_pay():
    """The guards are what stops them: the reward without them gives full marks to a cheat."""
    for world, strategy in [("shop", "collateral_writes"), ("calendar", "dump_answer"),
                            ("bank", "write_then_undo"), ("shop", "value_soup")]:
        tried, _ = play(world, strategy, SAMPLE)
        assert any(unguarded_reward(t, tr) >= 1.0 for t, tr, _ in tried), (world, strategy)


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
        assert all(judge_trajectory(task, t)[0] == 1.0 for task, t in zip(tasks, trajs))
