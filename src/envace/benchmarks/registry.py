"""Name -> benchmark adapter: the one place that knows which benchmarks exist."""

from __future__ import annotations

from pathlib import Path

from envace.benchmarks.base import Adapter
from envace.benchmarks.bfcl import BFCLAdapter
from envace.benchmarks.finmcp import FinMCPAdapter
from envace.benchmarks.tau2 import Tau2Adapter
from envace.benchmarks.vitabench import VitaBenchAdapter


def _adapters() -> dict[str, Adapter]:
    return {a.name: a for a in (BFCLAdapter(), Tau2Adapter(), VitaBenchAdapter(), FinMCPAdapter())}


def benchmark_names() -> list[str]:
    return list(_adapters())


def get_adapter(name: str) -> Adapter:
    adapters = _adapters()
    try:
        return adapters[name]
    except KeyError:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(adapters)}") from None


def listing(data_dir: str | None = None) -> list[dict]:
    """What ``envace bench list`` shows: per benchmark, its categories, installed task counts,
    what it needs and what is not runnable here (and why)."""
    rows = []
    d = Path(data_dir) if data_dir else None
    for a in _adapters().values():
        ok, why = a.available(d)
        cats = []
        for c in a.categories():
            n = None
            try:
                n = a.count(c.name, d) if ok or c.runnable else None
            except Exception as e:  # a broken data file must not break the listing
                why_c = f"{c.reason}; count failed: {e}".strip("; ")
                cats.append({"name": c.name, "group": c.group, "runnable": False, "tasks": None, "reason": why_c})
                continue
            runnable = c.runnable and ok
            reason = c.reason if ok else "; ".join(x for x in (why, c.reason) if x)
            cats.append({"name": c.name, "group": c.group, "runnable": runnable, "tasks": n, "reason": reason})
        rows.append({"name": a.name, "title": a.title, "licence": a.licence, "available": ok, "status": why,
                     "needs": a.needs, "categories": cats})
    return rows
