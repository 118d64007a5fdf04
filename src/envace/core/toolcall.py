"""Strict parsing of model output: ``<tool_call>`` blocks from the caller and
``<execution_result>`` blocks from the simulator. Never raises on model output, and runs in time
linear in it (tags are found with ``str.find``, not a lazy regex that rescans from every
unclosed tag); JSON goes through :mod:`envace.core.safejson`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from envace.core import safejson
from envace.core.types import ToolCall

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<execution_result>", "</execution_result>"


def _blocks(text: str, open_tag: str, close_tag: str) -> tuple[list[str], str, bool]:
    """Bodies of the ``open ... close`` blocks, the text outside them, and whether a tag was left
    unmatched (an open without a close, a close without an open, an open inside a block)."""
    bodies: list[str] = []
    outside: list[str] = []
    stray = False
    i = 0
    while True:
        start = text.find(open_tag, i)
        if start < 0:
            outside.append(text[i:])
            break
        outside.append(text[i:start])
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            outside.append(text[start:])
            stray = True
            break
        body = text[start + len(open_tag):end]
        if open_tag in body:
            stray = True
        bodies.append(body)
        i = end + len(close_tag)
    rest = "".join(outside)
    if close_tag in rest:
        stray = True
    return bodies, rest, stray


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
    obj, why = safejson.loads(body)
    if why is not None:
        return f"tool call is not valid JSON: {why}" if not why.startswith("not valid JSON") else f"tool call is {why}"
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
    text = safejson.clean_text(text)
    if "<tool_call" not in text and CALL_CLOSE not in text:
        return ParsedTurn(content=text.strip())
    calls: list[ToolCall] = []
    problems: list[str] = []
    bodies, rest, stray = _blocks(text, CALL_OPEN, CALL_CLOSE)
    for body in bodies:
        parsed = _parse_call_json(body.strip())
        if isinstance(parsed, str):
            if parsed not in problems:
                problems.append(parsed)
        else:
            calls.append(parsed)
    if stray or "<tool_call" in rest:
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
    text = safejson.clean_text(text)
    start = text.find(RESULT_OPEN)
    end = text.find(RESULT_CLOSE, start + len(RESULT_OPEN)) if start >= 0 else -1
    if start < 0 or end < 0:
        body = text.replace(RESULT_OPEN, "").strip()[:max_chars]
        return ParsedResult(ok=False, text=body, error="no complete <execution_result> block")
    body = text[start + len(RESULT_OPEN):end].strip()
    value, why = safejson.loads(body)
    if why is not None:
        return ParsedResult(ok=False, text=body[:max_chars], error=f"result is not valid JSON: {why}")
    return ParsedResult(ok=True, value=value, text=json.dumps(value, ensure_ascii=False))


def format_execution_result(value: Any) -> str:
    return f"{RESULT_OPEN}{json.dumps(value, ensure_ascii=False)}{RESULT_CLOSE}"
