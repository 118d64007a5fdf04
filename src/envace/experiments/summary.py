"""Summary figures of a set of trajectories, as a dict and as a printed table."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from envace.core.types import Trajectory


def summarize(trajectories: list[Trajectory], tokens_per_second: float | None = None) -> dict[str, Any]:
    n = len(trajectories)
    if n == 0:
        return {"episodes": 0}
    turns = [sum(1 for m in t.messages if m.role == "assistant") for t in trajectories]
    out: dict[str, Any] = {
        "tasks": len({t.task_id for t in trajectories}),
        "episodes": n,
        "success_rate": sum(t.solved for t in trajectories) / n,
        "mean_reward": sum(t.reward for t in trajectories) / n,
        "turns": sum(turns) / n,
        "tool_calls": sum(t.tool_calls for t in trajectories) / n,
        "parse_failures": sum(t.parse_failures for t in trajectories),
        "sim_format_failures": sum(t.sim_format_failures for t in trajectories),
        "stop_reasons": _count(t.stop_reason for t in trajectories),
    }
    if tokens_per_second is not None:
        out["tokens_per_s"] = tokens_per_second
    return out


def _count(items) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={c}" for k, c in v.items())
    return str(v)


def print_summary(summary: dict[str, Any], title: str = "rollout") -> None:
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in summary.items():
        table.add_row(k, _fmt(v))
    Console().print(table)


def summary_markdown(summary: dict[str, Any], title: str) -> str:
    lines = [f"# {title}", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in summary.items()]
    return "\n".join(lines) + "\n"
