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
from envace.core.safejson import clean_text
from envace.core.toolcall import RESULT_CLOSE, parse_execution_result
from envace.core.types import EnvRef, Source, Task, ToolCall, TurnSample
from envace.envs.provider import WorldProvider
from envace.envs.registry import resolve_world, spec_key
from envace.core.sampling import SamplingParams


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
    """What the caller sees of a result: JSON text that tokenizes and writes whatever the tool
    returned (a user's environment may return NaN, odd objects or lone surrogates)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        text = json.dumps(str(value), ensure_ascii=False)
    return clean_text(text)


class RealSource:
    """The real environment of each task: its ``env.world``, else ``world`` (the run's
    ``--world``). Providers are resolved once per spec; every episode gets a fresh environment,
    closed by :meth:`finish`, and :meth:`close` releases the providers (MCP servers, loops)."""

    name: Source = "real"

    def __init__(self, world: Any = None) -> None:
        self.world = world
        self._providers: dict[str, WorldProvider] = {}

    def provider(self, task: Task) -> WorldProvider:
        # getattr / setdefault: a subclass that does not call __init__ still works
        spec = task.env.world if task.env is not None and task.env.world else getattr(self, "world", None)
        if spec is None:
            raise ValueError(f"task {task.id} has no 'env' world and the run names none (--world): "
                             "it cannot run against a real environment")
        key = spec_key(spec)
        providers = self.__dict__.setdefault("_providers", {})
        if key not in providers:
            providers[key] = resolve_world(spec)
        return providers[key]

    def start(self, task: Task) -> Any:
        provider = self.provider(task)
        return _Opened(provider, provider.open(task.env or EnvRef()))

    def respond(self, requests: list[ToolRequest]) -> list[ToolResponse]:
        # Environments that can (MCP) run the batch's calls concurrently, one per episode.
        futures = [r.state.environment.submit(r.call.name, r.call.arguments)
                   if hasattr(r.state.environment, "submit") else None for r in requests]
        out = []
        for r, fut in zip(requests, futures):
            if fut is None:
                value = r.state.environment.call(r.call.name, r.call.arguments)
            else:
                value = fut.result()
            out.append(ToolResponse(text=dump_result(value), rehearsed=False))
        return out

    def finish(self, state: Any) -> None:
        if isinstance(state, _Opened):
            state.provider.close_environment(state.environment)

    def close(self) -> None:
        providers = self.__dict__.get("_providers", {})
        for p in providers.values():
            p.shutdown()
        providers.clear()


@dataclass
class _Opened:
    provider: WorldProvider
    environment: Any

    @property
    def query(self) -> Any:
        """``state`` checklist items run here; a world without SQL state has no ``query``."""
        return getattr(self.environment, "query")

    @property
    def calls(self) -> Any:
        return getattr(self.environment, "calls", [])


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
