"""The chat template an exported model ships with: envace's caller prompt (core/prompts.py) in Jinja.

Training renders the caller's prompt itself: the tool list goes into the system message as text
(``tool_format`` compact or json, or native where the model's own template takes ``tools=``), and
an assistant turn is its raw text, ``<tool_call>`` tags included. A plain transformers user calls
``tokenizer.apply_chat_template(messages, tools=[...])`` instead, so the exported template does
what :func:`envace.core.prompts.caller_chat` does before handing the chat to the model's own
template:

* ``tools`` given: the system message gets ``"\\nTools:\\n"`` and the tool list in the run's
  format; without a system message, envace's caller system prompt is put first (its domain from
  the ``domain=`` template argument, else the one baked in at export).
* an assistant message with structured ``tool_calls`` (OpenAI ``{"type": "function", "function":
  {"name", "arguments"}}``, arguments a dict or JSON text, or envace's ``{"name", "arguments"}``)
  is written as the ``<tool_call>`` text the policy was trained to write, unless its content
  already holds that text (envace's own trajectories keep the raw turn).
* messages are passed on as role and content only, as training did.

``native`` with a template that takes tools is left as it is: training passed the tools to it.
Jinja cannot parse JSON, so a call's arguments given as JSON text are copied as they are: the
rendered call matches training's ``json.dumps`` form when that text is ``json.dumps(arguments,
ensure_ascii=False)`` (what ``envace export trajectories`` writes).
"""

from __future__ import annotations

import json
import re
from typing import Any

from envace.core.prompts import CALLER_SYSTEM, PromptStyle, template_supports_tools

MARK = "{#- envace tool-calling template (envace export); the model's own template follows it -#}"
BASE_MARK = "{#- envace: base template -#}"
_DOMAIN = "\x00"

# One line, no whitespace between tags: transformers renders with trim_blocks/lstrip_blocks, and
# any stray newline would change the prompt. Namespace attributes must not start with "_".
_WRAPPER = (
    "{%- set envace_head = @HEAD@ -%}{%- set envace_tail = @TAIL@ -%}{%- set envace_fmt = @FMT@ -%}"
    "{%- set envace_domain = domain if domain is defined and domain else @DOMAIN@ -%}"
    # core/prompts.py _type_of
    "{%- macro envace_type(p) -%}"
    "{%- if p is mapping and 'enum' in p -%}"
    "{%- for v in p['enum'] -%}{{ '|' if not loop.first else '' }}{{ v|tojson(ensure_ascii=True) }}{%- endfor -%}"
    "{%- else -%}"
    "{%- set t = p['type'] if p is mapping and 'type' in p else 'any' -%}"
    "{%- if t == 'array' -%}list[{{ envace_type(p['items'] if 'items' in p else {}) }}]"
    "{%- elif t is string -%}{{ t }}{%- else -%}{{ t|join('|') }}{%- endif -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    # core/prompts.py compact_signature / tools_text("json"): FunctionSpec's defaults filled in
    "{%- macro envace_tool(tool) -%}"
    "{%- set f = tool['function'] if tool is mapping and 'function' in tool else tool -%}"
    "{%- set desc = f['description'] if 'description' in f and f['description'] else '' -%}"
    "{%- set params = f['parameters'] if 'parameters' in f and f['parameters'] is mapping"
    " else {'type': 'object', 'properties': {}} -%}"
    "{%- if envace_fmt == 'json' -%}"
    "{{ '{\"type\": \"function\", \"function\": {\"name\": ' ~ f['name']|tojson ~ ', \"description\": '"
    " ~ desc|tojson ~ ', \"parameters\": ' ~ params|tojson ~ '}}' }}"
    "{%- else -%}"
    "{%- set required = params['required'] if 'required' in params else [] -%}"
    "{{ f['name'] }}("
    "{%- for k, v in (params['properties'] if 'properties' in params else {}).items() -%}"
    "{{ ', ' if not loop.first else '' }}{{ k }}{{ '' if k in required else '?' }}: {{ envace_type(v) }}"
    "{%- endfor -%})"
    "{%- if desc %} - {{ desc }}{% endif -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set ns = namespace(msgs=[], tools='', calls='', src=messages) -%}"
    "{%- if tools is defined and tools is not none -%}"
    "{%- for tool in tools -%}{%- set ns.tools = ns.tools ~ ('\\n' if not loop.first else '') ~ envace_tool(tool)"
    " -%}{%- endfor -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set ns.msgs = [{'role': 'system', 'content': (messages[0]['content'] or '') ~ '\\nTools:\\n' ~ ns.tools}]"
    " -%}{%- set ns.src = messages[1:] -%}"
    "{%- else -%}"
    "{%- set ns.msgs = [{'role': 'system', 'content': envace_head ~ envace_domain ~ envace_tail ~ '\\nTools:\\n'"
    " ~ ns.tools}] -%}"
    "{%- endif -%}"
    "{%- endif -%}"
    "{%- for m in ns.src -%}"
    "{%- set c = m.get('content') -%}"
    "{%- set c = c if c is string else ('' if c is none else c|tojson) -%}"
    "{%- if m.get('role') == 'assistant' and m.get('tool_calls') and '<tool_call>' not in c -%}"
    "{%- set ns.calls = '' -%}"
    "{%- for call in m['tool_calls'] -%}"
    "{%- set fn = call['function'] if 'function' in call else call -%}"
    "{%- set a = fn.get('arguments') -%}"
    "{%- set a = a if a is string else (a if a is not none else {})|tojson -%}"
    "{%- set ns.calls = ns.calls ~ ('\\n' if not loop.first else '') ~ '<tool_call>\\n{\"name\": ' ~ fn['name']|tojson"
    " ~ ', \"arguments\": ' ~ a ~ '}\\n</tool_call>' -%}"
    "{%- endfor -%}"
    "{%- set c = (c ~ '\\n' if c else '') ~ ns.calls -%}"
    "{%- endif -%}"
    "{%- set ns.msgs = ns.msgs + [{'role': m.get('role'), 'content': c}] -%}"
    "{%- endfor -%}"
    "{%- set messages = ns.msgs -%}{%- set tools = none -%}"
)


def _literal(text: str) -> str:
    # A Jinja string literal: JSON's escapes (\n, \") are ones Jinja's lexer decodes too; other
    # characters stay as they are (an escaped astral character would decode to two surrogates).
    return json.dumps(text, ensure_ascii=False)


def base_template(template: str) -> str:
    """The model's own template inside an exported one (re-exporting wraps it once, not twice)."""
    return template.split(BASE_MARK, 1)[1] if template.startswith(MARK) and BASE_MARK in template else template


def tool_chat_template(base: str, tool_format: str = "compact", default_domain: str = "customer") -> str:
    """``base`` (a chat template) wrapped so that ``tools=`` and structured tool calls render as
    envace's caller prompt with ``tool_format`` compact or json."""
    if tool_format not in ("compact", "json", "native"):
        raise ValueError(f"tool_format must be compact, json or native, not {tool_format!r}")
    head, tail = CALLER_SYSTEM.format(domain=_DOMAIN).split(_DOMAIN)
    # native on a template without tools falls back to the compact signature text (core/prompts.py tools_text)
    fmt = "json" if tool_format == "json" else "compact"
    values = {"HEAD": head, "TAIL": tail, "FMT": fmt, "DOMAIN": default_domain or "customer"}
    wrapper = re.sub(r"@(HEAD|TAIL|FMT|DOMAIN)@", lambda m: _literal(values[m.group(1)]), _WRAPPER)
    return MARK + wrapper + BASE_MARK + base_template(base)


def export_chat_template(tokenizer: Any, style: PromptStyle | None = None, default_domain: str = "customer") -> str:
    """The template to ship with an exported model trained with ``style``'s caller prompt."""
    style = style or PromptStyle()
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        raise ValueError("export: the tokenizer has no chat template to build on")
    if style.tool_format == "native" and template_supports_tools(tokenizer) and not template.startswith(MARK):
        return template  # training passed tools= to this very template
    return tool_chat_template(template, style.tool_format, default_domain)


__all__ = ["tool_chat_template", "export_chat_template", "base_template"]
