"""Which tools change state: the one reading of it that the reward and the task checks share.

A tool schema may carry MCP tool annotations beside its function
(``{"type": "function", "function": {...}, "annotations": {"readOnlyHint": true}}``): MCP
servers report them in their listing, and a Python tool set or an embedded world declares them.
A task's ``reference.write_tools`` overrides them. A tool nobody says is read-only counts as a
write: guarding a read costs a stricter reward, leaving a write unguarded pays for side effects.
"""

from __future__ import annotations

from typing import Any

from envace.core.types import Task, ToolSpec


def tool_writes(schema: ToolSpec | dict[str, Any] | None) -> bool:
    """Whether a tool may change state. Only ``readOnlyHint: true`` says it does not
    (``destructiveHint: false`` still writes: it only says the write is additive)."""
    if isinstance(schema, ToolSpec):
        annotations = schema.annotations
    elif isinstance(schema, dict):
        annotations = schema.get("annotations")
    else:
        annotations = None
    return not (isinstance(annotations, dict) and annotations.get("readOnlyHint") is True)


def writes_of(task: Task) -> Any:
    """A predicate ``name -> bool``: does this task's tool ``name`` write? The reference's
    ``write_tools`` when given, else the tools' annotations; a tool the task does not list writes."""
    ref = task.reference
    if ref is not None and ref.write_tools is not None:
        declared = set(ref.write_tools)
        return lambda name: name in declared
    read_only = {t.name for t in task.tools if not tool_writes(t)}
    return lambda name: name not in read_only


def unguarded_writes(task: Task) -> list[str]:
    """The task's tools that write but that a rehearsal-judged reward cannot check: without a
    ``reference`` there is nothing to compare the episode's writes with, and rehearsal has no
    world whose state could show them. Empty when the task has a reference or no writing tool."""
    if task.reference is not None:
        return []
    writes = writes_of(task)
    return [t.name for t in task.tools if writes(t.name)]


def unguarded_warning(tasks: list[Task]) -> str | None:
    """One line for ``tasks validate`` and the run log when some tasks' writes are unguarded."""
    open_ = [t for t in tasks if unguarded_writes(t)]
    if not open_:
        return None
    ids = ", ".join(t.id for t in open_[:3]) + (" ..." if len(open_) > 3 else "")
    return (f"{len(open_)} of {len(tasks)} tasks have tools that may write and no reference ({ids}): "
            "under rehearsal their writes are unguarded (an extra or changed write is not penalised); "
            "add a `reference` (its calls), or mark read-only tools with annotations.readOnlyHint")
