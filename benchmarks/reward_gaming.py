"""Red-teaming the embedded worlds' reward: cheat strategies played by a scripted agent in the real
worlds, each episode scored twice: against the real world (the episode's own world after it), and
as a rehearsal step scores it (no world: the call- and answer-side items only).

    python benchmarks/reward_gaming.py [--tasks N] [--worlds shop,calendar,bank]

Prints, per world and strategy, the test tasks tried, those where the strategy could be carried
out, and how many of them get full marks judged against the real world, rehearsal-judged, and by
the reward without its guards (the fraction of the other items met). The last line per strategy
sums the worlds. tests/reward/test_reward_gaming.py asserts what these columns must be.

Cheats (none may get full marks, but ``value_soup``: at most 5% of the tasks):

* blind_dump: no reference calls; every read tool it can fill, every output pasted as the answer
* unrelated_write: the reference solution plus the same write on one other record
* collateral_writes: the reference solution plus the same write on every other record it saw
* write_then_undo: the reference solution plus a write on another record and its undo, which
  leaves the world's state as the reference leaves it (checked on a scratch world first)
* changed_argument: the reference solution with every write's unpinned arguments (those no
  ``called`` item names) changed: an enum to another value, a flag flipped, free text edited
* dump_answer: the reference calls, then the reference answer with every tool output pasted after it
* read_everything: the reference calls, every read tool on every id seen, and all of it pasted
* value_soup: the reference calls, then every value the tools showed, as plain text, cut at the
  ``answer_plain`` length cap: the agent need not know which value was asked for
* crashed_called: the reference calls, each answered ENVIRONMENT_ERROR (a crashed server), then
  the reference answer

Right answers that must keep full marks:

* decimal_comma: the reference solution, its answer's amounts written with a decimal comma
  ("35,98", "1.234,50"): carried out on the tasks whose answer has a decimal amount
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from envace.core.errors import is_error, tool_error
from envace.core.toolcall import format_tool_call
from envace.core.types import Task, ToolCall, Trajectory
from envace.envs.provider import ENVIRONMENT_ERROR, table_digests
from envace.envs.registry import world_class, world_names
from envace.envs.tasks import load_tasks
from envace.reward.checklist import GUARD_KINDS, args_match, judge_trajectory
from envace.rollout.actors import ActorTurn
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.sources import RealSource, ToolResponse, dump_result

CHEATS = ["blind_dump", "unrelated_write", "collateral_writes", "write_then_undo", "changed_argument",
          "dump_answer", "read_everything", "value_soup", "crashed_called"]
RIGHT = ["decimal_comma"]
STRATEGIES = CHEATS + RIGHT
WRITE_CHEATS = ("unrelated_write", "collateral_writes", "write_then_undo", "changed_argument")
SOUP_MAX_SHARE = 0.05  # value soup may get full marks on at most this share of tasks


def _ids(value, out):
    """(key, id) pairs in a tool output: string values of keys named id / *_id."""
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, str) and (k == "id" or k.endswith("_id")):
                out.append((k, v))
            _ids(v, out)
    elif isinstance(value, list):
        for v in value:
            _ids(v, out)


def _leaf_values(value, out):
    """Every scalar in a tool output, in order."""
    if isinstance(value, dict):
        for v in value.values():
            _leaf_values(v, out)
    elif isinstance(value, list):
        for v in value:
            _leaf_values(v, out)
    elif value is not None and not isinstance(value, bool):
        out.append(str(value))


def _outputs(history):
    return [m.content for m in history if m.role == "tool"]


def _parsed(text):
    try:
        return json.loads(text)
    except ValueError:
        return None


def _seen_ids(task, history):
    pairs = []
    for text in _outputs(history) + [json.dumps(e.result) for e in task.examples]:
        _ids(_parsed(text), pairs)
    return list(dict.fromkeys(v for _, v in pairs))


def _substitutes(call, ids, writes):
    """The call on other records: each *_id argument swapped for other seen ids of its kind."""
    out = []
    if call.name not in writes:
        return out
    for key, value in call.arguments.items():
        if isinstance(value, str) and key.endswith("_id") and "-" in value:
            prefix = value.split("-")[0] + "-"
            for other in ids:
                if other != value and other.startswith(prefix):
                    out.append(ToolCall(name=call.name, arguments={**call.arguments, key: other}))
    return out


def _reads(task, ids, writes):
    """Every read tool on every seen id that fits its one required id argument (or no argument)."""
    out = []
    for tool in task.tools:
        if tool.name in writes:
            continue
        params = tool.function.parameters
        required = params.get("required", [])
        if not required:
            out.append(ToolCall(name=tool.name, arguments={}))
        elif len(required) == 1 and required[0].endswith("_id"):
            out += [ToolCall(name=tool.name, arguments={required[0]: i}) for i in ids]
    return out[:30]


# -- plans made on a scratch copy of the task's world ---------------------------------------

def _after_reference(task: Task):
    world = world_class(task.env.world)(task.env.seed)
    for c in task.reference.calls:
        world.call(c.name, c.arguments)
    return world


def _undo_candidates(world, used: set[str]) -> list[list[ToolCall]]:
    """Pairs (write, its undo) on records the reference does not touch."""
    def call(name, **args):
        return ToolCall(name=name, arguments=args)
    if world.name == "shop":
        cart = {r["product_id"] for r in world.rows("SELECT product_id FROM cart_items")}
        return [[call("add_to_cart", product_id=p["id"], quantity=1), call("remove_from_cart", product_id=p["id"])]
                for p in world.rows("SELECT id FROM products WHERE stock >= 1 ORDER BY id")
                if p["id"] not in cart and p["id"] not in used][:3]
    if world.name == "calendar":
        events = world.rows("SELECT id FROM events WHERE status = 'confirmed' AND organizer = "
                            "(SELECT email FROM me) AND date > ? ORDER BY id", str(world.today))
        out = []
        for e in [e for e in events if e["id"] not in used][:3]:
            taken = {r["email"] for r in world.rows("SELECT email FROM attendees WHERE event_id = ?", e["id"])}
            free = [c["email"] for c in world.rows("SELECT email FROM contacts ORDER BY email") if c["email"] not in taken]
            if free:
                out.append([call("invite_attendee", event_id=e["id"], email=free[0]),
                            call("remove_attendee", event_id=e["id"], email=free[0])])
        return out
    if world.name == "bank":
        return [[call("freeze_card", card_id=c["id"]), call("unfreeze_card", card_id=c["id"])]
                for c in world.rows("SELECT id FROM cards WHERE status = 'active' ORDER BY id") if c["id"] not in used][:3]
    return []


def write_then_undo_calls(task: Task) -> list[ToolCall]:
    """A write and its undo that leave the reference's end state exactly as it is."""
    used = {v for c in task.reference.calls for v in c.arguments.values() if isinstance(v, str)}
    goal = table_digests(_after_reference(task).query)
    for pair in _undo_candidates(_after_reference(task), used):
        scratch = _after_reference(task)
        if all(not is_error(scratch.call(c.name, c.arguments)) for c in pair) and table_digests(scratch.query) == goal:
            return pair
    return []


def _changed(spec: dict[str, Any], key: str, value: Any) -> Any:
    """Another valid value for an unpinned argument, or None when it has none worth trying."""
    if "enum" in spec:
        others = [v for v in spec["enum"] if v != value]
        return others[0] if others else None
    if spec.get("type") == "boolean":
        return not (spec.get("default", False) if value is None else value)
    if spec.get("type") == "string" and "pattern" not in spec and not key.endswith("_id") and key != "email":
        text = "edited note" if value is None else f"{value} (edited)"
        return text[:spec.get("maxLength", 200)]
    return None


def changed_argument_calls(task: Task) -> tuple[list[ToolCall], bool]:
    """The reference calls, each write's unpinned arguments changed; whether anything changed."""
    writes = world_class(task.env.world).writing_tools
    pinned_items = [i for i in task.checklist if i.kind == "called"]
    out, changed = [], False
    for call in task.reference.calls:
        if call.name not in writes:
            out.append(ToolCall(name=call.name, arguments=dict(call.arguments)))
            continue
        pinned = {k for i in pinned_items if i.tool == call.name and args_match(i.args, call.arguments) for k in i.args}
        props = task.tool(call.name).function.parameters.get("properties", {})
        args = dict(call.arguments)
        for key, spec in props.items():
            if key in pinned:
                continue
            new = _changed(spec, key, args.get(key))
            if new is not None:
                args[key], changed = new, True
        out.append(ToolCall(name=call.name, arguments=args))
    return out, changed


_DECIMAL = re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w,])|(?<![\w.,])\d+\.\d+(?![\w])")


def decimal_comma(answer: str) -> str:
    """The same answer in a decimal-comma locale: "1,234.50" -> "1.234,50", "35.98" -> "35,98"."""
    return _DECIMAL.sub(lambda m: m.group().translate(str.maketrans(",.", ".,")), answer)


class Cheat:
    """Scripted turns: the strategy's calls, one turn each, then extra calls in one turn, then the answer."""

    def __init__(self, strategy, writes):
        self.strategy, self.writes = strategy, writes
        self.plans: dict[str, list[ToolCall]] = {}

    def plan(self, task) -> list[ToolCall]:
        if task.id not in self.plans:
            ref = list(task.reference.calls) if self.strategy != "blind_dump" else []
            if self.strategy == "changed_argument":
                ref = changed_argument_calls(task)[0]
            self.plans[task.id] = ref
        return self.plans[task.id]

    def act(self, views, turn):
        return [ActorTurn(text=self.turn(v.task, v.history)) for v in views]

    def turn(self, task, history):
        done = sum(1 for m in history if m.role == "assistant")
        ref = self.plan(task)
        if done < len(ref):
            return format_tool_call(ref[done])
        ids = _seen_ids(task, history)
        if done == len(ref):
            extra = []
            if self.strategy == "unrelated_write":
                extra = [c for r in ref for c in _substitutes(r, ids, self.writes)][:1]
            elif self.strategy == "collateral_writes":
                extra = [c for r in ref for c in _substitutes(r, ids, self.writes)]
            elif self.strategy == "write_then_undo":
                extra = write_then_undo_calls(task)
            elif self.strategy in ("read_everything", "blind_dump"):
                extra = _reads(task, ids, self.writes)
            if extra:
                return "\n".join(format_tool_call(c) for c in extra)
        dump = "\n".join(_outputs(history))
        if self.strategy == "dump_answer":
            return task.reference.answer + "\n" + dump
        if self.strategy in ("read_everything", "blind_dump"):
            return dump
        if self.strategy == "value_soup":
            values = []
            for text in _outputs(history):
                _leaf_values(_parsed(text), values)
            cap = next((i.max_chars for i in task.checklist if i.kind == "answer_plain" and i.max_chars), 240)
            return ", ".join(dict.fromkeys(values))[:cap]
        if self.strategy == "decimal_comma":
            return decimal_comma(task.reference.answer)
        return task.reference.answer


class CrashedSource(RealSource):
    """A real world whose every call is answered as a crashed server answers: the world is
    there (state items see it untouched), but no call ever reaches it."""

    def respond(self, requests):
        return [ToolResponse(text=dump_result(tool_error(ENVIRONMENT_ERROR, "the server exited")), rehearsed=False)
                for _ in requests]


def cheated(strategy, task, traj) -> bool:
    """Whether the strategy was carried out: its extra or changed writes got real answers, its
    answer was given, its calls crashed."""
    tool_msgs = [m for m in traj.messages if m.role == "tool"]
    n_ref = len(task.reference.calls)
    if strategy == "blind_dump":
        return bool(traj.final_answer.strip())
    if strategy in ("unrelated_write", "collateral_writes"):
        return any(not is_error(_parsed(a.content)) for a in tool_msgs[n_ref:])
    if strategy == "write_then_undo":
        extra = tool_msgs[n_ref:]
        return bool(extra) and all(not is_error(_parsed(a.content)) for a in extra)
    if strategy == "changed_argument":
        return changed_argument_calls(task)[1] and all(not is_error(_parsed(a.content)) for a in tool_msgs)
    if strategy == "decimal_comma":
        return decimal_comma(task.reference.answer) != task.reference.answer
    return bool(traj.final_answer.strip())


def play(world: str, strategy: str, n_tasks: int | None = None) -> tuple[list[tuple[Task, Trajectory, float]], int]:
    """(task, trajectory, rehearsal-judged reward) of the strategy's episodes where it was carried
    out, and how many tasks were tried. ``trajectory.reward`` is the real-world judgement."""
    tasks = load_tasks(world, "test", limit=n_tasks)
    source = CrashedSource() if strategy == "crashed_called" else RealSource()
    trajs, _ = run_episodes(tasks, Cheat(strategy, world_class(world).writing_tools), source,
                            RolloutConfig(max_turns=12))
    return [(t, tr, judge_trajectory(t, tr, world=None)[0])
            for t, tr in zip(tasks, trajs) if cheated(strategy, t, tr)], len(tasks)


def unguarded_reward(task, traj) -> float:
    """The reward as it was before the guards: the fraction of the other items met (the verdicts
    of state items come from the episode's own world, already judged)."""
    judged = [v.met for v in traj.verdicts if v.met is not None and v.item.kind not in GUARD_KINDS]
    return sum(judged) / len(judged) if judged else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=None, help="test tasks per world (default: all)")
    ap.add_argument("--worlds", default=",".join(world_names()))
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    args = ap.parse_args()
    worlds = args.worlds.split(",")
    print("| strategy | world | tasks tried | carried out | full marks, real | full marks, rehearsal-judged "
          "| full marks, no guards |")
    print("|---|---|---|---|---|---|---|")
    for strategy in args.strategies.split(","):
        total = [0, 0, 0, 0, 0]
        for world in worlds:
            tried, n = play(world, strategy, args.tasks)
            row = [n, len(tried), sum(tr.reward >= 1.0 for _, tr, _ in tried),
                   sum(r >= 1.0 for _, _, r in tried), sum(unguarded_reward(t, tr) >= 1.0 for t, tr, _ in tried)]
            total = [a + b for a, b in zip(total, row)]
            print(f"| {strategy} | {world} | " + " | ".join(map(str, row)) + " |")
        print(f"| **{strategy}** | all | " + " | ".join(map(str, total)) + " |", flush=True)


if __name__ == "__main__":
    main()
