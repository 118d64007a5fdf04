import pytest

from envace.core.types import ChecklistItem, Message, Task, ToolCall, Trajectory
from envace.envs.registry import make_world
from envace.reward.checklist import args_match, judge_trajectory

TOOLS = [{"type": "function", "function": {"name": "cancel_order", "parameters": {"type": "object"}}}]


def _task(*items):
    return Task(id="t", instruction="x", tools=TOOLS, checklist=list(items))


def _traj(calls_and_results, answer):
    msgs = [Message(role="user", content="x")]
    for call, result in calls_and_results:
        msgs.append(Message(role="assistant", content="...", tool_calls=[call]))
        msgs.append(Message(role="tool", name=call.name, content=result))
    msgs.append(Message(role="assistant", content=answer))
    return Trajectory(task_id="t", source="real", messages=msgs)


def test_args_subset_and_number_equality():
    assert args_match({"id": "o-1", "amount": 42.5}, {"id": "o-1", "amount": 42.50, "note": "x"})
    assert not args_match({"id": "o-1"}, {"id": "o-2"})
    assert not args_match({"flag": True}, {"flag": 1})
    assert not args_match({"id": "o-1"}, {})


def test_called_ignores_calls_rejected_before_the_world():
    item = ChecklistItem(kind="called", tool="cancel_order", args={"order_id": "o-1"})
    call = ToolCall(name="cancel_order", arguments={"order_id": "o-1"})
    rejected = _traj([(call, '{"error": {"code": "INVALID_PARAMETERS", "message": "m"}}')], "done")
    accepted = _traj([(call, '{"error": {"code": "ORDER_NOT_CANCELLABLE", "message": "m"}}')], "done")
    assert judge_trajectory(_task(item), rejected)[0] == 0.0
    assert judge_trajectory(_task(item), accepted)[0] == 1.0  # it reached the world, which refused


def test_answer_contains_ignores_case_and_thousands_separators():
    item = ChecklistItem(kind="answer_contains", text="1645.20")
    assert judge_trajectory(_task(item), _traj([], "Refund: $1,645.20."))[0] == 1.0
    assert judge_trajectory(_task(item), _traj([], "Refund: 164.52"))[0] == 0.0


def test_state_items_need_a_world_and_sql_errors_are_verdicts():
    good = ChecklistItem(kind="state", query="SELECT 1", equals=[[1]])
    bad_sql = ChecklistItem(kind="state", query="SELEC oops", equals=[[1]])
    ans = ChecklistItem(kind="answer_contains", text="ok")
    task = _task(good, bad_sql, ans)
    reward, verdicts = judge_trajectory(task, _traj([], "ok"), world=None)
    assert [v.met for v in verdicts] == [None, None, True] and reward == 1.0
    reward, verdicts = judge_trajectory(task, _traj([], "ok"), world=make_world("shop", 1))
    assert [v.met for v in verdicts] == [True, False, True] and reward == pytest.approx(2 / 3)
    assert "SQL error" in verdicts[1].detail


class YesJudge:
    def judge(self, criterion, task, trajectory):
        return criterion.startswith("yes"), "scripted"


def test_judge_items_go_through_the_judge_or_are_skipped():
    task = _task(ChecklistItem(kind="judge", criterion="yes: polite"), ChecklistItem(kind="judge", criterion="no"))
    assert judge_trajectory(task, _traj([], "hi"), judge=YesJudge())[0] == 0.5
    assert judge_trajectory(task, _traj([], "hi"))[1][0].met is None


def test_model_judge_runs_on_a_real_backend(tiny_backend):
    from envace.reward.judge import ModelJudge

    task = _task(ChecklistItem(kind="judge", criterion="The assistant greeted the user."))
    reward, [v] = judge_trajectory(task, _traj([], "Hello!"), judge=ModelJudge(tiny_backend, max_new_tokens=4))
    assert v.met in (True, False) and reward in (0.0, 1.0) and isinstance(v.detail, str)
