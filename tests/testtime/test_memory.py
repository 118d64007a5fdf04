import json

from envace.core.toolcall import format_tool_call
from envace.core.types import ToolCall
from envace.testtime.memory import (PLAN_HEADER, ModelMemoryWriter, RuleMemoryWriter, make_memory_writer, plan_memory,
                                    rule_memory, summary_problem, transcript)

from testtime_helpers import few_tasks, traj_of


def call(name, **args):
    return format_tool_call(ToolCall(name=name, arguments=args))


def _attempts():
    err = json.dumps({"error": {"code": "NOT_FOUND", "message": "No order o-77"}})
    ok = json.dumps({"order_id": "o-17", "status": "cancelled", "refund": {"amount": "42.50"}, "note": "x"})
    bad = json.dumps({"error": {"code": "INVALID_TOOL_CALL_FORMAT", "message": "tool call is not valid JSON"}})
    a1 = traj_of("t", [(call("cancel_order", order_id="o-77"), [err]), (call("cancel_order", order_id="o-17"), [ok])],
                 "Cancelled, refund 42.50")
    a2 = traj_of("t", [("<tool_call>{oops</tool_call>", [bad]), (call("cancel_order", order_id="o-17"), [ok])],
                 "Cancelled, refund 42.50")
    a3 = traj_of("t", [(call("cancel_order", order_id="o-77"), [err])], None)
    return [a1, a2, a3]


def test_rule_memory_lists_failures_successes_and_answer():
    text = rule_memory(_attempts())
    lines = text.splitlines()
    assert lines[0] == "3 imagined attempts."
    assert 'cancel_order {"order_id": "o-77"} -> NOT_FOUND (No order o-77) (2x)' in text
    assert "(malformed tool call) -> INVALID_TOOL_CALL_FORMAT" in text
    ok_line = next(line for line in lines if line.startswith('- cancel_order {"order_id": "o-17"}'))
    # the key fields of the imagined result: ids, status, amounts; not the other fields
    assert "order_id=o-17" in ok_line and "status=cancelled" in ok_line and "amount=42.50" in ok_line
    assert "note" not in ok_line and ok_line.endswith("(2x)")
    assert lines[-1] == 'Answer reached (2/3): "Cancelled, refund 42.50"'
    assert lines.index("Failed calls:") < lines.index("Calls that worked:")
    assert "No tool was called" not in text
    assert rule_memory(_attempts()) == text  # deterministic


def test_rule_memory_budget_and_empty_cases():
    assert rule_memory([]) == ""
    short = rule_memory(_attempts(), max_chars=120)
    assert len(short) <= 120 and short.startswith("3 imagined attempts.") and "Answer reached" in short
    none = rule_memory([traj_of("t", [], None)])
    assert none == "1 imagined attempt.\nNo tool was called in any attempt.\nNo attempt reached a final answer."
    [m] = RuleMemoryWriter().write([(few_tasks("shop", 1)[0], [])])
    assert m.text == "" and m.source == "none"


def test_plan_memory_keeps_only_the_working_calls_of_the_best_looking_attempt():
    a1, a2, a3 = _attempts()
    lookup = json.dumps({"order_id": "o-17", "status": "delivered"})
    # a1 and a2 both answered with one failed call; a4 answered with none: it is the plan
    a4 = traj_of("t", [(call("get_order", order_id="o-17"), [lookup]), (call("cancel_order", order_id="o-17"),
                 [json.dumps({"order_id": "o-17", "status": "cancelled"})])], "Done")
    text = plan_memory([a1, a4, a2, a3])
    assert text.splitlines() == [PLAN_HEADER, '1. get_order {"order_id": "o-17"}', '2. cancel_order {"order_id": "o-17"}']
    # nothing that failed, no imagined value, no answer
    assert "o-77" not in text and "delivered" not in text and "Done" not in text
    # a tie (one failure each, an answer each) goes to the latest attempt; no working call: no plan
    assert plan_memory([a1, a2]).splitlines()[1:] == ['1. cancel_order {"order_id": "o-17"}']
    assert plan_memory([a3]) == "" and plan_memory([]) == ""
    assert len(plan_memory([a4], max_chars=len(PLAN_HEADER) + 40).splitlines()) == 2
    [m] = make_memory_writer("plan").write([(few_tasks("shop", 1)[0], [a1, a4])])
    assert m.text == plan_memory([a1, a4]) and m.source == "rule"


def test_summary_checks_reject_garbage_and_accept_a_real_summary():
    task = few_tasks("shop", 1)[0]
    atts = _attempts()
    assert summary_problem("", task, atts) == "empty summary"
    assert summary_problem("ok", task, atts) == "summary too short"
    assert "tags" in summary_problem('<tool_call>{"name": "x"}</tool_call> and more words here', task, atts)
    assert summary_problem("the the the the the the the the the the the the the", task, atts) in (
        "summary repeats itself", "summary mentions no tool, id, error or answer of the rehearsals")
    assert "mentions no" in summary_problem("Lorem ipsum dolor sit amet consectetur", task, atts)
    assert summary_problem("search_products worked; order o-17 was cancelled, answer 42.50.", task, atts) is None
    assert summary_problem("Cancelling o-77 failed with NOT_FOUND; use o-17.", task, atts) is None


def test_model_writer_falls_back_to_rules_on_garbage(tiny_backend):
    task = few_tasks("shop", 1)[0]
    atts = _attempts()
    writer = ModelMemoryWriter(tiny_backend, max_new_tokens=12)
    [m, empty] = writer.write([(task, atts), (task, [])])
    assert empty.source == "none" and empty.text == ""
    assert m.tokens > 0 and m.raw is not None
    if m.source == "rule":  # the random tiny model writes garbage: the rule-based memory replaces it
        assert m.text == rule_memory(atts) and m.note.startswith("model summary rejected")
    assert writer.write([(task, atts)])[0].text == m.text  # greedy: deterministic
    assert "Attempt 3:" in transcript(atts) and "answer: Cancelled" in transcript(atts)
