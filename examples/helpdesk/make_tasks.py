"""Writes tasks.jsonl for the helpdesk example: 72 tasks from nine templates (lookups, filtered
searches, tickets created from free text with and without an assignee, find-then-update, an
escalation, comments, a workload question), each with the tool schemas envace derives from
helpdesk.py, a reference solution, a checklist, a few real call/result examples from the same
helpdesk state (never the call that answers the task) and a split: every 4th task is held out.

Every reference is replayed in the real class through envace before the file is written, and
each call's real result is recorded in the task (``reference.calls[i].result``): with no world
(schema-only training on tasks_portable.jsonl), the warm start replays the reference from those
results, the very samples the class would give. Each reference must meet its own checklist and
the implicit guards (reward 1.0, the ``answer_excludes`` derived from the recorded results
included) with no tool error, in the real class and replayed from its recorded results judged
with no world as a rehearsal step is. Rerun after editing the tools:
    python examples/helpdesk/make_tasks.py
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from helpdesk import ACTIVE, Helpdesk  # noqa: E402

from envace.core.jsonl import atomic_write_text  # noqa: E402
from envace.core.types import Task  # noqa: E402
from envace.envs.provider import table_digests  # noqa: E402
from envace.envs.registry import resolve_world  # noqa: E402
from envace.rollout.sources import RealSource  # noqa: E402
from envace.train.sft import RecordedSource, assert_full_marks, oracle_replays, record_reference_results  # noqa: E402

SPEC = str(HERE / "helpdesk.py") + ":Helpdesk"
N = 72
TEMPLATES = 9
# A word of each seeded ticket's title that no other seeded ticket's title or description holds,
# so a text search finds that ticket alone.
KEYWORDS = {"VPN drops every few minutes": "vpn drops", "Printer on floor 3 jams": "printer",
            "Cannot log in to the payroll portal": "payroll portal", "Laptop fan is very loud": "fan",
            "Outlook calendar not syncing": "outlook", "Slow Wi-Fi in meeting room B": "meeting room b",
            "Accounts for a new starter": "new starter", "Excel crashes on large files": "excel",
            "Suspicious email asking for my password": "suspicious", "Second monitor flickers": "flickers",
            "Access to the finance shared drive": "finance", "Echo in Zoom calls": "zoom",
            "Docking station not detected": "docking station", "Guest Wi-Fi password for a visitor": "guest",
            "Licence for Figma": "figma", "Intranet very slow from the Leeds office": "intranet"}
# New problems reported in free text: (title, what the reporter wrote, labels, team, a phrase of it)
NEW_ISSUES = [
    ("Keyboard keys sticking", "Since I spilled coffee on Friday the E and R keys on my keyboard stick.",
     ["keyboard", "spill"], "hardware", "coffee"),
    ("Cannot join the Support channel", "Teams says I am not allowed to join the Support channel, although my "
     "manager added me yesterday.", ["teams", "access"], "software", "support channel"),
    ("No MFA codes on new phone", "My new phone does not get the login codes, so I cannot sign in to anything "
     "from home.", ["mfa", "phone"], "accounts", "login codes"),
    ("Dead network port at desk 14", "The wall network port at desk 14 on floor 2 shows no link; the cable works "
     "at other desks.", ["cabling", "floor-2"], "network", "desk 14"),
    ("Projector in room C shows no image", "The projector in room C powers on but says no signal with every "
     "laptop we tried.", ["projector", "meeting-room"], "hardware", "no signal"),
    ("Save as PDF missing", "After last night's update, Save as PDF is missing from the print menu in every "
     "program.", ["pdf", "update"], "software", "save as pdf"),
    ("Shared mailbox for the events team", "The events team needs a shared mailbox, events@, that four of us can "
     "read and send from.", ["mailbox", "email"], "accounts", "events@"),
    ("Remote desktop to build server times out", "Remote desktop to the build server times out after 30 seconds "
     "when I connect from the Leeds office.", ["rdp", "remote"], "network", "build server"),
]
# Internal notes: (the note, a phrase of it the stored comment must hold)
NOTES = [("Vendor RMA 4471 opened, replacement due Friday.", "4471"),
         ("Reproduced on a second machine; looks like the driver from the last update.", "second machine"),
         ("User is travelling until Wednesday, follow up then.", "wednesday"),
         ("Same fault as last month, check the warranty before replacing.", "warranty")]
REPLIES = ["a replacement is on its way and should arrive tomorrow", "we have pushed a fix, please restart "
           "your laptop and tell us if it still happens", "we need you to bring the device to the IT desk on "
           "floor 1", "the vendor has confirmed the fault and we will update you on Friday"]
# Free text a solution may word its own way: the reward's writes guard compares every other
# argument of each write with the reference's.
FREE_ARGS = {"create_ticket": ["title", "description"], "add_comment": ["body"]}
STATUS_WORDS = {"open": "open", "in_progress": "in progress", "waiting": "waiting", "resolved": "resolved",
                "closed": "closed"}


def fresh(seed: int) -> Helpdesk:
    desk = Helpdesk()
    desk.reset(seed=seed)
    return desk


def tickets(desk: Helpdesk) -> list[dict]:
    return [desk.get_ticket(t["id"]) for t in desk.search_tickets(limit=50)]


def state(sql: str, rows: list[list]) -> dict:
    return {"kind": "state", "query": sql, "equals": rows}


def surname(name: str) -> str:
    return name.split()[-1]


def task(i: int) -> dict:
    """One task of template ``i % TEMPLATES`` on the helpdesk of seed ``i``."""
    desk, rng = fresh(i), random.Random(f"task:{i}")
    all_tickets = tickets(desk)
    agents = desk.list_agents()
    active = [t for t in all_tickets if t["status"] in ACTIVE]
    kind = i % TEMPLATES
    target: str | None = None  # the ticket the task is about (kept out of the examples)
    if kind == 0:  # lookup
        t = rng.choice([t for t in all_tickets if t["assignee"]])
        target, who = t["id"], t["assignee"]["name"]
        instruction = f"Who is working on ticket {t['id']}, and what priority does it have?"
        calls = [("get_ticket", {"ticket_id": t["id"]})]
        answer = f"{t['id']} is assigned to {who} ({t['assignee']['id']}) and has {t['priority']} priority."
        checklist = [{"kind": "called", "tool": "get_ticket", "args": {"ticket_id": t["id"]}},
                     {"kind": "answer_contains", "text": surname(who)},
                     {"kind": "answer_contains", "text": t["priority"]}]
    elif kind == 1:  # filtered search: a status and a label
        t = rng.choice(all_tickets)
        status, label = t["status"], rng.choice(t["labels"])
        found = desk.search_tickets({"status": status, "labels": [label]})
        instruction = f"List the {STATUS_WORDS[status]} tickets labelled '{label}'."
        calls = [("search_tickets", {"filters": {"status": status, "labels": [label]}})]
        answer = (f"{STATUS_WORDS[status].capitalize()} tickets labelled {label}: "
                  + "; ".join(f"{f['id']} ({f['title']})" for f in found) + ".")
        checklist = [{"kind": "called", "tool": "search_tickets", "args": {"filters": {"status": status,
                                                                                       "labels": [label]}}}]
        checklist += [{"kind": "answer_contains", "text": f["id"]} for f in found]
    elif kind == 2:  # an agent's tickets of one status: find the agent's id, then search
        pairs = [(a, st) for st in ("open", "in_progress", "waiting") for a in agents
                 if desk.search_tickets({"status": st, "assignee": a["id"]})]
        agent, status = rng.choice(pairs)
        found = desk.search_tickets({"status": status, "assignee": agent["id"]})
        instruction = f"Which tickets with status {STATUS_WORDS[status]} is {agent['name']} handling?"
        calls = [("list_agents", {"team": agent["team"]}),
                 ("search_tickets", {"filters": {"status": status, "assignee": agent["id"]}})]
        answer = (f"{agent['name']} has {len(found)} {STATUS_WORDS[status]}: "
                  + "; ".join(f"{f['id']} ({f['title']})" for f in found) + ".")
        checklist = [{"kind": "called", "tool": "search_tickets",
                      "args": {"filters": {"status": status, "assignee": agent["id"]}}}]
        checklist += [{"kind": "answer_contains", "text": f["id"]} for f in found]
    elif kind in (3, 4):  # create from free text, assigned (3) or left unassigned (4)
        title, text, labels, team, phrase = NEW_ISSUES[(i // TEMPLATES) % len(NEW_ISSUES)]
        reporter = rng.choice(["Grace Liu", "Dan Kim", "Ivy Novak", "Hugo Berg"])
        priority = rng.choice(["medium", "high"] if kind == 3 else ["low", "urgent"])
        new_id = f"HD-{desk.first_id + len(all_tickets)}"
        args = {"title": title, "description": text, "priority": priority, "labels": labels}
        if kind == 3:
            agent = rng.choice([a for a in agents if a["team"] == team])
            args["assignee"] = agent["id"]
            instruction = (f"{reporter} writes: \"{text}\" Open a ticket titled '{title}' with {priority} priority "
                           f"and the labels {labels[0]} and {labels[1]}, and assign it to {agent['name']}.")
            calls = [("list_agents", {"team": team}), ("create_ticket", args)]
            answer = f"Opened {new_id} ('{title}'), {priority} priority, assigned to {agent['name']}."
        else:
            instruction = (f"Log this for {reporter}, {priority} priority, labels {labels[0]} and {labels[1]}, nobody "
                           f"assigned yet. Title: {title}. Their words: \"{text}\"")
            calls = [("create_ticket", args)]
            answer = f"Logged {new_id} ('{title}') with {priority} priority, unassigned."
        checklist = [{"kind": "called", "tool": "create_ticket",
                      "args": {"priority": priority, **({"assignee": args["assignee"]} if kind == 3 else {})}},
                     state(f"SELECT status, priority, assignee FROM tickets WHERE id = '{new_id}'",
                           [["open", priority, args.get("assignee")]]),
                     state(f"SELECT label FROM ticket_labels WHERE ticket_id = '{new_id}' ORDER BY label",
                           [[label] for label in sorted(labels)]),
                     # the reporter's words went into the description (free text, any wording around them)
                     state(f"SELECT count(*) FROM tickets WHERE id = '{new_id}' AND instr(lower(description), "
                           f"'{phrase}') > 0", [[1]]),
                     {"kind": "answer_contains", "text": new_id}]
    elif kind == 5:  # find by description, then resolve
        t = rng.choice([t for t in active])
        target, kw = t["id"], KEYWORDS[t["title"]]
        instruction = f"The problem '{t['title']}' is fixed now. Please mark that ticket resolved."
        calls = [("search_tickets", {"filters": {"text": kw}}),
                 ("update_ticket", {"ticket_id": t["id"], "changes": {"status": "resolved"}})]
        answer = f"Marked {t['id']} ({t['title']}) as resolved."
        checklist = [{"kind": "called", "tool": "update_ticket",
                      "args": {"ticket_id": t["id"], "changes": {"status": "resolved"}}},
                     state(f"SELECT status FROM tickets WHERE id = '{t['id']}'", [["resolved"]]),
                     {"kind": "answer_contains", "text": t["id"]}]
    elif kind == 6:  # escalate: find, find the agent, change three things at once
        t = rng.choice([t for t in active if t["priority"] != "urgent"] or active)
        team_agents = [a for a in agents if a["team"] == team_of(t) and a["id"] != (t["assignee"] or {}).get("id")]
        agent = rng.choice(team_agents)
        target, kw = t["id"], KEYWORDS[t["title"]]
        instruction = (f"Escalate the ticket '{t['title']}': make it urgent, add the label "
                       f"'escalated' and give it to {agent['name']}.")
        changes = {"priority": "urgent", "add_labels": ["escalated"], "assignee": agent["id"]}
        calls = [("search_tickets", {"filters": {"text": kw}}), ("list_agents", {"team": agent["team"]}),
                 ("update_ticket", {"ticket_id": t["id"], "changes": changes})]
        answer = f"Escalated {t['id']}: urgent, labelled escalated, now with {agent['name']}."
        checklist = [{"kind": "called", "tool": "update_ticket", "args": {"ticket_id": t["id"]}},
                     state(f"SELECT priority, assignee FROM tickets WHERE id = '{t['id']}'",
                           [["urgent", agent["id"]]]),
                     state(f"SELECT count(*) FROM ticket_labels WHERE ticket_id = '{t['id']}' AND label = 'escalated'",
                           [[1]]),
                     {"kind": "answer_contains", "text": t["id"]}]
    elif kind == 7:  # comment: an internal note by id, or a public reply found by its topic
        t = rng.choice([t for t in all_tickets if t["status"] != "closed"])
        target = t["id"]
        cid = f"C{len(desk.query('SELECT id FROM comments')) + 1}"
        if (i // TEMPLATES) % 2 == 0:
            note, phrase = rng.choice(NOTES)
            instruction = f"Add an internal note to {t['id']} (the team only, not the reporter): \"{note}\""
            calls = [("add_comment", {"ticket_id": t["id"], "body": note, "internal": True})]
            answer = f"Added internal note {cid} to {t['id']}."
            checklist = [{"kind": "called", "tool": "add_comment", "args": {"ticket_id": t["id"], "internal": True}},
                         state(f"SELECT internal, instr(lower(body), '{phrase}') > 0 FROM comments "
                               f"WHERE ticket_id = '{t['id']}' AND author = 'helpdesk'", [[1, 1]])]
        else:
            reply = rng.choice(REPLIES)
            kw = KEYWORDS[t["title"]]
            instruction = (f"Reply to {t['reporter']} on their ticket '{t['title']}' to say that "
                           f"{reply}.")
            body = f"Hello {t['reporter'].split()[0]}, {reply}."
            calls = [("search_tickets", {"filters": {"text": kw}}), ("add_comment", {"ticket_id": t["id"], "body": body})]
            answer = f"Replied on {t['id']} ({cid}); {t['reporter']} gets it by email."
            checklist = [{"kind": "called", "tool": "add_comment", "args": {"ticket_id": t["id"]}},
                         state(f"SELECT internal FROM comments WHERE ticket_id = '{t['id']}' AND author = 'helpdesk'",
                               [[0]]),
                         {"kind": "answer_contains", "text": t["id"]}]
    else:  # workload: the least busy agent of a team takes a ticket
        for t in rng.sample(active, len(active)):
            team = [a for a in agents if a["team"] == team_of(t)]
            counts = sorted(a["active_tickets"] for a in team)
            agent = min(team, key=lambda a: a["active_tickets"])
            if counts[0] < counts[1] and agent["id"] != (t["assignee"] or {}).get("id"):
                break
        else:
            raise AssertionError(f"seed {i}: no ticket for the workload template")
        target = t["id"]
        instruction = (f"Give {t['id']} to whichever {agent['team']} agent has the fewest active tickets, "
                       "and tell me who that is.")
        calls = [("list_agents", {"team": agent["team"]}),
                 ("update_ticket", {"ticket_id": t["id"], "changes": {"assignee": agent["id"]}})]
        answer = f"{agent['name']} has the fewest active tickets ({agent['active_tickets']}); {t['id']} is now theirs."
        checklist = [{"kind": "called", "tool": "update_ticket",
                      "args": {"ticket_id": t["id"], "changes": {"assignee": agent["id"]}}},
                     state(f"SELECT assignee FROM tickets WHERE id = '{t['id']}'", [[agent["id"]]]),
                     {"kind": "answer_contains", "text": surname(agent["name"])}]
    for name, args in calls:  # a text search in a reference finds the one ticket the task means
        if name == "search_tickets" and "text" in args["filters"]:
            find_by_text(desk, args["filters"]["text"], target)
    # Guards (docs/tasks.md): the final state must be the reference's, the answer a short reply.
    checklist.append({"kind": "answer_plain", "max_chars": max(240, 3 * len(answer))})
    # Free text (a new ticket's title and description, a comment's body) may be worded otherwise;
    # its table is judged by the state items above instead of the end_state digest.
    free = {3: "tickets", 4: "tickets", 7: "comments"}.get(kind)
    return {"_free_table": free, "id": f"helpdesk-{i:03d}", "domain": "helpdesk", "instruction": instruction, "checklist": checklist,
            "examples": examples(i, kind, target, calls), "env": {"args": {"seed": i}},
            "split": "test" if i % 4 == 3 else "train",
            "reference": {"calls": [{"name": n, "arguments": a} for n, a in calls], "answer": answer,
                          "free_args": FREE_ARGS}}


def team_of(ticket: dict) -> str:
    """A seeded ticket's team (its template's)."""
    from helpdesk import TICKETS

    return next(team for title, _, _, team in TICKETS if title == ticket["title"])


def find_by_text(desk: Helpdesk, kw: str, ticket_id: str) -> None:
    found = [t["id"] for t in desk.search_tickets({"text": kw})]
    assert found == [ticket_id], f"searching {kw!r} finds {found}, not {ticket_id} alone: fix KEYWORDS"


def examples(i: int, kind: int, target: str | None, calls: list[tuple[str, dict]]) -> list[dict]:
    """Two or three real call/result pairs from the task's own starting state, for the rehearsal to
    ground on: another ticket in full, and a call of the tool the task needs with other arguments
    (write examples run on a scratch copy, so the recorded state is never the task's answer)."""
    desk, rng = fresh(i), random.Random(f"examples:{i}")
    all_tickets = desk.search_tickets(limit=50)
    other = rng.choice([t for t in all_tickets if t["id"] != target])

    def ex(tool: str, **args) -> dict:
        return {"tool": tool, "arguments": args, "result": getattr(fresh(i), tool)(**args)}

    out = [ex("get_ticket", ticket_id=other["id"])]  # never the target: a lookup's answer is not given away
    used = {a.get("team") for name, a in calls if name == "list_agents"}
    teams = sorted({a["team"] for a in desk.list_agents()} - used)
    if kind in (1, 2):
        label = rng.choice(other["labels"])
        out.append(ex("search_tickets", filters={"labels": [label]}, limit=3))
    if kind in (2, 3, 4, 6, 8):
        out.append(ex("list_agents", team=teams[(i // TEMPLATES) % len(teams)]))
    if kind in (5, 6):
        out.append(ex("search_tickets", filters={"text": KEYWORDS[other["title"]]}))
    if kind == 7:
        out.append(ex("add_comment", ticket_id=other["id"], body="Thanks, we are looking into it."))
    if kind == 0:
        out.append(ex("search_tickets", filters={"priority": other["priority"]}, limit=3))
    return out


def replay(rows: list[dict]) -> None:
    """Each reference, run by envace in the real class, makes its calls with no tool error; their
    results are recorded in the row and its final state becomes the task's end_state guard. Then,
    with the results recorded (and the guards derived from them), it meets its whole checklist in
    the real class, and replayed from the recorded results it sees the same messages."""
    for row in rows:  # the reference's end state, from the class itself
        desk = fresh(row["env"]["args"]["seed"])
        for c in row["reference"]["calls"]:
            getattr(desk, c["name"])(**c["arguments"])
        digests = table_digests(desk.query)
        digests.pop(row.pop("_free_table") or "", None)
        row["checklist"].append({"kind": "end_state", "digests": digests})
    first = oracle_replays([Task.model_validate(r) for r in rows], RealSource(SPEC))
    record_reference_results(rows, first, "in the real helpdesk")
    tasks = [Task.model_validate(r) for r in rows]
    real, recorded = oracle_replays(tasks, RealSource(SPEC)), oracle_replays(tasks, RecordedSource())
    for task_, traj, again in zip(tasks, real, recorded):
        assert_full_marks(task_, traj, "in the real helpdesk")
        # replayed from the recorded results: what the class said, word for word
        assert [(m.role, m.content) for m in traj.messages] == [(m.role, m.content) for m in again.messages], task_.id


def replay_recorded(rows: list[dict]) -> None:
    """Each reference of a task file without SQL items, replayed from its recorded results with no
    world (as the warm start and a rehearsal-judged eval see it), meets its whole checklist."""
    tasks = [Task.model_validate(r) for r in rows]
    for task_, traj in zip(tasks, oracle_replays(tasks, RecordedSource())):
        assert_full_marks(task_, traj, "replayed from its recorded results")


def main() -> None:
    tools = [t.model_dump(mode="json") for t in resolve_world(SPEC).tools()]
    rows = [task(i) for i in range(N)]
    for row in rows:
        row["tools"] = tools
    replay(rows)
    # The same tasks without the items that read the class's SQLite state (state, end_state): for
    # the MCP server (no query()) and schema-only training, which refuse a task file whose state
    # items nothing can judge. The writes guard (every write's non-free arguments against the
    # reference's) still judges what they change, in every setting.
    portable = [{**r, "checklist": [i for i in r["checklist"] if i["kind"] not in ("state", "end_state")]}
                for r in rows]
    replay_recorded(portable)
    path = HERE / "tasks.jsonl"
    write_atomic(path, rows)
    write_atomic(HERE / "tasks_portable.jsonl", portable)
    test = sum(r["split"] == "test" for r in rows)
    print(f"wrote {len(rows)} tasks ({len(rows) - test} train, {test} test) to {path} and, without the SQL "
          "items, to tasks_portable.jsonl")


def write_atomic(path: Path, rows: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))  # never half a file


if __name__ == "__main__":
    main()
