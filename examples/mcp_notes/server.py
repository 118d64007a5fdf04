"""A small MCP server (the official SDK's MCPServer, formerly FastMCP) over the notes service.

Run it as envace does: ``python examples/mcp_notes/server.py`` (stdio), or as a service over
streamable HTTP: ``python examples/mcp_notes/server.py --http 8765`` (then
``--world http://127.0.0.1:8765/mcp``; one session per episode, the reset tool seeds it). ``reset(seed)`` seeds
the session's notes; envace calls it when each episode's session opens (``reset_tool: reset``).
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from pathlib import Path

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

sys.path.insert(0, str(Path(__file__).parent))
from notes import Notes  # noqa: E402

server = MCPServer("notes", log_level="WARNING")
# Tools that only read say so; envace counts any other tool as one that writes.
READ_ONLY = ToolAnnotations(readOnlyHint=True)


def _do(fn, *args):
    """The service's errors as MCP tool errors: the client sees the message, no traceback."""
    try:
        return fn(*args)
    except (KeyError, ValueError) as e:
        raise ToolError(str(e).strip("'")) from None

# One notes store per client session: under stdio that is the process, over HTTP each episode's
# session has its own, so concurrent episodes never see each other's writes.
sessions: OrderedDict[object, Notes] = OrderedDict()
MAX_SESSIONS = 1024


def notes(ctx: Context, fresh: Notes | None = None) -> Notes:
    # HTTP: the session header. stdio: the process is the one session. (Not id(ctx.session): on
    # mcp 2.3 that object is new for every request, so a reset would seed a store no call sees.)
    key = (ctx.headers or {}).get("mcp-session-id") or "stdio"
    if fresh is not None or key not in sessions:
        sessions[key] = fresh or Notes(0)
        while len(sessions) > MAX_SESSIONS:
            sessions.popitem(last=False)
    return sessions[key]


@server.tool()
def reset(ctx: Context, seed: int = 0) -> dict:
    """Start the session over with the notes of ``seed``."""
    notes(ctx, Notes(seed))
    return {"ok": True}


@server.tool(annotations=READ_ONLY)
def list_notes(ctx: Context, tag: str | None = None) -> list[dict]:
    """List notes (id, title, tag), optionally only those with one tag."""
    return notes(ctx).list_notes(tag)


@server.tool(annotations=READ_ONLY)
def get_note(ctx: Context, note_id: str) -> dict:
    """Read one note: its title, body and tag."""
    return _do(notes(ctx).get_note, note_id)


@server.tool(annotations=READ_ONLY)
def search_notes(ctx: Context, text: str) -> list[dict]:
    """Find notes whose title or body contains the text (case-insensitive)."""
    return notes(ctx).search_notes(text)


@server.tool()
def create_note(ctx: Context, title: str, body: str, tag: str = "later") -> dict:
    """Create a note; tag is one of home, urgent, later, family, office. Returns the new note."""
    return _do(notes(ctx).create_note, title, body, tag)


@server.tool()
def delete_note(ctx: Context, note_id: str) -> dict:
    """Delete a note by id."""
    return _do(notes(ctx).delete_note, note_id)


if __name__ == "__main__":
    if "--http" in sys.argv:  # streamable HTTP: python server.py --http PORT (envace: --world http://127.0.0.1:PORT/mcp)
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[sys.argv.index("--http") + 1]))
    else:
        server.run()
