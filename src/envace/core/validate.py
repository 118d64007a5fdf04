"""Checks a tool call against the task's tool list and the tool's JSON schema."""

from __future__ import annotations

from functools import lru_cache
import json
from typing import Any

import jsonschema
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable

from envace.core.errors import INVALID_PARAMETERS, TOOL_NOT_AVAILABLE, tool_error
from envace.core.types import ToolCall, ToolSpec


def _no_retrieval(uri: str) -> Any:
    # A $ref resolves inside the schema only: jsonschema's default would fetch http(s) and file URIs.
    raise NoSuchResource(ref=uri)


NO_RETRIEVAL = Registry(retrieve=_no_retrieval)


@lru_cache(maxsize=1024)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    # Cached by schema text: the same tool schema is checked thousands of times per run.
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, registry=NO_RETRIEVAL)


def schema_error(arguments: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """The first schema violation as a short message, or None when the arguments are valid."""
    v = _validator(json.dumps(schema, sort_keys=True))
    try:
        err = jsonschema.exceptions.best_match(v.iter_errors(arguments))
    except Unresolvable as e:  # a $ref outside the document, or to nothing: the schema's fault, not a crash
        return f"the tool's schema has an unresolvable $ref ({e})"
    if err is None:
        return None
    where = "/".join(str(p) for p in err.absolute_path)
    return f"{where}: {err.message}" if where else err.message


def validate_call(call: ToolCall, tools: list[ToolSpec]) -> dict[str, Any] | None:
    """A structured error (TOOL_NOT_AVAILABLE / INVALID_PARAMETERS) or None when the call is valid."""
    spec = next((t for t in tools if t.name == call.name), None)
    if spec is None:
        return tool_error(TOOL_NOT_AVAILABLE, f"tool '{call.name}' is not available",
                          available=[t.name for t in tools])
    problem = schema_error(call.arguments, spec.function.parameters)
    if problem is not None:
        return tool_error(INVALID_PARAMETERS, problem, tool=call.name)
    return None
