"""Every guard of the reward at its boundaries, on real worlds and real trajectories: the answer's
length cap and pasted JSON, a missing table, the writes against the reference (judged with and
without a world), the values an answer must not state, numbers across locale formats, ``called``
on calls that never ran, and the optional reference-progress credit."""

import json
from decimal import Decimal

import pytest

from envace.core.tools import tool_writes, unguarded_warning, unguarded_writes
from envace.core.types import ChecklistItem, Message, Reference, Task, ToolCall, ToolSpec, Trajectory
from envace.core.values import as_number, mentions
from envace.envs.provider import table_digests
from envace.envs.registry import make_world
from envace.envs.tasks import load_tasks
from envace.reward.checklist import judge_trajectory

READ = {"type": "function", "function": {"name": "get_order", "parameters": {"type": "object"}},
        "annotations": {"readOnlyHint": True}}
WRITE = {"type": "function", "function": {"name": "cancel_order", "parameters": {
    "type": "object", "properties": {"order_id": {"type": "string"}, "reason": {"type": "string"},
                                     "notify": {"type": "boolean", "default": True}}}}}
OK = '{"ok": true}'


def _traj(calls=(), answer="done", source="rehearsal"):
    """A trajectory making ``calls`` (ToolCall, or (ToolCall, answer text)) one turn each."""
    msgs = [Message(role="user", content="x")]
    for c in calls:
        call, result = c if isinstance(c, tuple) else (c, OK)
        msgs += [Message(role="assistant", tool_calls=[call]), Message(role="tool", name=call.name, content=result)]
    msgs.append(Message(role="assistant", content=answer))
    return Trajectory(task_id="t", source=source, messages=msgs)


def _task(*items, reference=None, tools=(READ, WRITE)):
    return Task(id="t", instruction="x", tools=list(tools), checklist=list(items), reference=reference)


def cancel(order="o-1", **more):
    return ToolCall(name="cancel_order", arguments={"order_id": order, **more})


def kinds(verdicts, kind):
    return [v.met for v in verdicts if v.item.kind == kind]


# -- answer_plain -----------------------------------------------------------------------------

@pytest.mark.parametrize("length, met", [(2, True), (239, True), (240, True), (241, False)])
def test_answer_plain_cap_is_inclusive(length, met):
    task = _task(ChecklistItem(kind="answer_contains", text="ok"), ChecklistItem(kind="answer_plain", max_chars=240))
    answer = ("ok " + "x" * 300)[:length]
    reward, verdicts = judge_trajectory(task, _traj(answer=answer))
    assert kinds(verdicts, "answer_plain") == [met] and reward == (1.0 if met else 0.5)


@pytest.mark.parametrize("answer", ['[{"id": "o-1"}]', '["o-1", "o-2"]', 'Here: {"total": "1.00"}', "   "])
def test_answer_plain_refuses_pasted_json_and_empty_answers(answer):
    task = _task(ChecklistItem(kind="answer_plain", max_chars=240))
    assert kinds(judge_trajectory(task, _traj(answer=answer))[1], "answer_plain") == [False]


def test_answer_plain_accepts_brackets_that_are_not_json():
    task = _task(ChecklistItem(kind="answer_plain", max_chars=240))
    assert judge_trajectory(task, _traj(answer="Refund [approved] {soon}: 42.50"))[0] == 1.0


# -- end_state --------------------------------------------------------------------------------

def test_end_state_missing_table_fails_and_a_changed_table_fails():
    world = make_world("shop", 3)
    digests = table_digests(world.query)
    good = _task(ChecklistItem(kind="end_state", digests=digests))
    assert judge_trajectory(good, _traj(), world=world)[0] == 1.0
    missing = _task(ChecklistItem(kind="end_state", digests={**digests, "no_such_table": "0" * 16}))
    reward, verdicts = judge_trajectory(missing, _traj(), world=world)
    assert kinds(verdicts, "end_state") == [False] and reward == 0.5  # failed, not skipped
    order = world.rows("SELECT id FROM orders WHERE status = 'placed'")[0]["id"]
    world.call("cancel_order", {"order_id": order})
    assert kinds(judge_trajectory(good, _traj(), world=world)[1], "end_state") == [False]
    assert kinds(judge_trajectory(good, _traj(), world=None)[1], "end_state") == [None]  # rehearsal: no world


# -- the reward's arithmetic ------------------------------------------------------------------

@pytest.mark.parametrize("world_name", ["shop", "calendar", "bank"])
def test_a_do_nothing_run_scores_zero_real_and_rehearsal_judged(world_name):
    for task in load_tasks(world_name, "test", limit=8):
        world = make_world(world_name, task.env.seed)
        assert judge_trajectory(task, _traj(answer=""), world=world)[0] == 0.0, task.id
        assert judge_trajectory(task, _traj(answer=""))[0] == 0.0, task.id
        assert judge_trajectory(task, _traj(answer="I could not do that."))[0] == 0.0, task.id


def test_a_met_guard_adds_no_credit_and_each_failed_guard_halves():
    items = [ChecklistItem(kind="answer_contains", text="42.50"), ChecklistItem(kind="answer_contains", text="o-9"),
             ChecklistItem(kind="answer_plain", max_chars=50),
             ChecklistItem(kind="answer_excludes", texts=["17.00"])]
    task = _task(*items)
    assert judge_trajectory(task, _traj(answer="Refund 42.50."))[0] == 0.5  # guards met: still 1 of 2
    assert judge_trajectory(task, _traj(answer="Refund 42.50 (was 17.00)."))[0] == 0.25
    assert judge_trajectory(task, _traj(answer="Refund 42.50 for o-9, not 17.00" + "!" * 40))[0] == 0.25
    assert judge_trajectory(task, _traj(answer="Refund 42.50 for o-9."))[0] == 1.0


# -- writes against the reference ---------------------------------------------------------------

REF = Reference(calls=[ToolCall(name="get_order", arguments={"order_id": "o-1"}), cancel("o-1")], answer="done")


@pytest.mark.parametrize("calls, met", [
    ([cancel("o-1")], True),
    ([ToolCall(name="get_order", arguments={"order_id": "o-7"}), cancel("o-1")], True),  # reads are free
    ([cancel("o-1", notify=True)], True),  # the schema's default, said out loud
    ([cancel("o-1"), cancel("o-2")], False),  # an extra write
    ([cancel("o-2"), cancel("o-1")], False),
    ([cancel("o-1", reason="x")], False),  # an unpinned argument added
    ([cancel("o-1", notify=False)], False),  # a flag no state stores
    ([], False),  # the reference's write not made
    ([(cancel("o-1"), OK), (cancel("o-1"), '{"error": {"code": "ALREADY_CANCELLED", "message": "m"}}')], True),
])
def test_writes_guard_rehearsal_judged(calls, met):
    task = _task(ChecklistItem(kind="called", tool="cancel_order", args={"order_id": "o-1"}), reference=REF)
    reward, verdicts = judge_trajectory(task, _traj(calls))
    assert kinds(verdicts, "writes") == [met]
    assert (reward == 1.0) == met


def test_free_arguments_and_declared_write_tools():
    free = REF.model_copy(update={"free_args": {"cancel_order": ["reason"]}})
    task = _task(reference=free)
    assert kinds(judge_trajectory(task, _traj([cancel("o-1", reason="moved")]))[1], "writes") == [True]
    # write_tools overrides annotations: get_order declared a write is compared too
    both = REF.model_copy(update={"write_tools": ["get_order", "cancel_order"]})
    extra_read = [ToolCall(name="get_order", arguments={"order_id": "o-1"}), ToolCall(name="get_order", arguments={"order_id": "o-7"}),
                  cancel("o-1")]
    assert kinds(judge_trajectory(_task(reference=both), _traj(extra_read))[1], "writes") == [False]
    # a tool without annotations is a write
    plain_read = {**READ}
    plain_read.pop("annotations")
    assert kinds(judge_trajectory(_task(reference=REF, tools=(plain_read, WRITE)), _traj(extra_read))[1], "writes") == [False]


def test_no_reference_no_writes_guard_and_it_says_so():
    task = _task(ChecklistItem(kind="called", tool="cancel_order", args={"order_id": "o-1"}))
    _, verdicts = judge_trajectory(task, _traj([cancel("o-1"), cancel("o-2")]))
    assert kinds(verdicts, "writes") == []
    assert unguarded_writes(task) == ["cancel_order"]
    assert "1 of 1 tasks" in unguarded_warning([task])
    assert unguarded_writes(_task(reference=REF)) == [] and unguarded_warning([_task(reference=REF)]) is None


def test_tool_writes_reads_mcp_annotations():
    assert tool_writes(READ) is False and tool_writes(ToolSpec.model_validate(READ)) is False
    assert tool_writes(WRITE) is True
    assert tool_writes({**WRITE, "annotations": {"destructiveHint": False}}) is True  # additive, still a write
    assert tool_writes({**WRITE, "annotations": {"readOnlyHint": False}}) is True
    assert tool_writes({**WRITE, "annotations": {"readOnlyHint": "yes"}}) is True  # only true says read-only
    assert tool_writes(None) is True


def _replay(task, calls, answer):
    """Play ``calls`` on the task's real world; the trajectory and that world."""
    world = make_world(task.env.world, task.env.seed)
    pairs = [(c, json.dumps(world.call(c.name, c.arguments))) for c in calls]
    return _traj(pairs, answer, source="real"), world


def test_real_world_write_then_undo_and_an_unstored_flag_fail():
    task = next(t for t in load_tasks("calendar", "test") if [c.name for c in t.reference.calls][-1:] == ["cancel_event"])
    ref = list(task.reference.calls)
    traj, world = _replay(task, ref, task.reference.answer)
    assert judge_trajectory(task, traj, world=world)[0] == 1.0
    flipped = [*ref[:-1], ToolCall(name="cancel_event", arguments={**ref[-1].arguments, "notify_attendees": False})]
    traj, world = _replay(task, flipped, task.reference.answer)
    reward, verdicts = judge_trajectory(task, traj, world=world)
    assert kinds(verdicts, "end_state") == [True] and kinds(verdicts, "writes") == [False] and reward < 1.0
    bank = next(t for t in load_tasks("bank", "test") if not any(c.name.endswith("freeze_card") for c in t.reference.calls))
    card = make_world("bank", bank.env.seed).rows("SELECT id FROM cards WHERE status = 'active'")[0]["id"]
    undo = [ToolCall(name="freeze_card", arguments={"card_id": card}), ToolCall(name="unfreeze_card", arguments={"card_id": card})]
    traj, world = _replay(bank, [*bank.reference.calls, *undo], bank.reference.answer)
    reward, verdicts = judge_trajectory(bank, traj, world=world)
    assert kinds(verdicts, "end_state") == [True] and kinds(verdicts, "writes") == [False] and reward < 1.0
    assert judge_trajectory(bank, traj)[0] < 1.0  # and rehearsal-judged


# -- answer_excludes ----------------------------------------------------------------------------

@pytest.mark.parametrize("answer, met", [("A 1.00", True), ("A 1.00 B 2.00", True), ("A 1.00 B 2.00 C 3.00", False)])
def test_answer_excludes_allows_exactly_max_found(answer, met):
    task = _task(ChecklistItem(kind="answer_excludes", texts=["1.00", "2.00", "3.00"], max_found=2))
    assert kinds(judge_trajectory(task, _traj(answer=answer))[1], "answer_excludes") == [met]


def test_excludes_are_derived_from_a_reference_with_recorded_results():
    products = {"results": [{"id": "p-1", "name": "Desk Lamp", "price": "35.98"},
                            {"id": "p-2", "name": "Floor Lamp", "price": "79.00"},
                            {"id": "p-3", "name": "Night Light", "price": "12.49"}]}
    ref = Reference(calls=[{"name": "search", "arguments": {"query": "lamp"}, "result": products}],
                    answer="The Desk Lamp costs $35.98.", write_tools=[])
    task = Task(id="t", instruction="How much is the Desk Lamp?", checklist=[ChecklistItem(kind="answer_contains", text="35.98")],
                reference=ref)
    assert judge_trajectory(task, _traj(answer="The Desk Lamp costs 35,98 €."))[0] == 1.0
    reward, verdicts = judge_trajectory(task, _traj(answer="Desk Lamp 35.98, Floor Lamp 79.00, Night Light 12.49"))
    assert kinds(verdicts, "answer_excludes")[0] is False and reward == 0.5


# -- numbers and text ---------------------------------------------------------------------------

@pytest.mark.parametrize("answer", ["35,98", "35.98", "$35.98", "35,98 €", "USD 35.980", "３５．９８", "-35.98"])
def test_numbers_compare_as_numbers(answer):
    assert mentions(f"Refund: {answer}.", "35.98")


@pytest.mark.parametrize("answer", ["1.234,50", "1,234.50", "1 234,50", "1\u202f234,50", "1'234.50", "1234.5"])
def test_thousands_in_any_locale(answer):
    assert mentions(f"Total {answer}", "1234.50") and mentions(f"Total {answer}", "1,234.50")


@pytest.mark.parametrize("answer, value", [("135.98", "35.98"), ("35.981", "35.98"), ("o-17", "o-1"), ("2026-05-03", "5"),
                                           ("order o-17.", "17"), ("1.2.3", "1.2")])
def test_no_match_inside_longer_numbers_or_ids(answer, value):
    assert not mentions(answer, value)


def test_text_compares_after_unicode_normalisation():
    assert mentions("MAIN STRASSE 5", "Main Straße") and mentions("ｃａｆｅ", "cafe")
    assert mentions("Tracking: 1Z999AA1.", "1z999aa1") and not mentions("1Z999AA10", "1Z999AA1")
    assert as_number("1,234") == as_number("1.234") == {Decimal("1234"), Decimal("1.234")}  # ambiguous: both


# -- called -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("answer, met", [
    (OK, True), ('{"error": {"code": "ORDER_NOT_CANCELLABLE", "message": "m"}}', True),  # the tool ran and refused
    ('{"error": {"code": "TOOL_EXECUTION_ERROR", "message": "boom"}}', False),
    ('{"error": {"code": "ENVIRONMENT_ERROR", "message": "server exited"}}', False),
    ('{"error": {"code": "INVALID_PARAMETERS", "message": "m"}}', False),
])
def test_called_needs_a_call_that_ran(answer, met):
    task = _task(ChecklistItem(kind="called", tool="cancel_order", args={"order_id": "o-1"}))
    assert judge_trajectory(task, _traj([(cancel("o-1"), answer)]))[0] == (1.0 if met else 0.0)


@pytest.mark.parametrize("actual, met", [
    ({"filter": {"status": "open", "team": "ops"}, "limit": 5}, True),
    ({"filter": {"status": "open"}}, True),
    ({"filter": {"status": "closed", "team": "ops"}}, False),
    ({"filter": {"team": "ops"}}, False),
    ({"filter": "open"}, False),
])
def test_called_nested_arguments_match_as_a_subset(actual, met):
    item = ChecklistItem(kind="called", tool="search", args={"filter": {"status": "open"}})
    task = _task(item, tools=())
    assert judge_trajectory(task, _traj([ToolCall(name="search", arguments=actual)]))[0] == (1.0 if met else 0.0)
    listed = ChecklistItem(kind="called", tool="search", args={"items": [{"sku": "a"}, {"sku": "b"}]})
    call = ToolCall(name="search", arguments={"items": [{"sku": "a", "n": 1}, {"sku": "b", "n": 2}]})
    assert judge_trajectory(_task(listed, tools=()), _traj([call]))[0] == 1.0


# -- reference progress (off by default) --------------------------------------------------------------

def test_reference_progress_pays_partial_progress_only_when_asked():
    ref = Reference(calls=[ToolCall(name="get_order", arguments={"order_id": "o-1"}),
                           ToolCall(name="get_order", arguments={"order_id": "o-2"}), cancel("o-1")], answer="done")
    task = _task(ChecklistItem(kind="called", tool="cancel_order", args={"order_id": "o-1"}), reference=ref)
    two = _traj(ref.calls[:2])
    assert judge_trajectory(task, two)[0] == 0.0
    # 2 of 3 reference calls, at weight 0.5; halved, as the reference's write was not made
    assert judge_trajectory(task, two, progress_weight=0.5)[0] == pytest.approx(0.5 * 2 / 3 * 0.5)
    assert judge_trajectory(task, _traj(answer=""), progress_weight=0.5)[0] == 0.0
    assert judge_trajectory(task, _traj(ref.calls), progress_weight=0.5)[0] == 1.0
    # out of order counts only the in-order part; crashed calls count nothing
    assert judge_trajectory(task, _traj(ref.calls[1:2]), progress_weight=1.0)[0] < 1.0
    crashed = [(c, '{"error": {"code": "ENVIRONMENT_ERROR", "message": "m"}}') for c in ref.calls[:2]]
    assert judge_trajectory(task, _traj(crashed), progress_weight=0.5)[0] == 0.0
    # progress never makes an unsolved episode "solved", and guards still halve it
    assert judge_trajectory(task, _traj([*ref.calls[:2], cancel("o-9")]), progress_weight=1.0)[0] < 0.5


def test_hostile_recorded_results_neither_raise_nor_stall():
    """Recorded results come from task files: deep nesting, non-finite numbers and long lists are
    walked within bounds."""
    import time

    deep: dict = {"a": "deepest value"}
    for _ in range(300):
        deep = {"x": [deep]}
    many = {"rows": [{"id": f"r-{i}", "v": f"{i}.50"} for i in range(5000)]}
    odd = {"rows": [{"v": float("nan")}, {"v": float("inf")}, {"v": 10 ** 30}, {"v": "x" * 10_000}]}
    ref = Reference(calls=[{"name": "q", "arguments": {}, "result": r} for r in (deep, many, odd)], answer="r-7 is 7.50",
                    write_tools=[])
    task = Task(id="t", instruction="x", checklist=[ChecklistItem(kind="answer_contains", text="7.50")], reference=ref)
    start = time.perf_counter()
    assert judge_trajectory(task, _traj(answer="r-7 is 7.50"))[0] == 1.0
    reward, verdicts = judge_trajectory(task, _traj(answer="r-7 is 7.50, r-8 is 8.50 " * 50))
    assert reward < 1.0 and kinds(verdicts, "answer_excludes")[0] is False
    assert time.perf_counter() - start < 10
