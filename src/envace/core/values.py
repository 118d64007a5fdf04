"""How an answer is compared with the values a task expects or forbids.

Numbers compare as numbers whatever the locale writes ("35,98", "35.98", "1.234,50",
"1,234.50", "1 234,50" and "$1,234.50" all state their amount); other text compares after
Unicode normalisation (NFKC, case folded, whitespace collapsed) and only as a whole token, so
"o-1" is not found in "o-17". Shared by the reward (``answer_contains`` / ``answer_excludes``)
and the task generators, which derive the values an answer must not contain from the results
the reference solution saw (``derive_excludes``).
"""

from __future__ import annotations

import math
import re
import unicodedata
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

from envace.core.types import ChecklistItem

# A run of digits with single separators between digit groups; a space (or no-break space) only
# groups thousands. Linear: each separator must be followed by digits, so nothing backtracks.
_NUMBER = re.compile(r"(?<![\w.,])(?<!\w-)\d+(?:(?:[.,']|[ \u00a0\u202f](?=\d{3}(?!\d)))\d+)*(?!\w)")
_GROUP_SEP = re.compile(r"['\u00a0\u202f ]")
_CURRENCY = "$€£¥₹₩¢"
MAX_TEXT = 100_000  # model output is arbitrary: compare within a bounded prefix
MAX_DEPTH = 32  # recorded results come from task files: walk no deeper than this
MAX_RECORDS = 200  # records of one kind compared with each other (quadratic): the first ones


def norm_text(text: str) -> str:
    """NFKC, case folded, whitespace collapsed: the form text is compared in."""
    text = unicodedata.normalize("NFKC", str(text)[:MAX_TEXT]).casefold()
    return " ".join(text.split())


def readings(token: str) -> set[Decimal]:
    """The amounts a number token can mean. "35,98" is 35.98; "1.234,50" and "1,234.50" are
    1234.5; "1,234" (one separator before exactly three digits) may be either 1234 or 1.234,
    so both; "1.2.3" is no number (empty)."""
    token = _GROUP_SEP.sub("", token)
    seps = [c for c in token if c in ".,"]
    groups = re.split(r"[.,]", token)
    try:
        if not seps:
            return {Decimal(token)}
        if len(set(seps)) == 2:
            dec = seps[-1]
            if seps.count(dec) != 1 or any(len(g) != 3 for g in groups[1:-1]) or len(groups[0]) > 3:
                return set()
            return {Decimal("".join(groups[:-1]) + "." + groups[-1])}
        if len(seps) == 1:
            whole, frac = groups
            out = {Decimal(f"{whole}.{frac}")}
            if len(frac) == 3 and len(whole) <= 3:
                out.add(Decimal(whole + frac))
            return out
        if len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:]):
            return {Decimal("".join(groups))}
    except InvalidOperation:
        pass
    return set()


def numbers_in(text: str) -> list[set[Decimal]]:
    """The readings of every number token in ``text`` (signs ignored: "-35.98" states 35.98)."""
    return [set(r) for r in _numbers(str(text))]


@lru_cache(maxsize=256)
def _numbers(text: str) -> tuple[frozenset[Decimal], ...]:
    # cached: one answer is searched for every value of a checklist
    return tuple(frozenset(r) for m in _NUMBER.finditer(norm_text(text)) if (r := readings(m.group())))


def as_number(text: str) -> set[Decimal]:
    """The readings of ``text`` when it is one number (currency signs, a sign and a trailing % are
    allowed around it); empty when it is anything else."""
    core = norm_text(text).strip(_CURRENCY + " ").lstrip("+-−").rstrip("%").strip(_CURRENCY + " ")
    m = _NUMBER.fullmatch(core)
    return readings(m.group()) if m else set()


def _has_token(haystack: str, needle: str) -> bool:
    """``needle`` occurs in ``haystack`` not as part of a longer word or number."""
    if not needle:
        return False
    start = haystack.find(needle)
    while start >= 0:
        end = start + len(needle)
        before = haystack[start - 1] if start else ""
        after = haystack[end] if end < len(haystack) else ""
        if not (needle[0].isalnum() and before.isalnum()) and not (needle[-1].isalnum() and after.isalnum()):
            return True
        start = haystack.find(needle, start + 1)
    return False


def mentions(answer: str, value: Any) -> bool:
    """Whether ``answer`` states ``value``: as a number when ``value`` is one, else as text."""
    if isinstance(value, bool) or value is None:
        return False
    text = str(value)
    number = as_number(text)
    if number:
        return any(r & number for r in _numbers(str(answer)))
    return _has_token(_norm_cached(str(answer)), norm_text(text))


@lru_cache(maxsize=256)
def _norm_cached(text: str) -> str:
    return norm_text(text)


# -- the values an answer must not contain ------------------------------------------------

def _distinctive(value: Any) -> bool:
    """A value specific enough that stating it means stating that record: ids, names, amounts,
    dates; not flags, small counts or one-letter codes."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, int):
        return abs(value) >= 10
    if isinstance(value, float):
        return math.isfinite(value) and (value != int(value) or abs(value) >= 10)
    if isinstance(value, str):
        text = norm_text(value)
        number = as_number(text)
        if number:
            return any(n != int(n) or abs(n) >= 10 for n in number)
        return len(text) >= 3
    return False


def _leaves(record: dict[str, Any], prefix: str = "", depth: int = 0) -> dict[str, Any]:
    """A record's scalar fields, nested objects flattened to ``a.b`` (lists are records of their own)."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            if depth < MAX_DEPTH:
                out.update(_leaves(value, f"{prefix}{key}.", depth + 1))
        elif not isinstance(value, list):
            out[f"{prefix}{key}"] = value
    return out


def _record_lists(value: Any, path: str = "", depth: int = 0) -> list[tuple[str, list[dict[str, Any]]]]:
    """Every list of objects inside a tool result (the result itself, when it is one), with
    where it sits (``.results[]``), so that lists from calls of the same tool can be pooled."""
    out: list[tuple[str, list[dict[str, Any]]]] = []
    if depth > MAX_DEPTH:
        return out
    if isinstance(value, list):
        records = [v for v in value if isinstance(v, dict)]
        if records:
            out.append((path, records))
        for v in value:
            out += _record_lists(v, path + "[]", depth + 1)
    elif isinstance(value, dict):
        for k, v in value.items():
            out += _record_lists(v, f"{path}.{k}", depth + 1)
    return out


def _pooled(results: list[tuple[str, Any]]) -> list[list[dict[str, Any]]]:
    """The records of ``(tool, result)`` pairs grouped by kind: the items of the lists at the same
    place in results of the same tool, and the results themselves of a tool called more than
    once (two ``get_product`` calls are two products)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for tool, result in results:
        if isinstance(result, dict):
            groups.setdefault((tool, "$"), []).append(result)
        for path, records in _record_lists(result):
            groups.setdefault((tool, path), []).extend(records)
    return [g[:MAX_RECORDS] for g in groups.values() if len(g) >= 2]


def _unique_mentions(flat: list[dict[str, Any]], i: int, answer: str) -> set[str]:
    """Keys of record ``i`` whose distinctive value the answer states and no other record shares
    (a value stated only inside another stated value, "checking" in "Everyday Checking", names
    nothing of its own)."""
    stated = {k: norm_text(str(v)) for k, v in flat[i].items() if _distinctive(v) and mentions(answer, v)}
    return {k for k, v in stated.items()
            if not any(v != u and v in u for u in stated.values())
            and not any(_same_value(o.get(k), flat[i][k]) for j, o in enumerate(flat) if j != i)}


def _excludable(value: Any, answer: str, plain: str, instruction: str, keep: list[str]) -> bool:
    text = "" if value is None else str(value)
    low = norm_text(text)
    return (_distinctive(value) and not mentions(answer, value) and not mentions(instruction, value)
            and low not in plain and not any(low in k or k in low for k in keep))


def derive_excludes(results: list[tuple[str, Any]], answer: str, must_contain: list[str] = (),
                    instruction: str = "", limit: int = 40) -> list[str]:
    """Values the reference solution saw that a right answer does not state: the other records'.

    ``results`` are the reference calls' ``(tool, result)``. Records of one kind (``_pooled``) that
    the reference ``answer`` names, by a distinctive value no other record of the kind shares,
    are the ones asked about; the fields by which it names them (a title, a price, an id) are
    what was asked for. The same fields of the other records of the kind are what a right answer
    leaves out: an answer listing every value seen states them. Values the answer or the
    instruction states, or that overlap a ``must_contain`` text, are never excluded.
    """
    plain = norm_text(answer)
    keep = [norm_text(t) for t in must_contain if t]
    out: dict[str, None] = {}
    for records in _pooled(results):
        flat = [_leaves(r) for r in records]
        keys_of = [_unique_mentions(flat, i, answer) for i in range(len(flat))]
        named = [i for i, keys in enumerate(keys_of) if keys]
        if not named or len(named) == len(flat):
            continue
        keys = set().union(*(keys_of[i] for i in named))
        # a value the named records hold in any field is theirs to state (a slot's end is the next one's start)
        theirs = {norm_text(str(v)) for i in named for v in flat[i].values()}
        for i, other in enumerate(flat):
            if i in named:
                continue
            for key in sorted(keys):
                value = other.get(key)
                if _excludable(value, answer, plain, instruction, keep) and norm_text(str(value)) not in theirs:
                    out[str(value)] = None
    return list(out)[:limit]


def derive_unasked(results: list[tuple[str, Any]], answer: str, must_contain: list[str] = (),
                   instruction: str = "", exclude: list[str] = (), limit: int = 40) -> list[str]:
    """Every other distinctive value the reference saw that its answer and the instruction do not
    state (ids, categories, dates, amounts of fields nobody asked about). A right answer may
    mention a few of them; an answer listing everything seen states most."""
    plain = norm_text(answer)
    keep = [norm_text(t) for t in must_contain if t]
    skip = {norm_text(t) for t in exclude}
    out: dict[str, None] = {}

    def walk(value: Any, depth: int = 0) -> None:
        if depth > MAX_DEPTH:
            return
        if isinstance(value, dict):
            for v in value.values():
                walk(v, depth + 1)
        elif isinstance(value, list):
            for v in value:
                walk(v, depth + 1)
        elif _excludable(value, answer, plain, instruction, keep) and norm_text(str(value)) not in skip:
            out[str(value)] = None

    for _, result in results:
        walk(result)
    return list(out)[:limit]


def unasked_allowance(n: int) -> int:
    """How many of ``n`` unasked values a right answer may state: a verbose reply names a few
    (a subtotal and a shipping fee beside the total), a value soup most of them."""
    return max(3, n // 2)


def excludes_items(results: list[tuple[str, Any]], answer: str, must_contain: list[str] = (),
                   instruction: str = "") -> list[ChecklistItem]:
    """``answer_excludes`` items from a reference's ``(tool, result)`` pairs and answer: the other
    records' values (none may be stated), and the values nobody asked for (a few may be)."""
    out = []
    others = derive_excludes(results, answer, must_contain, instruction)
    if others:
        out.append(ChecklistItem(kind="answer_excludes", texts=others))
    unasked = derive_unasked(results, answer, must_contain, instruction, exclude=others)
    allowed = unasked_allowance(len(unasked))
    if len(unasked) > allowed:
        out.append(ChecklistItem(kind="answer_excludes", texts=unasked, max_found=allowed))
    return out


def _same_value(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return False
    na, nb = as_number(str(a)), as_number(str(b))
    if na and nb:
        return bool(na & nb)
    return norm_text(str(a)) == norm_text(str(b))
