"""Prompt rendering for both roles through the tokenizer's own chat template.

Assistant turns are rendered from their raw generated text (tool-call tags included) so that the
prompt of turn k+1 contains exactly the tokens the policy produced at turn k.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from envace.core.toolcall import RESULT_OPEN
from envace.core.types import Message, Task, ToolCall, ToolSpec

ToolFormat = Literal["native", "compact", "json"]
SimulatorContext = Literal["call", "conversation"]

CALLER_SYSTEM = (
    "You are an assistant for a {domain} service. Use the tools to do what the user asks. "
    'To call a tool write <tool_call>{{"name": "tool_name", "arguments": {{...}}}}</tool_call> and stop; '
    "the result comes back in the next message. When the task is done, reply to the user "
    "without any tool call, stating the key values (ids, amounts, dates)."
)

SIMULATOR_SYSTEM = (
    "You are the {domain} service's API. You receive one tool call and must answer exactly as the "
    "real system would, consistent with the examples and the earlier results. First validate the "
    "call: unknown tool -> TOOL_NOT_AVAILABLE, wrong or missing arguments -> INVALID_PARAMETERS, "
    "unknown ids -> a NOT_FOUND error. Errors look like "
    '{{"error": {{"code": "CODE", "message": "..."}}}}. '
    "Reply with the JSON result only, inside <execution_result></execution_result>."
)


# Test-time private rehearsal: what the agent learned in its imagined attempts, shown to the
# caller of the committed real run. Marked as imagined so the caller still checks real results.
MEMORY_HEADER = (
    "Notes from your private rehearsal of this task (imagined tool results, not real ones; "
    "use them to avoid mistakes, but trust the real results):"
)


# How deep a nested argument is spelled out (each $ref, union, list or object is a level): a
# recursive schema stops here instead of looping. experiments/chat_template.py mirrors all of this.
MAX_TYPE_DEPTH = 6


def _resolve_ref(ref: str, root: dict[str, Any]) -> Any:
    """A local JSON pointer (``#/$defs/Name``) in the tool's parameters; None where it leads nowhere."""
    node: Any = root
    for seg in ref[2:].split("/"):
        if not isinstance(node, dict) or seg not in node:
            return None
        node = node[seg]
    return node


def _type_of(prop: Any, root: dict[str, Any] | None = None, depth: int = 0) -> str:
    """An argument's type in a few tokens. A flat argument reads as it always has (``string``,
    ``"a"|"b"``, ``list[string]``, ``string|null``); a nested one shows its keys, which of them
    are optional and their types: ``{status?: "open"|"closed", labels?: list[string]}``."""
    if not isinstance(prop, dict) or depth > MAX_TYPE_DEPTH:
        return "any"
    root = root if root is not None else {}
    ref = prop.get("$ref")
    if isinstance(ref, str):
        return _type_of(_resolve_ref(ref, root), root, depth + 1) if ref.startswith("#/") else "any"
    if "enum" in prop:
        values = prop["enum"] if isinstance(prop["enum"], list) else [prop["enum"]]
        return "|".join(json.dumps(v) for v in values)
    if "const" in prop:
        return json.dumps(prop["const"])
    for key in ("anyOf", "oneOf"):
        if isinstance(prop.get(key), list) and prop[key]:
            alts: list[str] = []
            for a in prop[key]:
                s = _type_of(a, root, depth + 1)
                if s not in alts:
                    alts.append(s)
            return "|".join(alts)
    if isinstance(prop.get("allOf"), list) and len(prop["allOf"]) == 1:
        return _type_of(prop["allOf"][0], root, depth + 1)
    t = prop.get("type", "object" if isinstance(prop.get("properties"), dict) else "any")
    if isinstance(t, list):
        return "|".join(_one_type(prop, x, root, depth) for x in t)
    return _one_type(prop, t, root, depth)


def _one_type(prop: dict[str, Any], t: Any, root: dict[str, Any], depth: int) -> str:
    if t == "array":
        return f"list[{_type_of(prop.get('items', {}), root, depth + 1)}]"
    if t == "object":
        props, extra = prop.get("properties"), prop.get("additionalProperties")
        if isinstance(props, dict) and props:
            required = prop.get("required") if isinstance(prop.get("required"), list) else []
            return "{" + _args(props, required, root, depth + 1) + "}"
        if isinstance(extra, dict) and extra:
            return f"dict[string, {_type_of(extra, root, depth + 1)}]"
    return t if isinstance(t, str) else json.dumps(t)


def _args(props: dict[str, Any], required: list[Any], root: dict[str, Any], depth: int) -> str:
    return ", ".join(f"{k}{'' if k in required else '?'}: {_type_of(v, root, depth)}" for k, v in props.items())


def compact_signature(tool: ToolSpec) -> str:
    """``name(a: string, b?: integer) - description``: a few tokens instead of a JSON schema."""
    params = tool.function.parameters
    props, required = params.get("properties"), params.get("required")
    args = _args(props if isinstance(props, dict) else {}, required if isinstance(required, list) else [],
                 params, 0)
    desc = f" - {tool.function.description}" if tool.function.description else ""
    return f"{tool.name}({args}){desc}"


def tools_text(tools: list[ToolSpec], fmt: ToolFormat) -> str:
    if fmt == "json":
        return "\n".join(json.dumps(t.model_dump(mode="json"), ensure_ascii=False) for t in tools)
    return "\n".join(compact_signature(t) for t in tools)


def template_supports_tools(tokenizer: Any) -> bool:
    tmpl = getattr(tokenizer, "chat_template", None) or ""
    return isinstance(tmpl, str) and "tools" in tmpl


class PromptStyle(BaseModel):
    """How both roles' prompts are rendered: the ``prompt:`` section of a training config, as is."""

    # strict and closed as every config section: a typo or a string number is an error
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    tool_format: ToolFormat = Field("compact", description="how the tool list is rendered in the caller's "
                                    "prompt: compact (one signature a tool), json (the schemas) or native (the "
                                    "model's own chat template, where it takes tools)")
    max_examples: int = Field(3, ge=0, description="real call/result pairs shown to the simulator")
    max_history_results: int = Field(6, ge=0, description="earlier results of this episode shown to the simulator")
    prefill_result_tag: bool = Field(True, description="start the simulator's answer with <execution_result>")
    simulator_context: SimulatorContext = Field(
        "call", description="what the rehearse role sees: call (the tool's signature, examples, earlier results) "
        "or conversation (also the user's request and the whole tool list, as the paper's simulator)")


def _encode(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> list[int]:
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
    if tools is not None:
        kwargs["tools"] = tools
    text = tokenizer.apply_chat_template(messages, **kwargs)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def caller_chat(task: Task, history: list[Message], style: PromptStyle, native_tools: bool,
                memory: str = "") -> list[dict]:
    """The caller's chat; a non-empty ``memory`` (rehearsal notes) ends the system message."""
    system = CALLER_SYSTEM.format(domain=task.domain or "customer")
    if not native_tools:
        system += "\nTools:\n" + tools_text(task.tools, style.tool_format)
    if memory.strip():
        system += "\n" + MEMORY_HEADER + "\n" + memory.strip()
    chat = [{"role": "system", "content": system}, {"role": "user", "content": task.instruction}]
    for m in history:
        chat.append({"role": m.role, "content": m.content})
    return chat


def render_caller_prompt(tokenizer: Any, task: Task, history: list[Message], style: PromptStyle,
                         memory: str = "") -> list[int]:
    """Token ids of the caller's next-turn prompt. ``history`` holds assistant and tool messages;
    ``memory`` is the test-time rehearsal memory (empty: the plain prompt)."""
    native = style.tool_format == "native" and template_supports_tools(tokenizer)
    chat = caller_chat(task, history, style, native, memory)
    return _encode(tokenizer, chat, [t.model_dump(mode="json") for t in task.tools] if native else None)


def simulator_chat(
    task: Task, call: ToolCall, earlier: list[tuple[ToolCall, str]], style: PromptStyle
) -> list[dict]:
    spec = task.tool(call.name)
    # Examples of the called tool first: they show its result shape; the others ground ids and values.
    examples = sorted(task.examples, key=lambda e: e.tool != call.name)[: style.max_examples]
    parts = []
    if style.simulator_context == "conversation":
        parts += [f"User request: {task.instruction}", "Tools:", tools_text(task.tools, "compact")]
    parts.append(f"Tool: {compact_signature(spec) if spec else call.name + ' (not in the tool list)'}")
    if spec is None and style.simulator_context == "call":
        parts.append("Available tools: " + ", ".join(t.name for t in task.tools))
    if examples:
        parts.append("Examples of real calls:")
        parts += [f"{json.dumps({'name': e.tool, 'arguments': e.arguments})} -> {json.dumps(e.result)}"
                  for e in examples]
    if earlier:
        parts.append("Earlier in this session:")
        parts += [f"{json.dumps({'name': c.name, 'arguments': c.arguments})} -> {r}"
                  for c, r in earlier[-style.max_history_results:]]
    parts.append(f"Call: {json.dumps({'name': call.name, 'arguments': call.arguments})}")
    return [
        {"role": "system", "content": SIMULATOR_SYSTEM.format(domain=task.domain or "customer")},
        {"role": "user", "content": "\n".join(parts)},
    ]


def render_simulator_prompt(
    tokenizer: Any, task: Task, call: ToolCall, earlier: list[tuple[ToolCall, str]], style: PromptStyle
) -> list[int]:
    ids = _encode(tokenizer, simulator_chat(task, call, earlier, style))
    if style.prefill_result_tag:
        ids += list(tokenizer(RESULT_OPEN, add_special_tokens=False)["input_ids"])
    return ids


__all__ = [
    "PromptStyle", "render_caller_prompt", "MEMORY_HEADER", "render_simulator_prompt", "compact_signature",
    "caller_chat", "simulator_chat", "template_supports_tools"
]
