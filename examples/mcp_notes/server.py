"""A small MCP server (the official SDK's MCPServer, formerly FastMCP) over the notes service.

Run it as envace does: ``python examples/mcp_notes/server.py`` (stdio). ``reset(seed)`` seeds
the session's notes; envace calls it when each episode's session opens (``reset_tool: reset``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

sys.path.insert(0, str(Path(__file__).parent))
from notes import Notes  # noqa: E402

server = MCPServer("notes", log_level="WARNING")


def _do(fn, *args):
    """The service's errors as MCP tool errors: the client sees the message, no traceback."""
    try:
        return fn(*args)
    except (KeyError, ValueError) as e:
        raise ToolError(str(e).strip("'")) from None

state = {"notes": Notes(0)}


@server.tool()
def reset(seed: int = 0) -> dict:
    """Start the session over with the notes of ``seed``."""
    state["notes"] = Notes(seed)
    return {"ok": True}


@server.tool()
def list_notes(tag: str | None = None) -> list[dict]:
    """List notes (id, title, tag), optionally only those with one tag."""
    return state["notes"].list_notes(tag)


@server.tool()
def get_note(note_id: str) -> dict:
    """Read one note: its title, body and tag."""
    return _do(state["notes"].get_note, note_id)


@server.tool()
def search_notes(text: str) -> list[dict]:
    """Find notes whose title or body contains the text (case-insensitive)."""
    return state["notes"].search_notes(text)


@server.tool()
def create_note(title: str, body: str, tag: str = "later") -> dict:
    """Create a note; tag is one of home, urgent, later, family, office. Returns the new note."""
    return _do(state["notes"].create_note, title, body, tag)


@server.tool()
def delete_note(note_id: str) -> dict:
    """Delete a note by id."""
    return _do(state["notes"].delete_note, note_id)


if __name__ == "__main__":
    server.run()
