"""Failure classes on real trajectories: a real shop world answers scripted callers, the checklist
judges them with the world, and each episode lands in the class its definition names."""

from envace.core.toolcall import format_tool_call
from envace.core.types import ToolCall
from envace.envs.tasks import load_tasks
from envace.experiments.failures import (
    FAILURE_CLASSES,
    class_shares,
    failure_class,
    failure_rows,
    failure_table,
    needed_calls,
    transition_table,
)
from envace.rollout.actors import ActorTurn, OracleActor
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.sources import RealSource


class ScriptedActor:
    def __init__(self, turns):
        self.turns = turns

    def act(self, views, turn):
        return [ActorTurn(text=self.turns[min(turn, len(self.turns) - 1)]) for _ in views]


def _call(name, **args):
    return format_tool_call(ToolCall(name=name, arguments=args))


def _task():
    (task,) = [t for t in load_tasks("shop", "test", limit=60) if t.id == "shop-0021"]
    # "Put 2 x Summit Blender in my cart and tell me the cart subtotal."
    assert needed_calls(task) == [("add_to_cart", {"product_id": "p-656", "quantity": 2})]
    return task


SEARCH = _call("search_products", query="Summit Blender")
SCRIPTS = {
    "no_call": ["Sorry, I cannot help with that."],
    "wrong_tool": [SEARCH, _call("get_account"), "Your account looks fine."],
    "wrong_arguments": [SEARCH, _call("add_to_cart", product_id="p-656", quantity=1), "Added; subtotal 17.99."],
    "wrong_answer": [SEARCH, _call("add_to_cart", product_id="p-656", quantity=2), "Added; subtotal 10.00."],
    "gave_up": [SEARCH, "I could not find a way to add it."],
}


def _real(task, actor, turns=4):
    source = RealSource()
    try:
        [traj], _ = run_episodes([task], actor, source, RolloutConfig(max_turns=turns))
    finally:
        source.close()
    return traj


def test_each_failure_class_on_real_episodes():
    task = _task()
    solved = _real(task, OracleActor())
    assert solved.solved and failure_class(task, solved) == "solved"
    for expected, turns in SCRIPTS.items():
        traj = _real(task, ScriptedActor(turns))
        assert not traj.solved and failure_class(task, traj) == expected, (expected, traj.verdicts)
    # A call the schema rejects did not happen: the needed tool called with bad arguments.
    bad = _real(task, ScriptedActor([SEARCH, _call("add_to_cart", product_id="p-656", quantity="two"), "ok"]))
    assert failure_class(task, bad) == "wrong_arguments"
    # Out of turns after only lookups: stopped short too.
    looping = _real(task, ScriptedActor([SEARCH]), turns=3)
    assert looping.stop_reason == "max_turns" and failure_class(task, looping) == "gave_up"


def test_a_task_without_called_items_needs_its_reference_calls():
    task = _task()
    bare = task.model_copy(update={"checklist": [i for i in task.checklist if i.kind != "called"]})
    assert needed_calls(bare) == [(c.name, c.arguments) for c in task.reference.calls]
    traj = _real(bare, ScriptedActor([_call("search_products", query="blender"), "Nothing found."]))
    assert failure_class(bare, traj) == "wrong_arguments"  # the reference searched for "Summit Blender"


def test_rows_shares_and_tables():
    task = _task()
    before = [_real(task, ScriptedActor(SCRIPTS["no_call"]))]
    after = [_real(task, OracleActor())]
    rb, ra = failure_rows([task], before, step=0), failure_rows([task], after, step=5)
    assert rb == [{"step": 0, "task_id": task.id, "trajectory_index": 0, "class": "no_call"}]
    shares = class_shares(rb + ra)
    assert set(shares) == set(FAILURE_CLASSES) and shares["no_call"] == shares["solved"] == 0.5
    table = "\n".join(failure_table(rb, ra, ("step 0", "step 5")))
    assert "| no call | 1 | 0 |" in table and "| solved | 0 | 1 |" in table
    assert f"| {task.id} | no call | solved |" in "\n".join(transition_table(rb, ra))
