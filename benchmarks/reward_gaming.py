"""Red-teaming the embedded worlds' reward: five cheat strategies, played by a scripted agent in
the real worlds, scored with and without the guard items (end_state, answer_plain).

    python benchmarks/reward_gaming.py [--tasks 24]

Prints, per world and strategy, the tasks where the cheat could be carried out and how many of
them score full marks with the guards and without them (the reward before the guards existed).
tests/reward/test_reward_gaming.py asserts the "with guards" column is 0.

* blind dump: no reference calls; call every read tool it can fill, paste every output as the answer
* unrelated write: the reference solution plus the same write on one other record
* collateral writes: the reference solution plus the same write on every other record it saw
* dump answer: the reference calls, then the reference answer with every tool output pasted after it
* read-everything: the reference calls, every read tool on every id seen, and all of it pasted
"""

from __future__ import annotations

import argparse
import json

from envace.core.errors import is_error
from envace.core.toolcall import format_tool_call
from envace.core.types import ToolCall
from envace.envs.registry import world_class, world_names
from envace.envs.tasks import load_tasks
from envace.reward.checklist import GUARD_KINDS
from envace.rollout.actors import ActorTurn
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.sources import RealSource

STRATEGIES = ["blind_dump", "unrelated_write", "collateral_writes", "dump_answer", "read_everything"]


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


def _outputs(history):
    return [m.content for m in history if m.role == "tool"]


def _seen_ids(task, history):
    pairs = []
    for text in _outputs(history) + [json.dumps(e.result) for e in task.examples]:
        try:
            _ids(json.loads(text), pairs)
        except ValueError:
            pass
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


class Cheat:
    """One turn per phase: reference calls one by one, then the strategy's extra calls in one
    turn, then the answer."""

    def __init__(self, strategy, writes):
        self.strategy, self.writes = strategy, writes

    def act(self, views, turn):
        return [ActorTurn(text=self.turn(v.task, v.history)) for v in views]

    def turn(self, task, history):
        done = sum(1 for m in history if m.role == "assistant")
        ref = task.reference.calls if self.strategy != "blind_dump" else []
        if done < len(ref):
            return format_tool_call(ref[done])
        ids = _seen_ids(task, history)
        if done == len(ref):
            extra = []
            if self.strategy == "unrelated_write":
                extra = [c for r in ref for c in _substitutes(r, ids, self.writes)][:1]
            elif self.strategy == "collateral_writes":
                extra = [c for r in ref for c in _substitutes(r, ids, self.writes)]
            elif self.strategy in ("read_everything", "blind_dump"):
                extra = _reads(task, ids, self.writes)
            if extra:
                return "\n".join(format_tool_call(c) for c in extra)
        dump = "\n".join(_outputs(history))
        if self.strategy in ("unrelated_write", "collateral_writes"):
            return task.reference.answer
        if self.strategy == "dump_answer":
            return task.reference.answer + "\n" + dump
        return dump


def _cheated(strategy, traj, n_ref):
    """Whether the cheat was carried out: the extra writes or reads got real answers."""
    answers = [m for m in traj.messages if m.role == "tool"][n_ref:] if strategy != "blind_dump" else \
        [m for m in traj.messages if m.role == "tool"]
    ok = [a for a in answers if not is_error(json.loads(a.content))]
    if strategy in ("unrelated_write", "collateral_writes"):
        return bool(ok)
    return bool(traj.final_answer.strip())




def cheated(strategy, traj, n_ref):
    """Whether the cheat was carried out: its extra writes got real answers, or it answered."""
    tool_msgs = [m for m in traj.messages if m.role == "tool"]
    answers = tool_msgs if strategy == "blind_dump" else tool_msgs[n_ref:]
    ok = [a for a in answers if not is_error(json.loads(a.content))]
    if strategy in ("unrelated_write", "collateral_writes"):
        return bool(ok)
    return bool(traj.final_answer.strip())


def play(world: str, strategy: str, n_tasks: int):
    """(task, trajectory) pairs of the strategy's episodes where the cheat was carried out; the
    trajectories are judged with the guards (their reward) against the real world."""
    tasks = load_tasks(world, "test", limit=n_tasks)
    trajs, _ = run_episodes(tasks, Cheat(strategy, world_class(world).writing_tools), RealSource(),
                            RolloutConfig(max_turns=12))
    return [(t, tr) for t, tr in zip(tasks, trajs) if cheated(strategy, tr, len(t.reference.calls))], len(tasks)


def unguarded_reward(task, traj) -> float:
    """The reward as it was before the guards: the fraction of the other items met (the verdicts
    of state items come from the episode's own world, already judged)."""
    judged = [v.met for v in traj.verdicts if v.met is not None and v.item.kind not in GUARD_KINDS]
    return sum(judged) / len(judged) if judged else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=24, help="test tasks per world")
    args = ap.parse_args()
    print("| world | strategy | tasks tried | carried out | full marks, no guards | full marks, with guards |")
    print("|---|---|---|---|---|---|")
    for world in world_names():
        for strategy in STRATEGIES:
            tried, n = play(world, strategy, args.tasks)
            before = sum(unguarded_reward(t, tr) >= 1.0 for t, tr in tried)
            after = sum(tr.reward >= 1.0 for _, tr in tried)
            print(f"| {world} | {strategy} | {n} | {len(tried)} | {before} | {after} |")


if __name__ == "__main__":
    main()
