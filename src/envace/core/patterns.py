"""Regex ``pattern``s in tool schemas are run by jsonschema on every call's arguments; a pattern
that backtracks catastrophically would stall every call of its tool. These are refused where
tasks are read (core.types) and reported by ``envace tasks validate``."""

from __future__ import annotations

import re
from typing import Any

# A repeated group whose content starts with a repeated atom: (a+)+, (\w+\s?)* ... the shapes whose
# backtracking grows exponentially on a near-miss. A group that starts with a fixed delimiter, like
# (-[a-z]+)*, splits unambiguously and passes.
_NESTED_QUANTIFIER = re.compile(r"\((?:\?:)?(?:\\.|\[(?:[^\]\\]|\\.)*\]|[^()\\|])[+*{](?:[^()\\]|\\.)*\)[+*{]")
_ALTERNATION_REPEATED = re.compile(r"\((?:[^()\\]|\\.)*\|(?:[^()\\]|\\.)*\)[+*{]")
MAX_PATTERN = 1000


def unsafe_pattern(pattern: str) -> str | None:
    """Why a regex could stall a call (catastrophic backtracking), or None."""
    if len(pattern) > MAX_PATTERN:
        return f"pattern longer than {MAX_PATTERN} characters"
    try:
        re.compile(pattern)
    except re.error as e:
        return f"not a valid regular expression ({e})"
    if _NESTED_QUANTIFIER.search(pattern):
        return "a repeated group that itself repeats (like (a+)+) can backtrack catastrophically"
    if _ALTERNATION_REPEATED.search(pattern):
        alts = re.search(r"\(([^()]*)\)[+*{]", pattern)
        if alts and _overlapping(alts.group(1).split("|")):
            return "a repeated alternation whose branches overlap (like (a|aa)*) can backtrack catastrophically"
    return None


def _overlapping(branches: list[str]) -> bool:
    firsts = [b[:1] for b in branches if b]
    return len(firsts) != len(set(firsts)) or any(b == "" for b in branches)




def schema_patterns(schema: Any, where: str = "") -> list[tuple[str, str]]:
    """(path, pattern) of every ``pattern`` keyword in a JSON schema."""
    out = []
    if isinstance(schema, dict):
        for k, v in schema.items():
            if k == "pattern" and isinstance(v, str):
                out.append((where, v))
            else:
                out += schema_patterns(v, f"{where}.{k}" if where else k)
    elif isinstance(schema, list):
        for i, v in enumerate(schema):
            out += schema_patterns(v, f"{where}[{i}]")
    return out
