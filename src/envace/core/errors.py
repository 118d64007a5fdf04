"""Structured tool errors: the one shape every response source uses for a failed call."""

from __future__ import annotations

from typing import Any

# Codes raised before a call reaches any world (the caller's output itself is wrong).
INVALID_TOOL_CALL_FORMAT = "INVALID_TOOL_CALL_FORMAT"
TOOL_NOT_AVAILABLE = "TOOL_NOT_AVAILABLE"
INVALID_PARAMETERS = "INVALID_PARAMETERS"
VALIDATION_CODES = (INVALID_TOOL_CALL_FORMAT, TOOL_NOT_AVAILABLE, INVALID_PARAMETERS)


def tool_error(code: str, message: str, **details: Any) -> dict[str, Any]:
    """The JSON object a tool returns on failure: ``{"error": {"code", "message", ...}}``."""
    err: dict[str, Any] = {"code": code, "message": message}
    err.update(details)
    return {"error": err}


def is_error(result: Any) -> bool:
    return isinstance(result, dict) and isinstance(result.get("error"), dict) and "code" in result["error"]


def error_code(result: Any) -> str | None:
    return result["error"]["code"] if is_error(result) else None
