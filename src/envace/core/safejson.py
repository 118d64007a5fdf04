"""JSON from model output, parsed so that nothing in it can raise, hang, or poison what follows.

``json.loads`` alone accepts what later breaks a run: ``NaN``/``Infinity`` and ``1e999`` (not JSON
numbers a real API sends), lone surrogate escapes (``"\\udc00"``: the tokenizer and the UTF-8
trajectory writer both choke on them), integers past Python's digit limit (``ValueError``) and
deep nesting (``RecursionError``, and records the writer cannot serialise). :func:`loads` rejects
all of them with a reason, in time linear in the text.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 32  # far deeper than any tool argument or result; records stay writable
MAX_INT_DIGITS = 100


class _Rejected(ValueError):
    pass


def _constant(name: str) -> Any:
    raise _Rejected(f"{name} is not a JSON number")


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Rejected(f"an integer of more than {MAX_INT_DIGITS} digits")
    return int(text)


def nesting_depth(text: str) -> int:
    """The deepest ``[``/``{`` nesting outside strings, in one pass (no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def problem(value: Any, depth: int = 0) -> str | None:
    """What a parsed value holds that JSON-out cannot carry (iteratively bounded by MAX_DEPTH)."""
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH}"
    if isinstance(value, float) and not math.isfinite(value):
        return "numbers must be finite"
    if isinstance(value, str):
        return None if is_utf8(value) else "strings must be valid UTF-8 (no lone surrogates)"
    if isinstance(value, dict):
        for k, v in value.items():
            if (p := problem(k, depth + 1)) or (p := problem(v, depth + 1)):
                return p
    elif isinstance(value, list):
        for v in value:
            if p := problem(v, depth + 1):
                return p
    return None


def is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def clean_text(text: str) -> str:
    """Text safe to tokenize and write: lone surrogates become U+FFFD."""
    if is_utf8(text):
        return text
    return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)


def loads(text: str) -> tuple[Any, str | None]:
    """``(value, None)``, or ``(None, why)`` when the text is not JSON a tool could have sent."""
    # The character scan only when the brackets could nest that deep at all (a hot path).
    if text.count("[") + text.count("{") > MAX_DEPTH and nesting_depth(text) > MAX_DEPTH:
        return None, f"nested deeper than {MAX_DEPTH}"
    try:
        value = json.loads(text, parse_constant=_constant, parse_int=_integer)
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg} at column {e.colno})"
    except _Rejected as e:
        return None, str(e)
    except (ValueError, RecursionError, TypeError) as e:
        return None, f"not valid JSON ({type(e).__name__})"
    why = problem(value)
    return (None, why) if why else (value, None)
