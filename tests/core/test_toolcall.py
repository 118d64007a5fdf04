import json

from hypothesis import given, strategies as st

from envace.core.toolcall import (
    format_execution_result, format_tool_call, parse_execution_result, parse_tool_calls,
)
from envace.core.types import ToolCall

json_scalars = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=20) | \
    st.floats(allow_nan=False, allow_infinity=False, width=32)
json_values = st.recursive(json_scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3),
                           max_leaves=10)
calls = st.builds(ToolCall, name=st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
                  arguments=st.dictionaries(st.text(max_size=10), json_values, max_size=4))


@given(st.lists(calls, min_size=1, max_size=3), st.text(max_size=30).filter(lambda t: "<" not in t))
def test_round_trip_several_calls(cs, prefix):
    text = prefix + "\n".join(format_tool_call(c) for c in cs)
    parsed = parse_tool_calls(text)
    assert parsed.error is None
    assert parsed.calls == cs
    assert parsed.content == prefix.strip()


@given(st.text(max_size=300))
def test_garbage_never_raises(text):
    parsed = parse_tool_calls(text)
    assert parsed.calls == [] or parsed.error is None
    res = parse_execution_result(text)
    assert isinstance(res.text, str)


@given(st.text(alphabet="<>/{}\"tool_call:namearguments ,[]", max_size=200))
def test_tag_soup_never_raises(text):
    parse_tool_calls(text)
    parse_execution_result(text)


@given(calls, st.integers(1, 40))
def test_cut_off_mid_tag_is_a_format_error(call, cut):
    full = format_tool_call(call)
    text = full[: max(len("<tool_call"), len(full) - cut)]
    parsed = parse_tool_calls(text)
    assert parsed.calls == []
    assert parsed.error is not None and parsed.attempted_call


def test_plain_text_is_final_answer():
    p = parse_tool_calls("Your refund is 42.50 USD.")
    assert p.is_final and p.content == "Your refund is 42.50 USD."


def test_specific_format_errors():
    assert "not valid JSON" in parse_tool_calls("<tool_call>{name: x}</tool_call>").error
    assert "'arguments'" in parse_tool_calls('<tool_call>{"name": "x", "arguments": "a=1"}</tool_call>').error
    assert "unexpected keys" in parse_tool_calls('<tool_call>{"name": "x", "args": {}}</tool_call>').error
    assert "stray" in parse_tool_calls('</tool_call> hi').error
    # one good and one bad block: the whole turn is rejected rather than half executed
    mixed = format_tool_call(ToolCall(name="a", arguments={})) + "<tool_call>[1]</tool_call>"
    assert parse_tool_calls(mixed).calls == []


@given(json_values)
def test_execution_result_round_trip(value):
    res = parse_execution_result(format_execution_result(value))
    assert res.ok and res.value == value
    assert json.loads(res.text) == value


def test_execution_result_failures_keep_text():
    res = parse_execution_result("<execution_result>{oops</execution_result>")
    assert not res.ok and res.text == "{oops"
    res = parse_execution_result('<execution_result>{"a": 1}')
    assert not res.ok and "no complete" in res.error
