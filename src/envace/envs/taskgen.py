"""Shared machinery of the task generators.

A *scenario* scripts one kind of task: it looks at a fresh world, picks its targets, writes the
user's request and then performs the reference solution through ``Draft.do``, which executes each
call on that world. Ids, amounts and the final DB state in the checklist are therefore exactly what
the real world produces; nothing is computed twice by hand. The world modules' task files
(``tasks_shop`` ...) hold only scenarios and example-argument samplers.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envace.core.errors import is_error
from envace.core.types import ChecklistItem, EnvRef, Example, Reference, Task, ToolCall
from envace.envs.registry import world_class
from envace.envs.world import World

TEST_ONE_IN = 5  # one seed in five goes to the test split


class Skip(Exception):
    """The scenario cannot be posed on this world (e.g. it has no cancellable order)."""


def need(condition: Any) -> None:
    if not condition:
        raise Skip


@dataclass
class Draft:
    """What a scenario writes while it solves its task on a live world."""

    world: World
    rng: random.Random
    instruction: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    checklist: list[ChecklistItem] = field(default_factory=list)
    state_queries: list[str] = field(default_factory=list)
    answer_text: str = ""
    answer_items: list[ChecklistItem] = field(default_factory=list)

    def ask(self, instruction: str) -> None:
        self.instruction = instruction

    def do(self, tool: str, **arguments: Any) -> dict:
        """One step of the reference solution; an error here is a bug in the scenario."""
        result = self.world.call(tool, arguments)
        if is_error(result):
            raise RuntimeError(f"{self.world.name} seed {self.world.seed}: reference call "
                               f"{tool}({arguments}) failed: {result}")
        self.calls.append(ToolCall(name=tool, arguments=arguments))
        return result

    def expect_call(self, tool: str, **args: Any) -> None:
        self.checklist.append(ChecklistItem(kind="called", tool=tool, args=args))

    def expect_state(self, sql: str) -> None:
        """``sql``'s rows on the final DB become the item's ``equals`` once the scenario is done."""
        self.state_queries.append(sql)

    def answer(self, text: str, *must_contain: str) -> None:
        for needle in must_contain:
            assert needle.lower() in text.lower(), (needle, text)
        self.answer_text = text
        self.answer_items = [ChecklistItem(kind="answer_contains", text=n) for n in must_contain]

    # read helpers, so scenarios read the world without touching ``calls``
    def rows(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        return self.world.rows(sql, *params)

    def pick(self, sql: str, *params: Any) -> dict[str, Any]:
        """A random row of ``sql``, or Skip when there is none (rows sorted first, so the pick
        never depends on SQLite's query plan)."""
        found = sorted(self.rows(sql, *params), key=lambda r: [str(v) for v in r.values()])
        need(found)
        return self.rng.choice(found)


Scenario = Callable[[Draft], None]
Sampler = Callable[[World, random.Random], dict[str, Any] | None]


@dataclass(frozen=True)
class TaskSet:
    """Everything the generator needs for one world."""

    world: str
    scenarios: dict[int, list[Scenario]]  # difficulty -> scenarios of that difficulty
    samplers: dict[str, Sampler]  # tool -> arguments for a grounding example


def split_of(seed: int) -> str:
    """About 20% of seeds are test; a hash, so the split never depends on how many tasks exist."""
    digest = int(hashlib.sha256(f"split:{seed}".encode()).hexdigest(), 16)
    return "test" if digest % TEST_ONE_IN == 0 else "train"


def build_task(taskset: TaskSet, index: int, n_examples: int) -> Task:
    cls = world_class(taskset.world)
    seed, difficulty = index, 1 + index % 3
    rng = random.Random(f"{taskset.world}:task:{index}")
    for _ in range(50):
        draft = Draft(cls(seed), rng)
        try:
            rng.choice(taskset.scenarios[difficulty])(draft)
            break
        except Skip:
            continue
    else:
        raise RuntimeError(f"no {taskset.world} scenario of difficulty {difficulty} fits seed {seed}")
    states = [ChecklistItem(kind="state", query=q, equals=draft.world.query(q))
              for q in draft.state_queries]
    return Task(
        id=f"{taskset.world}-{index:04d}",
        domain=taskset.world,
        instruction=draft.instruction,
        tools=draft.world.tools(),
        checklist=draft.checklist + states + draft.answer_items,
        examples=pick_examples(taskset, draft, n_examples),
        env=EnvRef(world=taskset.world, seed=seed),
        split=split_of(seed),  # type: ignore[arg-type]
        difficulty=difficulty,
        reference=Reference(calls=draft.calls, answer=draft.answer_text),
    )


def _secrets(draft: Draft) -> set[str]:
    """Free-text argument values of the reference (ids, names, dates): examples must not use them.

    Enum values are left out: sharing ``shipping_speed="standard"`` gives nothing away.
    """
    specs = {n: t.function.parameters["properties"] for n, t in draft.world._specs.items()}
    out: set[str] = set()
    for call in draft.calls:
        for key, value in call.arguments.items():
            if "enum" in specs[call.name].get(key, {}):
                continue
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, str):
                    out.add(v.lower())
    return out


def _values(arguments: dict[str, Any]) -> set[str]:
    out: set[str] = set()
    for value in arguments.values():
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str):
                out.add(v.lower())
    return out


def pick_examples(taskset: TaskSet, draft: Draft, n: int) -> list[Example]:
    """Real call/result pairs from the task's initial world state, one per tool, for some tools.

    Grounding, not the answer key: no example repeats a reference call, uses one of its
    free-text argument values, or shows a result containing a text the answer must state.
    Tools the reference uses come first (that is where the simulator needs grounding), and
    successful results are preferred; error examples fill in only when needed.
    """
    if n <= 0:
        return []
    cls = world_class(taskset.world)
    rng = random.Random(f"{taskset.world}:examples:{draft.world.seed}:{draft.instruction}")
    reader = cls(draft.world.seed)  # initial state; writes run on their own throwaway world
    used = [t for t in dict.fromkeys(c.name for c in draft.calls) if t in taskset.samplers]
    others = [t for t in taskset.samplers if t not in used]
    rng.shuffle(others)
    secrets = _secrets(draft)
    banned = [i.text.lower() for i in draft.answer_items if i.text]
    seen = {(c.name, json.dumps(c.arguments, sort_keys=True)) for c in draft.calls}
    chosen: dict[str, Example] = {}
    for allow_errors in (False, True):
        for tool in used + others:
            for _ in range((6 if tool in used else 3) * (tool not in chosen)):
                args = taskset.samplers[tool](reader, rng)
                key = (tool, json.dumps(args, sort_keys=True))
                if args is None or key in seen or _values(args) & secrets:
                    continue
                seen.add(key)
                world = cls(draft.world.seed) if tool in cls.writing_tools else reader
                result = world.call(tool, args)
                if (is_error(result) and not allow_errors) or any(
                        b in json.dumps(result).lower() for b in banned):
                    continue
                chosen[tool] = Example(tool=tool, arguments=args, result=result)
                break
            if len(chosen) == n:
                break
        if len(chosen) == n:
            break
    order = used + others  # keep a stable, readable order: reference tools first
    return sorted(chosen.values(), key=lambda e: order.index(e.tool))
