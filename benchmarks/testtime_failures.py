"""Why the committed run failed without rehearsal, and whether a rehearsal could have shown it
(issue #20: test-time rehearsal did not pay; this says what a memory could act on).

    python benchmarks/testtime_failures.py OUT/trained [OUT/warm ...]

OUT: an `envace eval --sweep` directory (committed.jsonl, rehearsals.jsonl). For each task the
no-rehearsal run (condition ``none``) failed, the first failure that explains it, in this order:

* ``malformed``: a tool call that did not parse;
* ``tool error``: a real tool answered with an error;
* ``wrong pick``: a required call was made with other arguments, though the right value was in a
  real result of the same episode (e.g. it read the event list and took another id);
* ``other call``: another tool-side check unmet (a call never made, a value it was never shown);
* ``answer only``: every tool-side check met, the answer wrong.

Then, for solved and failed tasks alike, whether the task's first rehearsal (attempt 0 of the
widest parallel rehearsal) *showed* a problem the agent could read: a malformed call or an
imagined error result. A memory can only act on what the rehearsal shows.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

from envace.core import safejson
from envace.core.errors import is_error
from envace.core.jsonl import read_jsonl_dicts
from per_template import CALL_CHECKS  # the tool-side checks, as per_template.py --failures counts them

KINDS = ("malformed", "tool error", "wrong pick", "other call", "answer only")


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise SystemExit(f"{path}: not found (an `envace eval --sweep` output directory?)")
    try:
        return read_jsonl_dicts(path)  # a bad line: its file and line number, not a traceback
    except ValueError as e:
        raise SystemExit(str(e)) from None


def _values(x: Any) -> list[str]:
    """The string and number leaves of a JSON value, as strings."""
    if isinstance(x, dict):
        return [v for y in x.values() for v in _values(y)]
    if isinstance(x, list):
        return [v for y in x for v in _values(y)]
    if isinstance(x, bool) or x is None:
        return []
    return [str(x)]


def _tool_results(traj: dict[str, Any]) -> list[Any]:
    return [safejson.loads(m.get("content", ""))[0] for m in traj["messages"] if m["role"] == "tool"]


def failure_kind(traj: dict[str, Any]) -> str:
    """The first of :data:`KINDS` that explains a failed trajectory (see the module docstring)."""
    if traj.get("parse_failures", 0) > 0:
        return "malformed"
    results = _tool_results(traj)
    if any(is_error(r) for r in results):
        return "tool error"
    unmet = [v for v in traj.get("verdicts", []) if not v["met"] and v["item"]["kind"] in CALL_CHECKS]
    if not unmet:
        return "answer only"
    shown = {v for r in results if r is not None and not is_error(r) for v in _values(r)}
    called = {c["name"] for m in traj["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []}
    for v in unmet:
        item = v["item"]
        if (item["kind"] == "called" and item.get("tool") in called
                and any(a in shown for a in _values(item.get("args", {})))):
            return "wrong pick"
    return "other call"


def showed_problem(traj: dict[str, Any]) -> bool:
    """The rehearsal holds something the agent could see go wrong: a malformed call or an imagined error."""
    return traj.get("parse_failures", 0) > 0 or any(is_error(r) for r in _tool_results(traj))


def report(out: Path) -> str:
    committed = _rows(out / "committed.jsonl")
    base = {r["task_id"]: r for r in committed if r["condition"] == "none"}
    if not base:
        raise SystemExit(f"{out / 'committed.jsonl'}: no 'none' condition (run the sweep with budget 0)")
    first = {r["task_id"]: r["trajectory"] for r in _rows(out / "rehearsals.jsonl")
             if r["mode"] == "parallel" and r["attempt"] == 0}
    kinds: Counter[str] = Counter()
    flagged: Counter[str] = Counter()
    solved_flagged = solved = 0
    for tid, row in base.items():
        shown = tid in first and showed_problem(first[tid])
        if row["success"]:
            solved += 1
            solved_flagged += shown
            continue
        kind = failure_kind(row["trajectory"])
        kinds[kind] += 1
        flagged[kind] += shown
    failed = sum(kinds.values())
    lines = [f"{out}: {len(base)} tasks, {failed} failed without rehearsal; "
             f"rehearsals read: {len(first)} (attempt 0, parallel)",
             "| why the no-rehearsal run failed | tasks | its rehearsal showed a problem |", "|---|---|---|"]
    lines += [f"| {k} | {kinds[k]} | {flagged[k]} |" for k in KINDS]
    lines.append(f"| (solved: a false alarm) | {solved} | {solved_flagged} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("outs", nargs="+", type=Path, help="`envace eval --sweep` output directories")
    args = p.parse_args(argv)
    print("\n\n".join(report(o) for o in args.outs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
