"""Calendar tasks: scenarios (each solves its task on a live CalendarWorld) and example samplers."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

from envace.envs.calendar import RESPONSES, TITLES, TEAMS, CalendarWorld, overlaps, hhmm, minutes
from envace.envs.taskgen import Draft, TaskSet, need
from envace.envs.world import World

TODAY = CalendarWorld.today
NEW_TITLES = ["Coffee chat", "Project kickoff", "Demo prep", "Contract review", "Brainstorm",
              "Interview debrief", "Launch checklist", "Pairing session"]
# the days tasks plan on: the next two working weeks
WORKDAYS = [str(d) for d in (TODAY + timedelta(days=k) for k in range(1, 12)) if d.weekday() < 5]


def _event(d: Draft, mine: bool | None = True) -> dict[str, Any]:
    """An upcoming confirmed event: organized by you (True), by someone else (False), either."""
    rule = {True: "organizer = (SELECT email FROM me)",
            False: "organizer != (SELECT email FROM me)", None: "1"}[mine]
    return d.pick(f"SELECT * FROM events WHERE status = 'confirmed' AND date > ? AND {rule}",
                  str(TODAY))


def _expect_booked(d: Draft, day: str, start: str) -> None:
    """State check of a created event by what it is, not by the id the world happened to give."""
    d.expect_state("SELECT title, end_time, (SELECT group_concat(email) FROM (SELECT email FROM "
                   "attendees a WHERE a.event_id = e.id ORDER BY email)) FROM events e WHERE "
                   "status = 'confirmed' AND organizer = (SELECT email FROM me) AND "
                   f"date = '{day}' AND start_time = '{start}'")


def _create(d: Draft, title: str, day: str, start: str, length: int, **attendees: Any) -> dict:
    """The reference call that books the new event (``attendees=[...]`` where it has guests)."""
    return d.do("create_event", title=title, date=day, start_time=start, duration_minutes=length, **attendees)


def _expect_created(d: Draft, day: str, start: str, length: int, **attendees: Any) -> None:
    """A booking's checks: the create_event call as asked, then the event it made."""
    d.expect_call("create_event", date=day, start_time=start, duration_minutes=length, **attendees)
    _expect_booked(d, day, start)


def _length(e: dict[str, Any]) -> int:
    return minutes(e["end_time"]) - minutes(e["start_time"])


def _find_event(d: Draft, e: dict[str, Any]) -> None:
    """Reference step: look the event up by its day."""
    d.do("list_events", date_from=e["date"], date_to=e["date"])


def _free_slots(d: Draft, day: str, length: int) -> list[str]:
    """Your free starts that day, read straight from the world (not a reference call)."""
    return [s["start"] for s in d.world.find_free_slots(day, length)["slots"]]


def _contact(d: Draft, exclude: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    people = [c for c in d.rows("SELECT * FROM contacts ORDER BY email") if c["email"] not in exclude]
    need(people)
    return d.rng.choice(people)


# -- difficulty 1 -------------------------------------------------------------------------

def where_and_who(d: Draft) -> None:
    e = _event(d, mine=False)
    d.ask(f"Where is my {e['title']} on {e['date']}, and who organizes it?")
    _find_event(d, e)
    info = d.do("get_event", event_id=e["id"])
    d.expect_call("get_event", event_id=e["id"])
    org = info["organizer"]["name"]
    d.answer(f"It is in {info['location']}, organized by {org}.", info["location"], org)


def who_is_invited(d: Draft) -> None:
    e = _event(d, mine=None)
    names = [r["name"] for r in d.rows("SELECT c.name FROM attendees a JOIN contacts c ON "
                                       "c.email = a.email WHERE a.event_id = ? ORDER BY c.name", e["id"])]
    need(1 <= len(names) <= 3)
    d.ask(f"Who is invited to the {e['title']} on {e['date']}?")
    _find_event(d, e)
    d.do("get_event", event_id=e["id"])
    d.expect_call("get_event", event_id=e["id"])
    d.answer(f"Invited: {', '.join(names)}.", *names)


def cancel_event(d: Draft) -> None:
    e = _event(d)
    d.ask(f"Cancel my {e['title']} on {e['date']}.")
    _find_event(d, e)
    d.do("cancel_event", event_id=e["id"])
    d.expect_call("cancel_event", event_id=e["id"])
    d.expect_state(f"SELECT status FROM events WHERE id = '{e['id']}'")
    d.answer(f"Your {e['title']} on {e['date']} is cancelled.")


def decline_event(d: Draft) -> None:
    e = _event(d, mine=False)
    response = d.rng.choice(["declined", "tentative"])
    verb = "Decline" if response == "declined" else "Answer 'tentative' to"
    d.ask(f"{verb} the {e['title']} on {e['date']}.")
    _find_event(d, e)
    d.do("respond_to_event", event_id=e["id"], response=response)
    d.expect_call("respond_to_event", event_id=e["id"], response=response)
    d.expect_state(f"SELECT my_response FROM events WHERE id = '{e['id']}'")
    d.answer(f"Done: you answered {response} to the {e['title']}.")


# -- difficulty 2 -------------------------------------------------------------------------

def schedule_with(d: Draft) -> None:
    c, day = _contact(d), d.rng.choice(WORKDAYS)
    length = d.rng.choice([30, 45, 60])
    slots = _free_slots(d, day, length)
    need(slots)
    start, title = d.rng.choice(slots), d.rng.choice(NEW_TITLES)
    d.ask(f"Schedule '{title}' with {c['name']} on {day} at {start} for {length} minutes.")
    d.do("search_contacts", query=c["name"])
    e = _create(d, title, day, start, length, attendees=[c["email"]])
    _expect_created(d, day, start, length, attendees=[c["email"]])
    d.answer(f"Booked '{title}' on {day}, {start}-{e['end_time']}, with {c['name']}.", start)


def invite(d: Draft) -> None:
    e = _event(d)
    taken = {r["email"] for r in d.rows("SELECT email FROM attendees WHERE event_id = ?", e["id"])}
    c = _contact(d, taken)
    d.ask(f"Add {c['name']} to my {e['title']} on {e['date']}.")
    _find_event(d, e)
    d.do("search_contacts", query=c["name"])
    d.do("invite_attendee", event_id=e["id"], email=c["email"])
    d.expect_call("invite_attendee", event_id=e["id"], email=c["email"])
    d.expect_state(f"SELECT email, response FROM attendees WHERE event_id = '{e['id']}' "
                   "ORDER BY email")
    d.answer(f"{c['name']} ({c['email']}) is invited to the {e['title']}.")


def reschedule(d: Draft) -> None:
    e = _event(d)
    day = d.rng.choice([x for x in WORKDAYS if x != e["date"]])
    slots = _free_slots(d, day, _length(e))
    need(slots)
    start = d.rng.choice(slots)
    d.ask(f"Move my {e['title']} on {e['date']} to {day} at {start}, same length.")
    _find_event(d, e)
    r = d.do("reschedule_event", event_id=e["id"], date=day, start_time=start)
    d.expect_call("reschedule_event", event_id=e["id"], date=day, start_time=start)
    d.expect_state(f"SELECT date, start_time, end_time FROM events WHERE id = '{e['id']}'")
    d.answer(f"Moved to {day}, {start}-{r['end_time']}.", r["end_time"])


def book_earliest(d: Draft) -> None:
    day, length = d.rng.choice(WORKDAYS), d.rng.choice([30, 60, 90])
    title = d.rng.choice(NEW_TITLES)
    d.ask(f"Book a {length}-minute '{title}' at my earliest free time on {day} (9:00-17:00) and "
          "tell me when it starts.")
    slots = d.do("find_free_slots", date=day, duration_minutes=length)["slots"]
    need(slots)
    start = slots[0]["start"]
    e = _create(d, title, day, start, length)
    _expect_created(d, day, start, length)
    d.answer(f"Booked '{title}' on {day} from {start} to {e['end_time']}.", start)


# -- difficulty 3 -------------------------------------------------------------------------

def mutual_slot(d: Draft) -> None:
    length, title = d.rng.choice([30, 60]), d.rng.choice(NEW_TITLES)
    for _ in range(8):  # find a colleague and day where their calendar changes the answer
        c, day = _contact(d), d.rng.choice(WORKDAYS)
        busy = d.world.check_availability(c["email"], day)["busy"]
        mine = d.world.find_free_slots(day, length)["slots"]
        both = [s for s in mine if not any(overlaps((minutes(s["start"]), minutes(s["end"])),
                                                     (minutes(b["start"]), minutes(b["end"])))
                                           for b in busy)]
        if both and both[0] != mine[0]:
            break
    else:
        need(False)
    d.ask(f"Find the earliest {length}-minute slot on {day} (9:00-17:00) when both {c['name']} and "
          f"I are free, book '{title}' with them then, and tell me the time.")
    d.do("search_contacts", query=c["name"])
    d.do("check_availability", email=c["email"], date=day)
    d.do("find_free_slots", date=day, duration_minutes=length)
    start = both[0]["start"]
    e = _create(d, title, day, start, length, attendees=[c["email"]])
    d.expect_call("check_availability", email=c["email"], date=day)
    _expect_created(d, day, start, length, attendees=[c["email"]])
    d.answer(f"Booked '{title}' with {c['name']} on {day} at {start}-{e['end_time']}.", start)


def move_to_first_free(d: Draft) -> None:
    e = _event(d)
    day = d.rng.choice([x for x in WORKDAYS if x != e["date"]])
    d.ask(f"Move my {e['title']} on {e['date']} to the earliest free slot on {day} (same length, "
          "9:00-17:00) and tell me the new time.")
    _find_event(d, e)
    d.do("get_event", event_id=e["id"])
    slots = d.do("find_free_slots", date=day, duration_minutes=_length(e))["slots"]
    need(slots)
    start = slots[0]["start"]
    d.do("reschedule_event", event_id=e["id"], date=day, start_time=start)
    d.expect_call("reschedule_event", event_id=e["id"], date=day, start_time=start)
    d.expect_state(f"SELECT date, start_time, end_time FROM events WHERE id = '{e['id']}'")
    d.answer(f"Moved the {e['title']} to {day} at {start}.", start)


def swap_attendee(d: Draft) -> None:
    e = _event(d)
    guests = d.rows("SELECT c.* FROM attendees a JOIN contacts c ON c.email = a.email "
                    "WHERE a.event_id = ? ORDER BY c.email", e["id"])
    need(guests)
    out = d.rng.choice(guests)
    new = _contact(d, {g["email"] for g in guests})
    d.ask(f"On my {e['title']} on {e['date']}, replace {out['name']} with {new['name']}.")
    _find_event(d, e)
    d.do("get_event", event_id=e["id"])
    d.do("remove_attendee", event_id=e["id"], email=out["email"])
    d.do("search_contacts", query=new["name"])
    d.do("invite_attendee", event_id=e["id"], email=new["email"])
    d.expect_call("remove_attendee", event_id=e["id"], email=out["email"])
    d.expect_call("invite_attendee", event_id=e["id"], email=new["email"])
    d.expect_state(f"SELECT email FROM attendees WHERE event_id = '{e['id']}' ORDER BY email")
    d.answer(f"{out['name']} is off the {e['title']} and {new['name']} is invited.")


def decline_and_replace(d: Draft) -> None:
    e = _event(d, mine=False)
    need(d.world.scalar("SELECT my_response FROM events WHERE id = ?", e["id"]) != "declined")
    title = d.rng.choice(NEW_TITLES)
    d.ask(f"Decline the {e['title']} on {e['date']} and book '{title}' in that same time slot "
          "instead.")
    _find_event(d, e)
    d.do("respond_to_event", event_id=e["id"], response="declined")
    _create(d, title, e["date"], e["start_time"], _length(e))
    d.expect_call("respond_to_event", event_id=e["id"], response="declined")
    d.expect_call("create_event", date=e["date"], start_time=e["start_time"],
                  duration_minutes=_length(e))
    d.expect_state(f"SELECT my_response FROM events WHERE id = '{e['id']}'")
    _expect_booked(d, e["date"], e["start_time"])
    d.answer(f"Declined the {e['title']} and booked '{title}' on {e['date']}, "
             f"{e['start_time']}-{e['end_time']}.", e["start_time"])


# -- example samplers ---------------------------------------------------------------------

def _any(w: World, rng: random.Random, sql: str) -> Any:
    rows = sorted(w.db.execute(sql).fetchall())  # sorted: never depend on the query plan
    return rng.choice(rows)[0] if rows else None


def _day(rng: random.Random) -> str:
    return rng.choice(WORKDAYS)


def _attendee(w: World, rng: random.Random) -> dict[str, Any] | None:
    rows = w.db.execute("SELECT event_id, email FROM attendees ORDER BY event_id, email").fetchall()
    if not rows:
        return None
    event_id, email = rng.choice(rows)
    return {"event_id": event_id, "email": email}


def _prefer(w: World, rng: random.Random, good: str) -> Any:
    """Mostly a target the tool accepts (grounding shows the normal result), sometimes any."""
    return rng.random() < 0.75 and _any(w, rng, good) or _any(w, rng, "SELECT id FROM events")


MINE = f"SELECT id FROM events WHERE organizer = (SELECT email FROM me) AND date > '{TODAY}'"
THEIRS = "SELECT id FROM events WHERE organizer != (SELECT email FROM me)"

SAMPLERS = {
    "list_events": lambda w, r: {"date_from": (x := _day(r)), "date_to": x},
    "get_event": lambda w, r: {"event_id": _any(w, r, "SELECT id FROM events")},
    "find_free_slots": lambda w, r: {"date": _day(r), "duration_minutes": r.choice([30, 60])},
    "create_event": lambda w, r: {"title": r.choice(TITLES), "date": _day(r),
                                  "start_time": hhmm(r.randrange(9 * 60, 16 * 60, 30)),
                                  "duration_minutes": r.choice([30, 60])},
    "reschedule_event": lambda w, r: {"event_id": _prefer(w, r, MINE), "date": _day(r),
                                      "start_time": hhmm(r.randrange(9 * 60, 16 * 60, 30))},
    "cancel_event": lambda w, r: {"event_id": _prefer(w, r, MINE)},
    "invite_attendee": lambda w, r: {"event_id": _prefer(w, r, MINE),
                                     "email": _any(w, r, "SELECT email FROM contacts")},
    "remove_attendee": _attendee,
    "respond_to_event": lambda w, r: {"event_id": _prefer(w, r, THEIRS),
                                      "response": r.choice(RESPONSES)},
    "search_contacts": lambda w, r: {"query": r.choice(
        [_any(w, r, "SELECT name FROM contacts").split()[0], r.choice(TEAMS)])},
    "check_availability": lambda w, r: {"email": _any(w, r, "SELECT email FROM contacts"),
                                        "date": _day(r)},
}

TASKS = TaskSet(
    world="calendar",
    scenarios={1: [where_and_who, who_is_invited, cancel_event, decline_event],
               2: [schedule_with, invite, reschedule, book_earliest],
               3: [mutual_slot, move_to_first_free, swap_attendee, decline_and_replace]},
    samplers=SAMPLERS,
)
