"""Who writes the caller's turns: the policy (sampled, recorded for training) or a scripted oracle
that replays a task's reference solution (the consistency check of tasks, and SFT data)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from envace.core.prompts import PromptStyle, render_caller_prompt
from envace.core.toolcall import CALL_CLOSE, format_tool_call
from envace.core.types import Message, Task
from envace.core.sampling import SamplingParams


@dataclass
class ActorView:
    task: Task
    history: list[Message]  # assistant and tool messages so far
    turn: int
    memory: str = ""  # test-time rehearsal memory for the caller's prompt (envace.testtime)


@dataclass
class ActorTurn:
    text: str
    prompt_ids: list[int] = field(default_factory=list)
    gen_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str = "stop"

    @property
    def trainable(self) -> bool:
        return bool(self.prompt_ids)


class Actor(Protocol):
    def act(self, views: list[ActorView], turn: int) -> list[ActorTurn | None]:
        """One turn per view, batched; None where the episode's prompt no longer fits."""


@dataclass
class PolicyActor:
    backend: Any
    style: PromptStyle = field(default_factory=PromptStyle)
    max_new_tokens: int = 96
    max_prompt_tokens: int = 2048
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None

    def act(self, views: list[ActorView], turn: int) -> list[ActorTurn | None]:
        tok = self.backend.tokenizer
        prompts = [render_caller_prompt(tok, v.task, v.history, self.style, v.memory) for v in views]
        fits = [i for i, p in enumerate(prompts) if len(p) <= self.max_prompt_tokens]
        out: list[ActorTurn | None] = [None] * len(views)
        if not fits:
            return out
        params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p,
                                stop=[CALL_CLOSE], seed=None if self.seed is None else self.seed + 7919 * turn)
        gens = self.backend.generate([prompts[i] for i in fits], params)
        for i, g in zip(fits, gens):
            out[i] = ActorTurn(text=g.text, prompt_ids=prompts[i], gen_ids=list(g.token_ids),
                               logprobs=list(g.logprobs), finish=g.finish)
        return out


class OracleActor:
    """Replays ``task.reference``: one reference call per turn, then the reference answer."""

    def act(self, views: list[ActorView], turn: int) -> list[ActorTurn | None]:
        out: list[ActorTurn | None] = []
        for v in views:
            ref = v.task.reference
            if ref is None:
                raise ValueError(f"task {v.task.id} has no reference solution for the oracle")
            done = sum(1 for m in v.history if m.role == "assistant")
            text = format_tool_call(ref.calls[done]) if done < len(ref.calls) else ref.answer
            out.append(ActorTurn(text=text))
        return out
