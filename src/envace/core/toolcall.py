"""Strict parsing of model output: ``<tool_call>`` blocks from the caller and
``<execution_result>`` blocks from the simulator. Never raises on model output."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from envace.core.types import ToolCall

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<execution_result>", "</execution_result>"

_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_RESULT_BLOCK = re.compile(r"<execution_result>(.*?)</execution_result>", re.DOTALL)


@dataclass
class ParsedTurn:
    """A caller turn. ``error`` is set when the turn tried to call a tool but the call is malformed;
    a turn with no call attempt at all is a final answer."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None

    @property
    def attempted_call(self) -> bool:
        return bool(self.calls) or self.error is not None

    @property
    def is_final(self) -> bool:
        return not self.attempted_call


def _parse_call_json(body: str) -> ToolCall | str:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return f"tool call is not valid JSON ({e.msg} at column {e.colno})"
    if not isinstance(obj, dict):
        return "tool call must be a JSON object with 'name' and 'arguments'"
    extra = set(obj) - {"name", "arguments"}
    if extra:
        return f"unexpected keys in tool call: {sorted(extra)}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return "tool call needs a non-empty string 'name'"
    args: Any = obj.get("arguments", {})
    if not isinstance(args, dict):
        return "'arguments' must be a JSON object"
    return ToolCall(name=name, arguments=args)


def parse_tool_calls(text: str) -> ParsedTurn:
    """Parse every ``<tool_call>{"name":..,"arguments":{..}}</tool_call>`` in ``text``.

    Any malformed block (bad JSON, missing close tag, stray tag) makes the whole turn an
    INVALID_TOOL_CALL_FORMAT error: executing half of what the model meant would be worse.
    """
    if not isinstance(text, str):
        return ParsedTurn(content="", error="model output is not text")
    if "<tool_call" not in text and CALL_CLOSE not in text:
        return ParsedTurn(content=text.strip())
    calls: list[ToolCall] = []
    problems: list[str] = []
    for m in _CALL_BLOCK.finditer(text):
        parsed = _parse_call_json(m.group(1).strip())
        if isinstance(parsed, str):
            problems.append(parsed)
        else:
            calls.append(parsed)
    rest = _CALL_BLOCK.sub("", text)
    if "<tool_call" in rest or CALL_CLOSE in rest:
        problems.append("unterminated or stray <tool_call> tag")
    content = rest.strip()
    if problems:
        return ParsedTurn(content=content, calls=[], error="; ".join(problems))
    return ParsedTurn(content=content, calls=calls)


def format_tool_call(call: ToolCall) -> str:
    return f"{CALL_OPEN}\n{json.dumps({'name': call.name, 'arguments': call.arguments}, ensure_ascii=False)}\n{CALL_CLOSE}"


@dataclass
class ParsedResult:
    """A simulator turn. ``value`` is the JSON result when ``ok``; ``text`` is what the caller sees."""

    ok: bool
    value: Any = None
    text: str = ""
    error: str | None = None


def parse_execution_result(text: str, max_chars: int = 2000) -> ParsedResult:
    """Take the first ``<execution_result>`` block; its body must be JSON.

    When it is not, the caller still sees the simulator's raw text (a broken world model is part of
    what the caller must cope with), and ``ok`` is False so a format reward can act on it.
    """
    if not isinstance(text, str):
        return ParsedResult(ok=False, text="", error="simulator output is not text")
    m = _RESULT_BLOCK.search(text)
    if m is None:
        body = text.replace(RESULT_OPEN, "").strip()[:max_chars]
        return ParsedResult(ok=False, text=body, error="no complete <execution_result> block")
    body = m.group(1).strip()
    try:
        value = json.loads(body)
    except json.JSONDecodeError as e:
        return ParsedResult(ok=False, text=body[:max_chars], error=f"result is not valid JSON ({e.msg})")
    return ParsedResult(ok=True, value=value, text=json.dumps(value, ensure_ascii=False))


def format_execution_result(value: Any) -> str:
    return f"{RESULT_OPEN}{json.dumps(value, ensure_ascii=False)}{RESULT_CLOSE}"
