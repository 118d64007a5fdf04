"""Response sources: who answers a valid tool call. One interface, swappable per run.

* ``real``: an executable world (ground truth, and the costly baseline).
* ``rehearsal``: the policy itself under the simulator prompt; its turns are training samples.
* ``simulator``: a separate frozen model under the same prompt (the external-simulator baseline).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from envace.core.prompts import PromptStyle, render_simulator_prompt
from envace.core.toolcall import RESULT_CLOSE, parse_execution_result
from envace.core.types import Source, Task, ToolCall, TurnSample
from envace.envs.registry import make_world
from envace.policy.sampling import SamplingParams


@dataclass
class ToolRequest:
    task: Task
    call: ToolCall
    earlier: list[tuple[ToolCall, str]]  # this episode's earlier calls and the text the caller saw
    state: Any  # what the source's ``start`` returned for this episode
    trajectory_index: int
    turn: int


@dataclass
class ToolResponse:
    text: str  # what the caller sees as the tool message
    rehearsed: bool
    format_ok: bool = True  # the simulator's output parsed as JSON inside the tags
    sample: TurnSample | None = None  # a simulator-role training sample (rehearsal only)
    gen_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class ResponseSource(Protocol):
    name: Source

    def start(self, task: Task) -> Any:
        """Per-episode state (a fresh world for ``real``); passed back in each request."""

    def respond(self, requests: list[ToolRequest]) -> list[ToolResponse]:
        """Answer a batch of calls from many episodes at once."""


def dump_result(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class RealSource:
    name: Source = "real"

    def start(self, task: Task) -> Any:
        if task.env is None:
            raise ValueError(f"task {task.id} has no 'env': it cannot run against a real world")
        return make_world(task.env.world, task.env.seed)

    def respond(self, requests: list[ToolRequest]) -> list[ToolResponse]:
        return [ToolResponse(text=dump_result(r.state.call(r.call.name, r.call.arguments)), rehearsed=False)
                for r in requests]


@dataclass
class ModelSource:
    """A model writing tool responses under the simulator prompt.

    ``record_samples`` is what separates rehearsal (the policy; its turns are trained) from the
    external simulator (frozen; nothing recorded).
    """

    backend: Any
    name: Source = "rehearsal"
    record_samples: bool = True
    style: PromptStyle = field(default_factory=PromptStyle)
    max_new_tokens: int = 96
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None

    def start(self, task: Task) -> Any:
        return None

    def respond(self, requests: list[ToolRequest]) -> list[ToolResponse]:
        if not requests:
            return []
        tok = self.backend.tokenizer
        prompts = [render_simulator_prompt(tok, r.task, r.call, r.earlier, self.style) for r in requests]
        params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                                top_p=self.top_p, stop=[RESULT_CLOSE], seed=self.seed)
        t0 = time.perf_counter()
        gens = self.backend.generate(prompts, params)
        per = (time.perf_counter() - t0) / len(requests)
        prefix = "<execution_result>" if self.style.prefill_result_tag else ""
        out = []
        for r, p, g in zip(requests, prompts, gens):
            parsed = parse_execution_result(prefix + g.text)
            sample = None
            if self.record_samples:
                sample = TurnSample(role="simulator", group_id=r.task.id, trajectory_index=r.trajectory_index,
                                    turn=r.turn, prompt_ids=p, gen_ids=list(g.token_ids),
                                    logprobs=list(g.logprobs), finish=g.finish, format_ok=parsed.ok)
            out.append(ToolResponse(text=parsed.text, rehearsed=True, format_ok=parsed.ok, sample=sample,
                                    gen_seconds=per, extra={"gen_tokens": len(g.token_ids)}))
        return out
