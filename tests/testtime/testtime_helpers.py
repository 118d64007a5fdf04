"""Real actors and sources for the test-time tests (no mocks): scripted callers and a world model
that is exactly right (it replays the real world), to check the metrics' upper end."""

from __future__ import annotations

import json

from envace.core.toolcall import format_tool_call
from envace.core.types import Message, Task, ToolCall, Trajectory
from envace.envs.registry import make_world
from envace.rollout.actors import ActorTurn
from envace.rollout.sources import ToolRequest, ToolResponse


class AttemptActor:
    """Attempt n (counted by turn-0 calls) searches for ``q{n}`` then answers ``answer-{n}``;
    records the memory each attempt's views carried."""

    def __init__(self):
        self.attempt = -1
        self.memories: list[list[str]] = []

    def act(self, views, turn):
        if turn == 0:
            self.attempt += 1
            self.memories.append([v.memory for v in views])
        n = self.attempt
        if turn == 0:
            text = format_tool_call(ToolCall(name="search_products", arguments={"query": f"q{n}"}))
        else:
            text = f"answer-{n}"
        return [ActorTurn(text=text) for _ in views]


class ReplayWorldModel:
    """A perfect world model: answers a call by replaying the episode's earlier calls on a fresh
    world of the task and making the call there."""

    name = "simulator"

    def start(self, task: Task):
        return None

    def respond(self, requests: list[ToolRequest]) -> list[ToolResponse]:
        out = []
        for r in requests:
            world = make_world(r.task.env.world, r.task.env.seed)
            for call, _ in r.earlier:
                world.call(call.name, call.arguments)
            out.append(ToolResponse(text=json.dumps(world.call(r.call.name, r.call.arguments)), rehearsed=True))
        return out


def traj_of(task_id: str, steps: list[tuple[str, list[str]]], final: str | None, source: str = "rehearsal") -> Trajectory:
    """A hand-made trajectory: each step is (assistant text with tool calls, tool message texts)."""
    from envace.core.toolcall import parse_tool_calls

    msgs = [Message(role="user", content="do it")]
    for text, answers in steps:
        parsed = parse_tool_calls(text)
        msgs.append(Message(role="assistant", content=text, tool_calls=parsed.calls))
        for a, call in zip(answers, parsed.calls or [None] * len(answers)):
            msgs.append(Message(role="tool", name=call.name if call else None, content=a, rehearsed=True))
    stop = "max_turns"
    if final is not None:
        msgs.append(Message(role="assistant", content=final))
        stop = "final_answer"
    return Trajectory(task_id=task_id, source=source, messages=msgs, stop_reason=stop)


def few_tasks(world: str, k: int, split: str = "test") -> list[Task]:
    """The first ``k`` tasks of a split, generating only the first 40 of the suite (the same
    tasks load_tasks gives: task i always has seed i and the same split)."""
    from envace.envs.tasks import generate_tasks

    return generate_tasks(world, n=40, split=split)[:k]
