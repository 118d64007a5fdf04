"""Response sources: who answers a valid tool call. One interface, swappable per run.

* ``real``: an executable world (ground truth, and the costly baseline): :class:`RealSource`.
* ``rehearsal`` / ``simulator``: a model under the simulator prompt, the policy itself (its turns
  are training samples) or a frozen one: :class:`envace.rollout.rehearse.ModelSource`.

Also here: what both share (requests, responses, :func:`dump_result`) and the grounding helpers
the rehearse role uses (recorded examples, output shapes, :func:`example_match_score`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from envace.core import safejson
from envace.core.errors import is_error
from envace.core.safejson import clean_text
from envace.core.tools import writes_of
from envace.core.types import EnvRef, Example, Source, Task, ToolCall, ToolSpec, TurnSample
from envace.core.validate import schema_error
from envace.envs.provider import WorldProvider
from envace.envs.registry import resolve_world, spec_key


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


def _normal(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {str(k): _normal(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    """The JSON text two equal values share: keys sorted, ``1.0`` written as ``1`` (booleans stay
    booleans), no spaces. Values JSON cannot write compare by their text."""
    try:
        return json.dumps(_normal(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return json.dumps(str(value), ensure_ascii=False)


def example_for(task: Task, call: ToolCall) -> Example | None:
    """The task's first recorded example of this exact call: the same tool and the same arguments
    after JSON normalisation (key order, ``1`` vs ``1.0``); None when no example records it."""
    if not task.examples:
        return None
    key = canonical_json(call.arguments)
    for ex in task.examples:
        if ex.tool == call.name and canonical_json(ex.arguments) == key:
            return ex
    return None


def record_holds(task: Task, earlier: list[tuple[ToolCall, str]]) -> bool:
    """Whether a recorded result can still be the answer: examples record the task's initial state,
    so they hold until the episode makes a write (a call of a tool that writes, per the task's
    ``reference.write_tools`` or the tools' ``readOnlyHint`` annotations; unknown counts as a write)
    that did not fail. After one, a recorded read may be stale and the rehearse role answers."""
    writes = None
    for call, text in earlier:
        writes = writes or writes_of(task)
        if not writes(call.name):
            continue
        value, why = safejson.loads(text) if isinstance(text, str) else (None, "not text")
        if not (why is None and is_error(value)):
            return False
    return True


def output_schema_of(spec: ToolSpec | None) -> dict[str, Any] | None:
    """The tool's declared output shape: an ``output_schema`` / ``outputSchema`` (MCP's name) on the
    tool or its function; None when none is declared."""
    if spec is None:
        return None
    for holder in (spec.function, spec):
        for key in ("output_schema", "outputSchema"):
            found = getattr(holder, key, None)
            if found is None:
                found = (getattr(holder, "model_extra", None) or {}).get(key)
            if isinstance(found, dict) and found:
                return found
    return None


def output_shape_error(task: Task, call: ToolCall, value: Any) -> str | None:
    """Why a result does not fit the tool's declared output shape, or None (it fits, the tool
    declares none, or the result is a structured tool error, which any tool may return)."""
    schema = output_schema_of(task.tool(call.name))
    if schema is None or is_error(value):
        return None
    return schema_error(value, schema)


def _leaves(value: Any, path: str = "") -> list[str]:
    """(path, scalar) leaves of a JSON value, list positions left out (an order-free multiset)."""
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{path}/{k}")]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v, path + "/*")] or [path + "=[]"]
    return [path + "=" + canonical_json(value)]


def example_match_score(recorded: Any, text: str, format_ok: bool = True) -> float:
    """How well a rehearsed response (its text) reproduces a recorded result, in [0, 1]: 1 for the
    same JSON value, 0 for output that is not JSON in the tags, else the F1 of their (path, value)
    leaves (a missing field and an invented one both cost). The rehearse role's reward for a call
    that matches a recorded example where ``rollout.example_reward`` is on."""
    if not format_ok:
        return 0.0
    value, why = safejson.loads(text) if isinstance(text, str) else (None, "not text")
    if why is not None:
        return 0.0
    if canonical_json(value) == canonical_json(recorded):
        return 1.0
    want, got = _leaves(recorded), _leaves(value)
    common = sum((Counter(want) & Counter(got)).values())
    if not common:
        return 0.0
    precision, recall = common / len(got), common / len(want)
    return 2 * precision * recall / (precision + recall)
