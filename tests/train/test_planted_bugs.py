"""Tests that catch the bugs a careless edit would plant: each fails if its line of code is broken
(the PPO clip's lower bound, clip_high, case-insensitive answers, subset argument matching,
empty tool names, non-finite arguments, 2.0 for an integer)."""

from __future__ import annotations

import math

import pytest
import torch
from train_helpers import make_sample

from envace.core.errors import error_code
from envace.core.toolcall import parse_tool_calls
from envace.core.types import ChecklistItem, Message, Task, ToolCall, Trajectory
from envace.core.validate import validate_call
from envace.envs.registry import make_world
from envace.envs.tasks import load_tasks
from envace.reward.checklist import judge_trajectory
from envace.train.advantages import ScoredSample
from envace.train.forward import batch_loss


def _grad_norm(model: torch.nn.Module) -> float:
    return max(float(p.grad.abs().max()) for p in model.parameters() if p.grad is not None)


def test_a_negative_advantage_token_below_one_minus_clip_is_clipped(tiny_model):
    s = make_sample(tiny_model, "caller", [1, 2, 3], [4, 5, 6])
    # Stored log-probs far above the current ones: ratio = e^-2 < 1 - clip. With A < 0 the
    # clipped branch binds: the loss is -A (1 - clip) per token and no gradient flows.
    raised = s.model_copy(update={"logprobs": [lp + 2.0 for lp in s.logprobs]})
    tiny_model.zero_grad()
    loss, stats = batch_loss(tiny_model, [ScoredSample(raised, -1.0, 0.0)], clip=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(0.8, abs=1e-5)
    assert stats["clip_frac"] == 1.0
    assert all(p.grad is None or float(p.grad.abs().max()) == 0.0 for p in tiny_model.parameters())


def test_clip_high_widens_only_the_upper_bound(tiny_model):
    s = make_sample(tiny_model, "caller", [1, 2, 3], [4, 5, 6])
    lowered = s.model_copy(update={"logprobs": [lp - 0.3 for lp in s.logprobs]})  # ratio e^0.3 = 1.35
    tiny_model.zero_grad()
    loss, stats = batch_loss(tiny_model, [ScoredSample(lowered, 1.0, 1.0)], clip=0.2, clip_high=0.5)
    loss.backward()
    assert loss.item() == pytest.approx(-math.exp(0.3), abs=1e-4)  # inside 1 + 0.5: not clipped
    assert stats["clip_frac"] == 0.0 and _grad_norm(tiny_model) > 0
    tiny_model.zero_grad()
    loss, stats = batch_loss(tiny_model, [ScoredSample(lowered, 1.0, 1.0)], clip=0.2)
    assert loss.item() == pytest.approx(-1.2, abs=1e-5) and stats["clip_frac"] == 1.0


def _traj(answer: str, calls: list[ToolCall] = ()) -> Trajectory:
    msgs = [Message(role="user", content="q")]
    for c in calls:
        msgs += [Message(role="assistant", tool_calls=[c]), Message(role="tool", name=c.name, content='{"ok": true}')]
    msgs.append(Message(role="assistant", content=answer))
    return Trajectory(task_id="t", source="real", messages=msgs)


def _task(*items: ChecklistItem) -> Task:
    return Task(id="t", instruction="q", tools=[], checklist=list(items))


def test_answer_contains_ignores_case_of_letters():
    task = _task(ChecklistItem(kind="answer_contains", text="Refund Approved"))
    assert judge_trajectory(task, _traj("your refund approved: yes"))[0] == 1.0
    assert judge_trajectory(task, _traj("REFUND APPROVED"))[0] == 1.0
    assert judge_trajectory(task, _traj("refund denied"))[0] == 0.0


def test_called_matches_a_subset_of_the_arguments():
    task = _task(ChecklistItem(kind="called", tool="cancel_order", args={"order_id": "o-1"}))
    extra = ToolCall(name="cancel_order", arguments={"order_id": "o-1", "reason": "changed my mind"})
    assert judge_trajectory(task, _traj("done", [extra]))[0] == 1.0
    missing = ToolCall(name="cancel_order", arguments={"reason": "x"})
    assert judge_trajectory(task, _traj("done", [missing]))[0] == 0.0
    other = ToolCall(name="cancel_order", arguments={"order_id": "o-2"})
    assert judge_trajectory(task, _traj("done", [other]))[0] == 0.0


def test_an_empty_tool_name_is_not_a_call():
    assert parse_tool_calls('<tool_call>{"name": "", "arguments": {}}</tool_call>').error is not None
    tools = load_tasks("shop", "test", limit=1)[0].tools
    assert error_code(validate_call(ToolCall(name="", arguments={}), tools)) == "TOOL_NOT_AVAILABLE"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_amounts_never_reach_a_tool(bad):
    w = make_world("bank", 3)
    before = w.query("SELECT id, balance_cents FROM accounts ORDER BY id")
    accounts = [r[0] for r in before]
    out = w.call("transfer_funds", {"from_account_id": accounts[0], "to_account_id": accounts[1], "amount": bad})
    assert error_code(out) == "INVALID_PARAMETERS"
    assert w.query("SELECT id, balance_cents FROM accounts ORDER BY id") == before


def test_two_point_zero_is_taken_as_the_integer_two():
    task = next(t for t in load_tasks("shop", "test") if any(c.name == "return_item" for c in t.reference.calls))
    ref = [c for c in task.reference.calls]
    as_float = [c.model_copy(update={"arguments": {k: float(v) if k == "quantity" else v
                                                   for k, v in c.arguments.items()}}) for c in ref]
    a, b = make_world("shop", task.env.seed), make_world("shop", task.env.seed)
    assert [a.call(c.name, c.arguments) for c in ref] == [b.call(c.name, c.arguments) for c in as_float]
