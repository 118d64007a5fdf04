"""An IT helpdesk as a plain Python class: the public methods are the tools envace gives the agent.

The state is a small SQLite database (tickets, their labels and comments, the support agents),
built from a seed by ``reset(seed=...)``: envace makes one ``Helpdesk`` per episode and calls
``reset(**env.args)`` on it, so episodes never share state. ``query(sql)`` answers the tasks'
``state`` checklist items with one read-only SELECT. Nested arguments (search filters, the changes
of an update) are TypedDicts, enumerations are ``Literal`` types: the schemas come from the hints
and the docstrings, as they would for any Python API. A method that raises becomes a structured
tool error the agent can read and recover from.

This is the code a team already has, plus one thing for envace: ``@envace.readonly`` on the tools
that only read (they carry MCP's ``readOnlyHint``, as the MCP server's do).
"""

from __future__ import annotations

import random
import sqlite3
from typing import Any, Literal, TypedDict

import envace

Status = Literal["open", "in_progress", "waiting", "resolved", "closed"]
Priority = Literal["low", "medium", "high", "urgent"]
Team = Literal["network", "hardware", "accounts", "software"]

STATUSES: tuple[str, ...] = Status.__args__
PRIORITIES: tuple[str, ...] = Priority.__args__
TEAMS: tuple[str, ...] = Team.__args__
ACTIVE = ("open", "in_progress", "waiting")


class TicketFilters(TypedDict, total=False):
    """What ``search_tickets`` matches on; every key is optional and all given keys must hold."""

    status: Status
    priority: Priority
    labels: list[str]
    assignee: str
    text: str


class TicketChanges(TypedDict, total=False):
    """The fields ``update_ticket`` changes; keys left out stay as they are."""

    status: Status
    priority: Priority
    add_labels: list[str]
    remove_labels: list[str]
    assignee: str


AGENTS: list[tuple[str, str]] = [
    ("Maya Chen", "network"), ("Omar Haddad", "network"), ("Lena Fischer", "network"),
    ("Tom Okafor", "hardware"), ("Sara Lindqvist", "hardware"), ("Raj Patel", "hardware"),
    ("Ines Moreau", "accounts"), ("Ken Watanabe", "accounts"), ("Nadia Karimi", "accounts"),
    ("Julia Santos", "software"), ("Ben Adler", "software"), ("Priya Nair", "software"),
]
REPORTERS = ["Alice Brown", "Dan Kim", "Eva Rossi", "Femi Ade", "Grace Liu", "Hugo Berg", "Ivy Novak", "Jon Park"]
# (title, description, labels, team)
TICKETS: list[tuple[str, str, tuple[str, ...], str]] = [
    ("VPN drops every few minutes", "Working from home, the VPN disconnects every 5-10 minutes since Monday.",
     ("vpn", "remote"), "network"),
    ("Printer on floor 3 jams", "The big printer by the kitchen on floor 3 jams on every double-sided job.",
     ("printer",), "hardware"),
    ("Cannot log in to the payroll portal", "The payroll portal says my password expired, and the reset link "
     "never arrives.", ("password", "payroll"), "accounts"),
    ("Laptop fan is very loud", "My laptop fan runs at full speed even when the laptop is idle.",
     ("laptop",), "hardware"),
    ("Outlook calendar not syncing", "Meetings I accept on my phone do not show up in Outlook on my desktop.",
     ("email", "calendar"), "software"),
    ("Slow Wi-Fi in meeting room B", "Video calls in meeting room B freeze; the Wi-Fi there is much slower "
     "than elsewhere.", ("wifi",), "network"),
    ("Accounts for a new starter", "A new analyst starts next Monday and needs email, VPN and payroll accounts.",
     ("onboarding",), "accounts"),
    ("Excel crashes on large files", "Excel closes without a message when I open the quarterly report "
     "(about 80 MB).", ("excel",), "software"),
    ("Suspicious email asking for my password", "I received an email that looks like IT asking me to confirm "
     "my password on an outside site.", ("security", "email"), "accounts"),
    ("Second monitor flickers", "My second monitor flickers every few seconds when connected through the dock.",
     ("monitor", "dock"), "hardware"),
    ("Access to the finance shared drive", "I moved to the finance team and need read access to the finance "
     "shared drive.", ("access",), "accounts"),
    ("Echo in Zoom calls", "People hear themselves echo when I join Zoom calls from my desk headset.",
     ("zoom", "audio"), "software"),
    ("Docking station not detected", "The laptop does not detect the docking station; no screens, no network.",
     ("dock", "laptop"), "hardware"),
    ("Guest Wi-Fi password for a visitor", "A supplier visits on Thursday and needs the guest Wi-Fi password.",
     ("wifi", "guest"), "network"),
    ("Licence for Figma", "The design intern needs a Figma licence for the website project.",
     ("licence",), "software"),
    ("Intranet very slow from the Leeds office", "Every intranet page takes 20 seconds to load from the Leeds "
     "office since the weekend.", ("intranet", "outage"), "network"),
]
COMMENTS = ["Can you send a screenshot of the error?", "I restarted it and it still happens.",
            "Checked with the vendor, waiting for their answer.", "It got worse this afternoon.",
            "Thanks, I will try that tomorrow."]

SCHEMA = """
CREATE TABLE agents(id TEXT PRIMARY KEY, name TEXT NOT NULL, team TEXT NOT NULL);
CREATE TABLE tickets(id TEXT PRIMARY KEY, title TEXT NOT NULL, description TEXT NOT NULL, status TEXT NOT NULL,
                     priority TEXT NOT NULL, assignee TEXT REFERENCES agents(id), reporter TEXT NOT NULL);
CREATE TABLE ticket_labels(ticket_id TEXT NOT NULL REFERENCES tickets(id), label TEXT NOT NULL,
                           PRIMARY KEY(ticket_id, label));
CREATE TABLE comments(id TEXT PRIMARY KEY, ticket_id TEXT NOT NULL REFERENCES tickets(id), author TEXT NOT NULL,
                      body TEXT NOT NULL, internal INTEGER NOT NULL);
"""

_READ = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION}


def agent_id(name: str) -> str:
    """Agents log in as first initial + surname: Maya Chen is mchen."""
    first, last = name.split()[0], name.split()[-1]
    return (first[0] + last).lower()


def _labels(labels: list[str]) -> list[str]:
    """Labels are case-insensitive tags: stored lower case, once each."""
    out = sorted({str(label).strip().lower() for label in labels if str(label).strip()})
    if any(len(label) > 40 for label in out):
        raise ValueError("a label is at most 40 characters")
    return out


class Helpdesk:
    def __init__(self) -> None:
        self.db: sqlite3.Connection | None = None

    def reset(self, seed: int = 0) -> None:
        """Build the seed's helpdesk: 8 agents (two per team) and 12 tickets in various states."""
        rng = random.Random(f"helpdesk:{seed}")
        if self.db is not None:
            self.db.close()
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.db.executescript(SCHEMA)
        agents = [a for team in TEAMS for a in rng.sample([a for a in AGENTS if a[1] == team], 2)]
        self.db.executemany("INSERT INTO agents VALUES (?, ?, ?)", [(agent_id(n), n, t) for n, t in agents])
        self.first_id = rng.randint(100, 899)
        comment_no = 0
        for k, (title, description, labels, team) in enumerate(rng.sample(TICKETS, 12)):
            tid = f"HD-{self.first_id + k}"
            status = rng.choices(STATUSES, weights=(4, 3, 2, 2, 1))[0]
            priority = rng.choices(PRIORITIES, weights=(2, 4, 3, 1))[0]
            team_agents = [agent_id(n) for n, t in agents if t == team]
            assignee = None if status == "open" and rng.random() < 0.4 else rng.choice(team_agents)
            self.db.execute("INSERT INTO tickets VALUES (?, ?, ?, ?, ?, ?, ?)",
                            (tid, title, description, status, priority, assignee, rng.choice(REPORTERS)))
            self.db.executemany("INSERT INTO ticket_labels VALUES (?, ?)", [(tid, label) for label in labels])
            for _ in range(rng.choice((0, 0, 1, 2))):
                comment_no += 1
                self.db.execute("INSERT INTO comments VALUES (?, ?, ?, ?, ?)",
                                (f"C{comment_no}", tid, "reporter", rng.choice(COMMENTS), 0))
        self.db.commit()

    # -- tools ------------------------------------------------------------------------------------

    @envace.readonly
    def search_tickets(self, filters: TicketFilters | None = None, limit: int = 10) -> list[dict]:
        """Find tickets, newest last. Every filter given must hold; with no filters, all tickets.

        Args:
            filters: Optional criteria: status, priority, labels (the ticket must carry all of them),
                assignee (an agent id such as mchen, or "none" for unassigned tickets) and text
                (matched case-insensitively against the title and description).
            limit: The most tickets to return, 1 to 50.
        """
        filters = dict(filters or {})
        unknown = set(filters) - set(TicketFilters.__annotations__)
        if unknown:
            raise ValueError(f"unknown filter {sorted(unknown)[0]!r}; filters are {sorted(TicketFilters.__annotations__)}")
        if not 1 <= limit <= 50:
            raise ValueError("limit must be between 1 and 50")
        where, params = [], []
        for key in ("status", "priority"):
            if key in filters:
                value = filters[key]
                allowed = STATUSES if key == "status" else PRIORITIES
                if value not in allowed:
                    raise ValueError(f"{key} must be one of {', '.join(allowed)}")
                where.append(f"{key} = ?")
                params.append(value)
        if "assignee" in filters:
            if str(filters["assignee"]).lower() == "none":
                where.append("assignee IS NULL")
            else:
                where.append("assignee = ?")
                params.append(str(filters["assignee"]).lower())
        if filters.get("text"):
            where.append("(instr(lower(title), ?) > 0 OR instr(lower(description), ?) > 0)")
            params += [str(filters["text"]).lower()] * 2
        for label in _labels(filters.get("labels") or []):
            where.append("id IN (SELECT ticket_id FROM ticket_labels WHERE label = ?)")
            params.append(label)
        sql = "SELECT id FROM tickets" + (" WHERE " + " AND ".join(where) if where else "")
        ids = [r[0] for r in self._db.execute(sql + " ORDER BY id LIMIT ?", (*params, limit))]
        return [self._summary(tid) for tid in ids]

    @envace.readonly
    def get_ticket(self, ticket_id: str) -> dict:
        """One ticket in full: description, reporter, assignee, labels and comments.

        Args:
            ticket_id: The ticket's id, e.g. HD-412.
        """
        tid = self._ticket_id(ticket_id)
        title, description, reporter = self._db.execute(
            "SELECT title, description, reporter FROM tickets WHERE id = ?", (tid,)).fetchone()
        out = self._summary(tid)
        out["assignee"] = self._agent(out["assignee"])
        out.update(title=title, description=description, reporter=reporter)
        out["comments"] = [{"id": c, "author": a, "body": b, "internal": bool(i)} for c, a, b, i in self._db.execute(
            "SELECT id, author, body, internal FROM comments WHERE ticket_id = ? ORDER BY rowid", (tid,))]
        return out

    def create_ticket(self, title: str, description: str, priority: Priority, labels: list[str],
                      assignee: str | None = None) -> dict:
        """Open a new ticket. Its status starts as open.

        Args:
            title: A one-line summary.
            description: What is wrong, in the reporter's words.
            priority: How urgent it is.
            labels: Tags for the ticket, e.g. ["vpn", "remote"] (may be empty).
            assignee: The agent id to assign it to (e.g. mchen); leave out to leave it unassigned.
        """
        if not title.strip() or not description.strip():
            raise ValueError("title and description must not be empty")
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}")
        if assignee is not None:
            assignee = self._agent_id(assignee)
        tid = f"HD-{self.first_id + self._db.execute('SELECT count(*) FROM tickets').fetchone()[0]}"
        self._db.execute("INSERT INTO tickets VALUES (?, ?, ?, 'open', ?, ?, ?)",
                         (tid, title.strip(), description.strip(), priority, assignee, "helpdesk"))
        self._db.executemany("INSERT INTO ticket_labels VALUES (?, ?)", [(tid, label) for label in _labels(labels)])
        self._db.commit()
        return self._summary(tid)

    def update_ticket(self, ticket_id: str, changes: TicketChanges) -> dict:
        """Change a ticket's status, priority, labels or assignee. Closed tickets cannot change.

        Args:
            ticket_id: The ticket's id, e.g. HD-412.
            changes: The fields to change: status, priority, assignee (an agent id, or "none" to
                unassign), add_labels and remove_labels (lists of labels).
        """
        tid = self._ticket_id(ticket_id)
        changes = dict(changes or {})
        unknown = set(changes) - set(TicketChanges.__annotations__)
        if unknown:
            raise ValueError(f"unknown change {sorted(unknown)[0]!r}; changes are "
                             f"{sorted(TicketChanges.__annotations__)}")
        if not changes:
            raise ValueError("no changes given")
        if self._db.execute("SELECT status FROM tickets WHERE id = ?", (tid,)).fetchone()[0] == "closed":
            raise ValueError(f"{tid} is closed and cannot change")
        sets, params = [], []
        for key, allowed in (("status", STATUSES), ("priority", PRIORITIES)):
            if key in changes:
                if changes[key] not in allowed:
                    raise ValueError(f"{key} must be one of {', '.join(allowed)}")
                sets.append(f"{key} = ?")
                params.append(changes[key])
        if "assignee" in changes:
            sets.append("assignee = ?")
            params.append(None if str(changes["assignee"]).lower() == "none" else self._agent_id(changes["assignee"]))
        if sets:
            self._db.execute(f"UPDATE tickets SET {', '.join(sets)} WHERE id = ?", (*params, tid))
        self._db.executemany("INSERT OR IGNORE INTO ticket_labels VALUES (?, ?)",
                             [(tid, label) for label in _labels(changes.get("add_labels") or [])])
        self._db.executemany("DELETE FROM ticket_labels WHERE ticket_id = ? AND label = ?",
                             [(tid, label) for label in _labels(changes.get("remove_labels") or [])])
        self._db.commit()
        return self._summary(tid)

    def add_comment(self, ticket_id: str, body: str, internal: bool = False) -> dict:
        """Comment on a ticket. Public comments are emailed to the reporter; internal ones are not.

        Args:
            ticket_id: The ticket's id, e.g. HD-412.
            body: The comment's text.
            internal: True for a note only the support team sees.
        """
        tid = self._ticket_id(ticket_id)
        if not body.strip():
            raise ValueError("the comment's body must not be empty")
        cid = f"C{self._db.execute('SELECT count(*) FROM comments').fetchone()[0] + 1}"
        self._db.execute("INSERT INTO comments VALUES (?, ?, 'helpdesk', ?, ?)", (cid, tid, body.strip(), int(internal)))
        self._db.commit()
        return {"id": cid, "ticket_id": tid, "internal": bool(internal),
                "notified": None if internal else self._db.execute(
                    "SELECT reporter FROM tickets WHERE id = ?", (tid,)).fetchone()[0]}

    @envace.readonly
    def list_agents(self, team: Team | None = None) -> list[dict]:
        """The support agents, with how many active (open, in progress or waiting) tickets each holds.

        Args:
            team: Only this team's agents.
        """
        if team is not None and team not in TEAMS:
            raise ValueError(f"team must be one of {', '.join(TEAMS)}")
        rows = self._db.execute(
            "SELECT a.id, a.name, a.team, (SELECT count(*) FROM tickets t WHERE t.assignee = a.id AND t.status IN "
            f"({', '.join('?' * len(ACTIVE))})) FROM agents a" + (" WHERE a.team = ?" if team else "")
            + " ORDER BY a.team, a.id", (*ACTIVE, *([team] if team else [])))
        return [{"id": i, "name": n, "team": t, "active_tickets": c} for i, n, t, c in rows]

    # -- for the checklist's state items, not a tool ----------------------------------------------

    def query(self, sql: str) -> list[list[Any]]:
        """One read-only SELECT on the state (the authorizer refuses any write)."""
        self._db.set_authorizer(lambda action, *_: sqlite3.SQLITE_OK if action in _READ else sqlite3.SQLITE_DENY)
        try:
            return [list(r) for r in self._db.execute(sql).fetchall()]
        finally:
            self._db.set_authorizer(None)

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None

    # -- helpers ----------------------------------------------------------------------------------

    @property
    def _db(self) -> sqlite3.Connection:
        if self.db is None:
            self.reset()
        return self.db

    def _ticket_id(self, ticket_id: str) -> str:
        tid = str(ticket_id).strip().upper()
        if self._db.execute("SELECT 1 FROM tickets WHERE id = ?", (tid,)).fetchone() is None:
            raise LookupError(f"no ticket {ticket_id!r}")
        return tid

    def _agent_id(self, agent: str) -> str:
        aid = str(agent).strip().lower()
        if self._db.execute("SELECT 1 FROM agents WHERE id = ?", (aid,)).fetchone() is None:
            raise LookupError(f"no agent {agent!r} (agent ids look like mchen; list_agents shows them)")
        return aid

    def _agent(self, aid: str | None) -> dict | None:
        if aid is None:
            return None
        name, team = self._db.execute("SELECT name, team FROM agents WHERE id = ?", (aid,)).fetchone()
        return {"id": aid, "name": name, "team": team}

    def _summary(self, tid: str) -> dict:
        status, priority, assignee, title = self._db.execute(
            "SELECT status, priority, assignee, title FROM tickets WHERE id = ?", (tid,)).fetchone()
        labels = [r[0] for r in self._db.execute(
            "SELECT label FROM ticket_labels WHERE ticket_id = ? ORDER BY label", (tid,))]
        return {"id": tid, "title": title, "status": status, "priority": priority, "assignee": assignee,
                "labels": labels}
