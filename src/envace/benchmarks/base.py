"""What every benchmark adapter offers, and the records that pass between adapter and runner.

An adapter turns a benchmark's entries into :class:`BenchItem` (our ``Task`` plus what the
benchmark needs to replay and score an episode), builds the benchmark's executable environment as
a World-like object (``tools()``, ``call(name, arguments) -> dict`` never raising, ``calls``), and
scores a finished :class:`BenchEpisode` with the benchmark's *own* scorer where one exists.

Layering: this package imports only ``core``, ``envs`` and ``policy``. The episode loop that drives
a policy through several user turns lives in ``experiments.bench_runner`` (it needs ``rollout``).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from envace.core.types import Message, Task, ToolCall, ToolSpec


@dataclass
class Category:
    name: str
    runnable: bool = True
    reason: str = ""  # why not runnable here
    group: str = ""  # the benchmark's own grouping (e.g. BFCL "non_live", "multi_turn")


@dataclass
class BenchItem:
    """One benchmark entry, ready to run.

    ``task.instruction`` is the first user turn; ``user_turns`` the scripted later ones (BFCL
    multi-turn). A benchmark whose user is simulated by a model (tau2, VitaBench) leaves
    ``user_turns`` empty and gives ``user_scenario`` instead. ``tools_added`` maps a user-turn
    index to tools that become available from that turn on (BFCL miss_func); ``turn_context`` a
    user-turn index to the (gold) conversation shown before it instead of the caller's own.
    """

    benchmark: str
    category: str
    task: Task
    user_turns: list[str] = field(default_factory=list)
    tools_added: dict[int, list[ToolSpec]] = field(default_factory=dict)
    execute: bool = True  # False: single-response benchmarks (BFCL AST): calls are scored, not run
    max_steps: int = 8  # caller steps per user turn before the benchmark force-terminates
    user_scenario: str | None = None  # instructions for a simulated user
    system_prompt: str | None = None  # the benchmark's agent policy / system text, if any
    raw: dict[str, Any] = field(default_factory=dict)  # the benchmark's own entry (+ answers)
    version: str = ""  # data version the item was loaded from (package or data-dir)
    # user turn k -> the conversation the caller sees before that turn's user message, replacing its
    # own earlier turns (FinMCP's protocol: every turn is conditioned on the gold history)
    turn_context: dict[int, list[Message]] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.task.id


@dataclass
class BenchEpisode:
    """What the policy did, segmented the way benchmark scorers want it."""

    item_id: str
    # per user turn, per caller step, the calls of that step (parsed, valid or not)
    turns: list[list[list[ToolCall]]] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)  # full conversation, user turns included
    force_terminated: bool = False
    stop_reason: str = "final_answer"

    @property
    def all_calls(self) -> list[ToolCall]:
        return [c for turn in self.turns for step in turn for c in step]


@dataclass
class BenchScore:
    item_id: str
    category: str
    valid: bool
    reward: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)


class BenchWorld(Protocol):
    calls: list[tuple[ToolCall, dict]]

    def tools(self) -> list[ToolSpec]: ...

    def call(self, name: str, arguments: dict) -> dict: ...


class Adapter(Protocol):
    name: str
    title: str
    licence: str
    needs: str  # what it needs installed / present

    def available(self, data_dir: Path | None = None) -> tuple[bool, str]: ...

    def categories(self) -> list[Category]: ...

    def count(self, category: str, data_dir: Path | None = None, version: str | None = None) -> int | None: ...

    def load(self, category: str, limit: int | None = None, data_dir: Path | None = None,
             version: str | None = None) -> list[BenchItem]: ...

    def make_world(self, item: BenchItem) -> BenchWorld | None: ...

    def score(self, item: BenchItem, episode: BenchEpisode, world: Any | None = None) -> BenchScore: ...

    def aggregate(self, scores: list[BenchScore]) -> dict[str, Any]: ...


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def per_category_accuracy(scores: list[BenchScore]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for s in scores:
        row = out.setdefault(s.category, {"correct": 0, "total": 0})
        row["correct"] += int(s.valid)
        row["total"] += 1
    for row in out.values():
        row["accuracy"] = row["correct"] / row["total"] if row["total"] else 0.0
    return out


def tool_result(value: Any) -> dict:
    """A benchmark tool's return value as the JSON object our worlds answer with."""
    if isinstance(value, dict):
        try:
            return json.loads(json.dumps(value, default=str))
        except (TypeError, ValueError):
            return {"result": str(value)}
    try:
        return {"result": json.loads(json.dumps(value, default=str))}
    except (TypeError, ValueError):
        return {"result": str(value)}
