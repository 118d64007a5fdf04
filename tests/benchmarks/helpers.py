"""Test helpers: a scripted actor that replays known calls through the benchmark episode loop."""

from __future__ import annotations

from envace.core.toolcall import format_tool_call
from envace.core.types import ToolCall
from envace.rollout.actors import ActorTurn, ActorView


class ReplayActor:
    """Per task id, per user turn, a list of steps (each a list of calls); then a final answer."""

    def __init__(self, plans: dict[str, list[list[list[ToolCall]]]], answer: str = "Done.") -> None:
        self.plans, self.answer = plans, answer

    def act(self, views: list[ActorView], turn: int) -> list[ActorTurn | None]:
        out = []
        for v in views:
            user_turn = sum(1 for m in v.history if m.role == "user")
            since = 0
            for m in reversed(v.history):
                if m.role == "user":
                    break
                since += m.role == "assistant"
            plan = self.plans.get(v.task.id, [])
            steps = plan[user_turn] if user_turn < len(plan) else []
            if since < len(steps) and steps[since]:
                out.append(ActorTurn(text="".join(format_tool_call(c) for c in steps[since])))
            else:
                out.append(ActorTurn(text=self.answer))
        return out
