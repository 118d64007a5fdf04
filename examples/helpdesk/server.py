"""The helpdesk's tools as an MCP server (the official SDK's MCPServer), over the same logic as the
Python class in helpdesk.py: same tool names, same arguments, same results, same errors.

Run it as envace does: ``python examples/helpdesk/server.py`` (stdio), or as a service over
streamable HTTP: ``python examples/helpdesk/server.py --http 8765`` (then
``--world http://127.0.0.1:8765/mcp`` with ``reset_tool: reset``). ``reset(seed)`` builds the
session's helpdesk; envace calls it with each task's ``env.args`` when the episode's session
opens (``reset_tool: reset`` in world.yaml). Read-only tools carry MCP's ``readOnlyHint``.
"""

from __future__ import annotations

import sys
import typing
from collections import OrderedDict
from pathlib import Path

import typing_extensions

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

sys.path.insert(0, str(Path(__file__).parent))
import helpdesk  # noqa: E402
from helpdesk import Helpdesk, Priority, Team  # noqa: E402


def for_pydantic(td: type) -> type:
    """The class's TypedDict as typing_extensions' (pydantic, the SDK's argument parser, refuses
    typing's before Python 3.12): same name, fields and docstring, every key optional."""
    out = typing_extensions.TypedDict(td.__name__, {k: typing_extensions.NotRequired[v]
                                                    for k, v in typing.get_type_hints(td).items()})
    out.__doc__ = td.__doc__
    return out


TicketFilters = for_pydantic(helpdesk.TicketFilters)
TicketChanges = for_pydantic(helpdesk.TicketChanges)

server = MCPServer("helpdesk", log_level="WARNING")
READ_ONLY = ToolAnnotations(readOnlyHint=True)

# One helpdesk per client session: under stdio that is the process, over HTTP each episode's
# session has its own, so concurrent episodes never see each other's writes.
sessions: OrderedDict[object, Helpdesk] = OrderedDict()
MAX_SESSIONS = 256


def desk(ctx: Context, seed: int | None = None) -> Helpdesk:
    # HTTP: the session header. stdio: the process is the one session. (Not id(ctx.session): on
    # mcp 2.3 that object is new for every request, so a reset would seed a store no call sees.)
    key = (ctx.headers or {}).get("mcp-session-id") or "stdio"
    if seed is not None or key not in sessions:
        old = sessions.pop(key, None)
        if old is not None:
            old.close()
        sessions[key] = Helpdesk()
        sessions[key].reset(seed=seed or 0)
        while len(sessions) > MAX_SESSIONS:
            sessions.popitem(last=False)[1].close()
    return sessions[key]


def _do(ctx: Context, tool: str, **args):
    """Run the class's tool; its errors become MCP tool errors worded as envace words a Python
    tool's (``LookupError: no ticket 'HD-1'``), so both forms of the helpdesk answer alike."""
    try:
        return getattr(desk(ctx), tool)(**args)
    except Exception as e:  # the tool's own failure: the client sees the message, no traceback
        raise ToolError(f"{type(e).__name__}: {e}") from None


@server.tool()
def reset(ctx: Context, seed: int = 0) -> dict:
    """Start the session over with the helpdesk of ``seed``."""
    desk(ctx, seed)
    return {"ok": True}


@server.tool(annotations=READ_ONLY)
def search_tickets(ctx: Context, filters: TicketFilters | None = None, limit: int = 10) -> list[dict]:
    """Find tickets, newest last. Every filter given must hold; with no filters, all tickets.

    filters: optional criteria: status, priority, labels (the ticket must carry all of them),
    assignee (an agent id such as mchen, or "none" for unassigned tickets) and text (matched
    case-insensitively against the title and description). limit: the most tickets to return, 1 to 50.
    """
    return _do(ctx, "search_tickets", filters=filters, limit=limit)


@server.tool(annotations=READ_ONLY)
def get_ticket(ctx: Context, ticket_id: str) -> dict:
    """One ticket in full: description, reporter, assignee, labels and comments. ticket_id: e.g. HD-412."""
    return _do(ctx, "get_ticket", ticket_id=ticket_id)


@server.tool()
def create_ticket(ctx: Context, title: str, description: str, priority: Priority, labels: list[str],
                  assignee: str | None = None) -> dict:
    """Open a new ticket (status open). labels: tags such as ["vpn", "remote"] (may be empty);
    assignee: the agent id to assign it to (e.g. mchen), left out to leave it unassigned."""
    return _do(ctx, "create_ticket", title=title, description=description, priority=priority, labels=labels,
               assignee=assignee)


@server.tool()
def update_ticket(ctx: Context, ticket_id: str, changes: TicketChanges) -> dict:
    """Change a ticket's status, priority, labels or assignee. Closed tickets cannot change.
    changes: status, priority, assignee (an agent id, or "none" to unassign), add_labels and
    remove_labels (lists of labels)."""
    return _do(ctx, "update_ticket", ticket_id=ticket_id, changes=changes)


@server.tool()
def add_comment(ctx: Context, ticket_id: str, body: str, internal: bool = False) -> dict:
    """Comment on a ticket. Public comments are emailed to the reporter; internal ones
    (internal: true) only the support team sees."""
    return _do(ctx, "add_comment", ticket_id=ticket_id, body=body, internal=internal)


@server.tool(annotations=READ_ONLY)
def list_agents(ctx: Context, team: Team | None = None) -> list[dict]:
    """The support agents, with how many active (open, in progress or waiting) tickets each holds."""
    return _do(ctx, "list_agents", team=team)


if __name__ == "__main__":
    if "--http" in sys.argv:  # streamable HTTP: python server.py --http PORT
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[sys.argv.index("--http") + 1]))
    else:
        server.run()
