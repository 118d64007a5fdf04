"""Typed records that cross package boundaries: tasks, tools, messages, samples, trajectories.

Pydantic models so that a malformed task file fails with the field that is wrong, and so that
every record has one JSON form (``model_dump(mode="json")``) for the JSONL files of a run.
"""

from __future__ import annotations

from typing import Any, Literal

import jsonschema
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_serializer

from envace.core.patterns import schema_patterns, unsafe_pattern

Role = Literal["caller", "simulator"]
Source = Literal["real", "simulator", "rehearsal"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionSpec(_Strict):
    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    @field_validator("parameters")
    @classmethod
    def _safe_patterns(cls, parameters: dict[str, Any]) -> dict[str, Any]:
        for where, pattern in schema_patterns(parameters):
            if why := unsafe_pattern(pattern):
                raise ValueError(f"{where or 'parameters'}.pattern {pattern!r}: {why}")
        return parameters


class ToolSpec(_Strict):
    """One tool in the OpenAI / Hermes function format that chat templates expect."""

    type: Literal["function"] = "function"
    function: FunctionSpec
    # MCP-style behaviour hints (readOnlyHint, destructiveHint, ...) beside "function", as MCP
    # servers and envace's Python tool decorator give them; absent means unknown (a write).
    annotations: dict[str, Any] | None = None
    # The declared shape of the tool's result (MCP's outputSchema; a JSON schema): rehearsed
    # results are checked against it (rollout/sources.py output_shape_error).
    output_schema: dict[str, Any] | None = Field(None, validation_alias=AliasChoices("output_schema", "outputSchema"))

    @property
    def name(self) -> str:
        return self.function.name

    @field_validator("output_schema")
    @classmethod
    def _valid_output_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is None:
            return None
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.exceptions.SchemaError as e:
            raise ValueError(f"not a JSON schema: {e.message}") from None
        for where, pattern in schema_patterns(schema):
            if why := unsafe_pattern(pattern):
                raise ValueError(f"{where or 'output_schema'}.pattern {pattern!r}: {why}")
        return schema

    @model_serializer(mode="wrap")
    def _omit_absent_annotations(self, handler: Any) -> dict[str, Any]:
        # Absent stays absent in every dump, so prompts and files of tools without hints are unchanged.
        out = handler(self)
        if isinstance(out, dict):
            for key in ("annotations", "output_schema"):
                if out.get(key) is None:
                    out.pop(key, None)
        return out


class ToolCall(_Strict):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ChecklistItem(_Strict):
    """One success criterion. Which fields are used depends on ``kind``.

    called: ``tool`` was called with arguments that include ``args`` (subset match).
    state: ``query`` run on the final world DB returns exactly ``equals`` (real source only).
    answer_contains: the final answer contains ``text`` (case-insensitive).
    judge: an LLM judge says the trajectory meets ``criterion``.
    end_state: every table of the final world DB (or those in ``digests``) equals the reference
    solution's final state (``digests``: table -> sha256 of its sorted rows), so a write the
    task did not ask for fails it (real source only).

    answer_plain: the final answer is a reply, not a dump: non-empty, at most ``max_chars``, no
    pasted JSON tool output (so pasting everything the tools said earns nothing).
    answer_excludes: the final answer states at most ``max_found`` (default 0) of ``texts``: other
    records' values, or values nobody asked for, so that an answer listing every value seen fails.
    writes: the episode's successful write calls are the reference's, tool and arguments (judged
    on the calls, so also in rehearsal; added by the reward to every task with a ``reference``).
    """

    kind: Literal["called", "state", "answer_contains", "judge", "end_state", "answer_plain",
                  "answer_excludes", "writes"]
    tool: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    query: str | None = None
    equals: list[list[Any]] | None = None
    text: str | None = None
    criterion: str | None = None
    digests: dict[str, str] | None = None
    max_chars: int | None = Field(None, ge=1)
    texts: list[str] | None = None
    max_found: int | None = Field(None, ge=0)


class Example(_Strict):
    """A real call/result pair from the task's world, shown to the simulator as grounding."""

    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: Any


class EnvRef(_Strict):
    """Which real environment a task runs in, and how to start it for an episode.

    ``world``: a registered world (``shop``), an import path (``pkg.module:Name`` or
    ``path/to/tools.py:Name``), or an MCP server (``mcp:COMMAND ...`` / ``http://.../mcp``); None
    means the run's ``--world``. ``seed`` builds an embedded SQLite world; ``args`` go to a Python
    tool class's ``reset(**args)`` or an MCP server's reset tool.
    """

    world: str | None = None
    seed: int = 0
    args: dict[str, Any] = Field(default_factory=dict)


class ReferenceCall(ToolCall):
    """A reference call, optionally with ``result``: what the real tool answered when the solution
    was recorded. With every call's result recorded, the warm start can replay the reference with
    no world at all (a ``null`` result counts as not recorded)."""

    result: Any = None


class Reference(_Strict):
    """The generator's known solution: used by the scripted oracle and SFT, never shown to a policy."""

    calls: list[ReferenceCall] = Field(default_factory=list)
    answer: str = ""
    # Which tools change state (overrides the tools' annotations; see core.tools), and per tool
    # the arguments a solution may choose freely: the reward compares every other argument of
    # every write with the reference's.
    write_tools: list[str] | None = None
    free_args: dict[str, list[str]] = Field(default_factory=dict)

    @field_validator("calls", mode="before")
    @classmethod
    def _plain_calls(cls, calls: Any) -> Any:
        # A generator's ToolCall objects are reference calls without recorded results.
        if isinstance(calls, list):
            return [c.model_dump() if isinstance(c, ToolCall) and not isinstance(c, ReferenceCall) else c
                    for c in calls]
        return calls

    @field_validator("calls")
    @classmethod
    def _results_all_or_none(cls, calls: list[ReferenceCall]) -> list[ReferenceCall]:
        # A replay needs every call's answer: one missing result leaves the next turn without context.
        have = [c.result is not None for c in calls]
        if any(have) and not all(have):
            i = have.index(False)
            raise ValueError(f"calls[{i}].result is missing while other calls carry one: record every "
                             "call's result, or none")
        return calls

    @property
    def recorded(self) -> bool:
        """Every call carries its recorded result: the reference replays without a world."""
        return bool(self.calls) and all(c.result is not None for c in self.calls)


class Task(_Strict):
    id: str = Field(min_length=1)
    domain: str = ""
    instruction: str = Field(min_length=1)
    # Empty: the tools come from the run's real world (a Python tool set or an MCP server's listing).
    tools: list[ToolSpec] = Field(default_factory=list)
    checklist: list[ChecklistItem] = Field(default_factory=list)
    examples: list[Example] = Field(default_factory=list)
    env: EnvRef | None = None
    split: Literal["train", "test"] | None = None
    difficulty: int | None = None
    reference: Reference | None = None

    def tool(self, name: str) -> ToolSpec | None:
        for t in self.tools:
            if t.name == name:
                return t
        return None


class Message(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    name: str | None = None  # tool name, for role == "tool"
    rehearsed: bool | None = None  # for role == "tool": imagined by a model (True) or real (False)


class TurnSample(_Strict):
    """One generated turn: the unit of GRPO training."""

    role: Role
    group_id: str  # task id: advantages are pooled per (group_id, role)
    trajectory_index: int  # which of the G trajectories of the group
    turn: int
    prompt_ids: list[int]
    gen_ids: list[int]
    logprobs: list[float]
    finish: Literal["stop", "length"] = "stop"
    format_ok: bool | None = None  # simulator turns: the output parsed as JSON inside the tags
    # Which gen_ids carry loss (None: all). A merged multi-turn SFT sample holds several caller
    # turns with the tool messages between them, which are context, not targets.
    loss_mask: list[bool] | None = None

    @property
    def target_count(self) -> int:
        return len(self.gen_ids) if self.loss_mask is None else sum(self.loss_mask)


class Verdict(_Strict):
    item: ChecklistItem
    # None: not judged (a state item without a real world, a judge that did not answer). Defaults
    # to None because run files are written without None fields and must read back.
    met: bool | None = None
    detail: str = ""


def solved(reward: float) -> bool:
    """A task counts as solved when its checklist reward is full: 1.0 means every item met."""
    return reward >= 1.0


class Trajectory(_Strict):
    task_id: str
    source: Source
    trajectory_index: int = 0
    messages: list[Message]
    samples: list[TurnSample] = Field(default_factory=list)
    reward: float = 0.0
    verdicts: list[Verdict] = Field(default_factory=list)
    stop_reason: Literal["final_answer", "max_turns", "context_limit", "length"] = "final_answer"
    tool_calls: int = 0
    parse_failures: int = 0
    sim_format_failures: int = 0  # rehearsed/simulated responses that were not JSON in the tags
    timings: dict[str, float] = Field(default_factory=dict)

    @property
    def solved(self) -> bool:
        return solved(self.reward)

    @property
    def final_answer(self) -> str:
        for m in reversed(self.messages):
            if m.role == "assistant":
                return m.content if not m.tool_calls else ""
        return ""


def trajectory_calls(traj: Trajectory) -> list[tuple[ToolCall, Message]]:
    """Each tool call with the tool message that answered it.

    The engine appends one tool message per call, in call order, right after the assistant turn.
    """
    out: list[tuple[ToolCall, Message]] = []
    msgs = traj.messages
    for i, m in enumerate(msgs):
        if m.role != "assistant" or not m.tool_calls:
            continue
        answers = [r for r in msgs[i + 1 : i + 1 + len(m.tool_calls)] if r.role == "tool"]
        out.extend(zip(m.tool_calls, answers))
    return out
