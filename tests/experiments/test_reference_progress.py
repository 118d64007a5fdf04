"""``rollout.progress_weight``: training episodes of a task with a reference earn partial credit
for in-order progress along it; evals never do. Real shop-world episodes, an actor that makes the
reference's first call and then gives up."""

from __future__ import annotations

from envace.core.toolcall import format_tool_call
from envace.envs.tasks import load_tasks
from envace.experiments.config import load_config
from envace.experiments.tasksets import WorldTasks
from envace.rollout.actors import ActorTurn
from envace.rollout.sources import RealSource


class FirstCallThenGiveUp:
    """The reference's first call, then an answer that states nothing."""

    def act(self, views, turn):
        out = []
        for v in views:
            done = sum(1 for m in v.history if m.role == "assistant")
            out.append(ActorTurn(text=format_tool_call(v.task.reference.calls[0]) if done == 0 else "I could not."))
        return out


def _rewards(weight: float) -> tuple[list[float], list[float]]:
    tasks = [t for t in load_tasks("shop", "train", limit=40) if t.reference and len(t.reference.calls) >= 2][:3]
    assert len(tasks) == 3
    cfg = load_config(None, ["model=tiny", "group_size=1", f"rollout.progress_weight={weight}", "eval.samples=1"])
    ts = WorldTasks(cfg, tasks, tasks, "real", RealSource(None))
    try:
        played, _ = ts.play(tasks, FirstCallThenGiveUp(), None, None, seed=0)
        evaluated = ts.evaluate(tasks, FirstCallThenGiveUp(), None, None, seed=0)
    finally:
        ts.close()
    return [t.reward for t in played], [t.reward for t in evaluated]


def test_progress_along_the_reference_pays_in_training_only_when_set():
    train_off, eval_off = _rewards(0.0)
    train_on, eval_on = _rewards(0.5)
    assert train_on != train_off and all(on > off for on, off in zip(train_on, train_off))
    assert all(r < 1.0 for r in train_on)  # progress never makes an unsolved episode solved
    assert eval_on == eval_off  # the eval scores the checklist alone
