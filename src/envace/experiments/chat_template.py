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

from envace.core.prompts import CALLER_SYSTEM, MAX_TYPE_DEPTH, PromptStyle, template_supports_tools

MARK = "{#- envace tool-calling template (envace export); the model's own template follows it -#}"
BASE_MARK = "{#- envace: base template -#}"
_DOMAIN = "\x00"

# One line, no whitespace between tags: transformers renders with trim_blocks/lstrip_blocks, and
# any stray newline would change the prompt. Namespace attributes must not start with "_".
_WRAPPER = (
    "{%- set envace_head = @HEAD@ -%}{%- set envace_tail = @TAIL@ -%}{%- set envace_fmt = @FMT@ -%}"
    "{%- set envace_domain = domain if domain is defined and domain else @DOMAIN@ -%}"
    # core/prompts.py _type_of / _one_type / _args / _resolve_ref (a list: a sequence neither text nor mapping)
    "{%- macro envace_type(p, root, depth) -%}"
    "{%- if p is not mapping or depth > @DEPTH@ -%}any"
    "{%- elif '$ref' in p and p['$ref'] is string -%}"
    "{%- if p['$ref'][:2] == '#/' -%}"
    "{%- set r = namespace(node=root) -%}"
    "{%- for seg in p['$ref'][2:].split('/') -%}"
    "{%- set r.node = r.node[seg] if r.node is mapping and seg in r.node else none -%}"
    "{%- endfor -%}"
    "{{ envace_type(r.node, root, depth + 1) }}"
    "{%- else -%}any{%- endif -%}"
    "{%- elif 'enum' in p -%}"
    "{%- set vs = p['enum'] if p['enum'] is iterable and p['enum'] is not string and p['enum'] is not mapping"
    " else [p['enum']] -%}"
    "{%- for v in vs -%}{{ '|' if not loop.first else '' }}{{ v|tojson(ensure_ascii=True) }}{%- endfor -%}"
    "{%- elif 'const' in p -%}{{ p['const']|tojson(ensure_ascii=True) }}"
    "{%- elif 'anyOf' in p and p['anyOf'] is iterable and p['anyOf'] is not string and p['anyOf'] is not mapping"
    " and p['anyOf']|length > 0 -%}{{ envace_union(p['anyOf'], root, depth) }}"
    "{%- elif 'oneOf' in p and p['oneOf'] is iterable and p['oneOf'] is not string and p['oneOf'] is not mapping"
    " and p['oneOf']|length > 0 -%}{{ envace_union(p['oneOf'], root, depth) }}"
    "{%- elif 'allOf' in p and p['allOf'] is iterable and p['allOf'] is not string and p['allOf'] is not mapping"
    " and p['allOf']|length == 1 -%}{{ envace_type(p['allOf'][0], root, depth + 1) }}"
    "{%- else -%}"
    "{%- set t = p['type'] if 'type' in p else ('object' if 'properties' in p and p['properties'] is mapping"
    " else 'any') -%}"
    "{%- if t is iterable and t is not string and t is not mapping -%}"
    "{%- for x in t -%}{{ '|' if not loop.first else '' }}{{ envace_one(p, x, root, depth) }}{%- endfor -%}"
    "{%- else -%}{{ envace_one(p, t, root, depth) }}{%- endif -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- macro envace_union(alts, root, depth) -%}"
    "{%- set u = namespace(seen=[]) -%}"
    "{%- for a in alts -%}{%- set x = envace_type(a, root, depth + 1) -%}"
    "{%- if x not in u.seen -%}{%- set u.seen = u.seen + [x] -%}{%- endif -%}{%- endfor -%}"
    "{{ u.seen|join('|') }}"
    "{%- endmacro -%}"
    "{%- macro envace_one(p, t, root, depth) -%}"
    "{%- set props = p['properties'] if 'properties' in p else none -%}"
    "{%- set extra = p['additionalProperties'] if 'additionalProperties' in p else none -%}"
    "{%- if t == 'array' -%}list[{{ envace_type(p['items'] if 'items' in p else {}, root, depth + 1) }}]"
    "{%- elif t == 'object' and props is mapping and props -%}"
    "{%- set req = p['required'] if 'required' in p and p['required'] is iterable and p['required'] is not string"
    " and p['required'] is not mapping else [] -%}"
    "{{ '{' }}{{ envace_args(props, req, root, depth + 1) }}{{ '}' }}"
    "{%- elif t == 'object' and extra is mapping and extra -%}dict[string, {{ envace_type(extra, root, depth + 1) }}]"
    "{%- elif t is string -%}{{ t }}"
    "{%- else -%}{{ t|tojson(ensure_ascii=True) }}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- macro envace_args(props, req, root, depth) -%}"
    "{%- for k, v in props.items() -%}"
    "{{ ', ' if not loop.first else '' }}{{ k }}{{ '' if k in req else '?' }}: {{ envace_type(v, root, depth) }}"
    "{%- endfor -%}"
    "{%- endmacro -%}"
    # core/prompts.py compact_signature / tools_text("json"): FunctionSpec's defaults filled in, a
    # ToolSpec's annotations and output_schema where given (its model_dump leaves out absent ones)
    "{%- macro envace_tool(tool) -%}"
    "{%- set f = tool['function'] if tool is mapping and 'function' in tool else tool -%}"
    "{%- set desc = f['description'] if 'description' in f and f['description'] else '' -%}"
    "{%- set params = f['parameters'] if 'parameters' in f and f['parameters'] is mapping"
    " else {'type': 'object', 'properties': {}} -%}"
    "{%- if envace_fmt == 'json' -%}"
    "{{ '{\"type\": \"function\", \"function\": {\"name\": ' ~ f['name']|tojson ~ ', \"description\": '"
    " ~ desc|tojson ~ ', \"parameters\": ' ~ params|tojson ~ '}' }}"
    "{%- for key in ['annotations', 'output_schema'] -%}"
    "{%- if tool is mapping and 'function' in tool and key in tool and tool[key] is not none -%}"
    "{{ ', ' ~ key|tojson ~ ': ' ~ tool[key]|tojson }}"
    "{%- endif -%}"
    "{%- endfor -%}{{ '}' }}"
    "{%- else -%}"
    "{%- set props = params['properties'] if 'properties' in params and params['properties'] is mapping else {} -%}"
    "{%- set req = params['required'] if 'required' in params and params['required'] is iterable"
    " and params['required'] is not string and params['required'] is not mapping else [] -%}"
    "{{ f['name'] }}({{ envace_args(props, req, params, 0) }})"
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
    wrapper = wrapper.replace("@DEPTH@", str(int(MAX_TYPE_DEPTH)))
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
