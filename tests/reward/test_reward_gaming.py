"""The reward cannot be gamed: five cheat strategies, played by a scripted agent in the real
embedded worlds, never score full marks on a task where the cheat was actually carried out.

* blind dump: no reference calls; call every read tool it can fill, paste every output as the answer
* unrelated write: the reference solution plus the same write on one other record
* collateral writes: the reference solution plus the same write on every other record it saw
* dump answer: the reference calls, then the reference answer with every tool output pasted after it
* read-everything: the reference calls, every read tool on every id seen, and all of it pasted
"""

import json

import pytest

from envace.core.errors import is_error
from envace.core.toolcall import format_tool_call
from envace.core.types import ToolCall
from envace.envs.registry import world_class, world_names
from envace.envs.tasks import load_tasks
from envace.rollout.actors import ActorTurn
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.sources import RealSource

STRATEGIES = ["blind_dump", "unrelated_write", "collateral_writes", "dump_answer", "read_everything"]
SAMPLE = 24  # tasks per world


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


@pytest.mark.parametrize("world", world_names())
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_no_cheat_scores_full_marks(world, strategy):
    tasks = load_tasks(world, "test", limit=SAMPLE)
    writes = world_class(world).writing_tools
    trajs, _ = run_episodes(tasks, Cheat(strategy, writes), RealSource(), RolloutConfig(max_turns=12))
    tried = [(t, traj) for t, traj in zip(tasks, trajs) if _cheated(strategy, traj, len(t.reference.calls))]
    full = [traj.task_id for _, traj in tried if traj.reward >= 1.0]
    assert not full, f"{strategy} scored 1.0 on {full}"
    if strategy in ("blind_dump", "dump_answer", "read_everything"):
        assert len(tried) == len(tasks)
    else:
        assert len(tried) >= 3, f"{strategy} could be carried out on only {len(tried)} {world} tasks"


def test_the_reference_solution_still_scores_full_marks():
    for world in world_names():
        tasks = load_tasks(world, "test", limit=SAMPLE)

        class Oracle(Cheat):
            def turn(self, task, history):
                done = sum(1 for m in history if m.role == "assistant")
                calls = task.reference.calls
                return format_tool_call(calls[done]) if done < len(calls) else task.reference.answer

        trajs, _ = run_episodes(tasks, Oracle("oracle", set()), RealSource(), RolloutConfig(max_turns=12))
        assert all(t.reward == 1.0 for t in trajs)
