"""The fields of a tool response that matter: ids, amounts, counts, status.

One small rule, shared by the world-model fidelity metrics and the rule-based rehearsal memory:
a key matters when it is ``id`` or ends in ``_id``, or when one of its ``_``-separated words is
an amount/count/status word (``amount``, ``price``, ``total``, ``subtotal``, ``balance``,
``refund``, ``count``, ``status``), so ``unit_price``, ``line_total``, ``item_count`` and
``to_balance_after`` all count. Only scalar values are fields; containers are walked into.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

VALUE_WORDS = frozenset({"amount", "price", "total", "subtotal", "balance", "refund", "count", "status"})

FieldKey = tuple[str, tuple[str, Any]]  # (path without list indices, normalised value)


def key_matters(key: str) -> bool:
    k = str(key).lower()
    if k == "id" or k.endswith("_id"):
        return True
    return any(word in VALUE_WORDS for word in k.split("_"))


def normalise(value: Any) -> tuple[str, Any]:
    """A comparable form: numbers and numeric strings ("42.50", 42.5) compare as numbers."""
    if isinstance(value, bool):
        return ("bool", value)
    if value is None:
        return ("null", None)
    if isinstance(value, (int, float)):
        return ("num", round(float(value), 6)) if math.isfinite(float(value)) else ("str", str(value))
    if isinstance(value, str):
        try:
            number = float(value.strip().lstrip("$"))
        except ValueError:
            return ("str", value.strip())
        if math.isfinite(number):
            return ("num", round(number, 6))
        return ("str", value.strip())
    return ("str", json.dumps(value, sort_keys=True))


def iter_fields(value: Any, path: str = ""):
    """Yield (path, key, raw value) of every field that matters, depth first, in document order."""
    if isinstance(value, dict):
        for k, v in value.items():
            sub = f"{path}.{k}" if path else str(k)
            if isinstance(v, (dict, list)):
                yield from iter_fields(v, sub)
            elif key_matters(k):
                yield sub, str(k), v
    elif isinstance(value, list):
        for v in value:
            yield from iter_fields(v, path)


def important_fields(value: Any) -> Counter[FieldKey]:
    """A multiset of (path, normalised value) of the fields that matter, list order ignored.

    Paths join keys with dots and skip list indices (``results.product_id``), so a rehearsal that
    lists the same items in another order still matches, while an invented extra item does not.
    """
    return Counter((path, normalise(v)) for path, _, v in iter_fields(value))


def field_summary(value: Any, limit: int = 4) -> str:
    """``product_id=p-656, price=17.99``: the first few fields that matter, for a memory line."""
    parts: list[str] = []
    for _, key, v in iter_fields(value):
        text = f"{key}={json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v}"
        if text not in parts:
            parts.append(text)
        if len(parts) >= limit:
            break
    return ", ".join(parts)
