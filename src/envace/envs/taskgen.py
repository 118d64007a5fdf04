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
from envace.core.values import excludes_items
from envace.envs.provider import table_digests
from envace.envs.registry import world_class
from envace.envs.world import World

TEST_ONE_IN = 5  # one seed in five goes to the test split
GROUNDINGS = ("covering", "disjoint")
COVER_TRIES = 24  # sampler draws per reference read call when looking for a covering example


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
    results: list[Any] = field(default_factory=list)  # what each reference call returned
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
        self.results.append(result)
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


ANSWER_MIN_CHARS, ANSWER_FACTOR = 240, 3


def split_of(seed: int) -> str:
    """About 20% of seeds are test; a hash, so the split never depends on how many tasks exist."""
    digest = int(hashlib.sha256(f"split:{seed}".encode()).hexdigest(), 16)
    return "test" if digest % TEST_ONE_IN == 0 else "train"


def difficulty_of(index: int) -> int:
    """Task i has difficulty 1, 2, 3, 1, ...: known before building it, so a filter is cheap."""
    return 1 + index % 3


def build_task(taskset: TaskSet, index: int, n_examples: int, grounding: str = "covering") -> Task:
    cls = world_class(taskset.world)
    seed, difficulty = index, difficulty_of(index)
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
    # The reference's whole end state: a collateral or unrelated write fails it (tau2's check).
    states.append(ChecklistItem(kind="end_state", digests=table_digests(draft.world.query)))
    # Answers stay answers: a few times the reference's length, no pasted tool JSON, and none of
    # the other records' values the reference saw (an answer listing every value seen fails).
    bound = max(ANSWER_MIN_CHARS, ANSWER_FACTOR * len(draft.answer_text))
    answers = [*draft.answer_items, ChecklistItem(kind="answer_plain", max_chars=bound)]
    answers += excludes_items([(c.name, r) for c, r in zip(draft.calls, draft.results)], draft.answer_text,
                              [i.text for i in draft.answer_items if i.text], draft.instruction)
    return Task(
        id=f"{taskset.world}-{index:04d}",
        domain=taskset.world,
        instruction=draft.instruction,
        tools=draft.world.tools(),
        checklist=draft.checklist + states + answers,
        examples=pick_examples(taskset, draft, n_examples, grounding),
        env=EnvRef(world=taskset.world, seed=seed),
        split=split_of(seed),  # type: ignore[arg-type]
        difficulty=difficulty,
        # The world says which tools write: the reward compares the episode's writes with these.
        reference=Reference(calls=draft.calls, answer=draft.answer_text,
                            write_tools=sorted(cls.writing_tools)),
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


def needed_values(draft: Draft) -> list[str]:
    """What a rehearsal must state for the trajectory-judged items to pass: free-text values of
    ``called`` items that the instruction does not give (looked-up ids, mostly) and the answer
    texts. Lower-cased; enum values are left out (the caller picks them from the request)."""
    specs = {n: t.function.parameters["properties"] for n, t in draft.world._specs.items()}
    said = draft.instruction.lower()
    out: list[str] = []
    for item in draft.checklist:
        if item.kind != "called" or item.tool not in specs:
            continue
        for key, value in item.args.items():
            if "enum" in specs[item.tool].get(key, {}):
                continue
            out += [v.lower() for v in (value if isinstance(value, list) else [value])
                    if isinstance(v, str) and v.lower() not in said]
    out += [i.text.lower() for i in draft.answer_items if i.text]
    return list(dict.fromkeys(out))


def _covering_examples(taskset: TaskSet, draft: Draft, reader: World, rng: random.Random,
                       seen: set[tuple[str, str]]) -> list[Example]:
    """Real read calls on the initial state whose results show the values of ``needed_values``.

    For each read call of the reference whose result shows some needed values, a *different*
    call of the same tool that shows them all is preferred (up to ``COVER_TRIES`` sampler
    draws); failing that, the reference read call itself. Writes are never shown: what a
    cancellation or a transfer returns is the dynamics the simulator has to get right.
    """
    cls = type(reader)
    uncovered = needed_values(draft)
    out: list[Example] = []
    for call in draft.calls:
        if not uncovered or call.name in cls.writing_tools:
            continue
        result = reader.call(call.name, call.arguments)
        shown = [v for v in uncovered if v in json.dumps(result).lower()]
        if is_error(result) or not shown:
            continue
        pick = Example(tool=call.name, arguments=call.arguments, result=result)
        sampler = taskset.samplers.get(call.name)
        for _ in range(COVER_TRIES if sampler else 0):
            args = sampler(reader, rng)
            key = (call.name, json.dumps(args, sort_keys=True)) if args is not None else None
            if key is None or key in seen:
                continue
            other = reader.call(call.name, args)
            if not is_error(other) and all(v in json.dumps(other).lower() for v in shown):
                pick = Example(tool=call.name, arguments=args, result=other)
                break
        seen.add((pick.tool, json.dumps(pick.arguments, sort_keys=True)))
        out.append(pick)
        uncovered = [v for v in uncovered if v not in shown]
    return out


def pick_examples(taskset: TaskSet, draft: Draft, n: int, grounding: str = "covering") -> list[Example]:
    """Real call/result pairs from the task's initial world state, for some tools.

    ``covering`` (default): first the examples that show what the judged items need (see
    ``_covering_examples``), so a good world model *can* answer consistently; then others up to
    ``n``. ``disjoint``: no example repeats a reference call, uses one of its free-text argument
    values, or shows a result containing a text the answer must state (rehearsal then cannot be
    right about looked-up values: a stress setting). Other examples, one per tool: tools the
    reference uses first, successful results preferred, error examples only when needed.
    """
    if grounding not in GROUNDINGS:
        raise ValueError(f"grounding must be one of {GROUNDINGS}, not {grounding!r}")
    if n <= 0:
        return []
    cls = world_class(taskset.world)
    rng = random.Random(f"{taskset.world}:examples:{draft.world.seed}:{draft.instruction}")
    reader = cls(draft.world.seed)  # initial state; writes run on their own throwaway world
    seen = {(c.name, json.dumps(c.arguments, sort_keys=True)) for c in draft.calls}
    covering = _covering_examples(taskset, draft, reader, rng, seen) if grounding == "covering" else []
    used = [t for t in dict.fromkeys(c.name for c in draft.calls) if t in taskset.samplers]
    others = [t for t in taskset.samplers if t not in used]
    rng.shuffle(others)
    secrets = _secrets(draft)
    banned = [i.text.lower() for i in draft.answer_items if i.text]
    chosen: dict[str, Example] = {}
    want = n - len(covering)
    for allow_errors in (False, True):
        for tool in used + others:
            if len(chosen) >= want:
                break
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
        if len(chosen) >= want:
            break
    order = used + others  # keep a stable, readable order: reference tools first
    return covering + sorted(chosen.values(), key=lambda e: order.index(e.tool))
