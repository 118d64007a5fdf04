"""A work calendar: your events, colleagues' availability, free slots, invitations."""

from __future__ import annotations

import random
from datetime import date, timedelta
from typing import Any

from envace.envs.world import DATE, ID, TIME, ToolFailure, World, enum, found, integer, parse_date, prop, tool

PEOPLE = ["Dana Whitfield", "Omar Haddad", "Lena Fischer", "Raj Iyer", "Mia Santos",
          "Kofi Mensah", "Yuki Tanaka", "Elena Petrova", "Tom Becker", "Ines Moreau",
          "Sara Lindqvist", "Ben Okafor", "Clara Nguyen", "Hugo Martins", "Aisha Rahman",
          "Leo Kowalski", "Nina Rossi", "Felix Wagner"]
TEAMS = ["Design", "Engineering", "Sales", "Finance", "Marketing", "Support"]
TITLES = ["Sprint planning", "Design review", "Budget sync", "Customer call", "Roadmap review",
          "Hiring panel", "Quarterly review", "Lunch and learn", "Product demo",
          "Security training", "Vendor meeting", "Marketing sync", "Team retro",
          "Architecture review", "Offsite planning", "Onboarding session", "Sales pipeline"]
ROOMS = ["Aspen room", "Birch room", "Cedar room", "Video call", "Cafeteria"]
DURATIONS = [30, 45, 60, 90]
RESPONSES = ["accepted", "declined", "tentative"]
DAY_START, DAY_END = 8 * 60, 18 * 60  # generated meetings fall inside office hours
DOMAIN = "acme.io"
HOURS = list(range(8, 18))
BUSY_COUNTS = [0, 1, 1, 2]  # colleagues' own meetings per day, drawn with 2 random bits
BUSY_SHAPES = [(0, 30), (0, 60), (30, 30), (30, 60)]  # (minutes past the hour, length)
GUEST_RESPONSES = ["accepted", "accepted", "pending", "declined"]
MAX_RANGE_DAYS = 31
EMAIL = {"type": "string", "minLength": 3, "maxLength": 100}  # a contact's address, as tools take it
EVENT_ID = "Event id, e.g. 'e-2041'."  # the event_id property's description, in every tool that takes one

SCHEMA = """
CREATE TABLE me(name TEXT, email TEXT);
CREATE TABLE contacts(email TEXT PRIMARY KEY, name TEXT, team TEXT);
CREATE TABLE contact_busy(email TEXT, date TEXT, start_time TEXT, end_time TEXT);
CREATE TABLE events(id TEXT PRIMARY KEY, num INT, title TEXT, date TEXT, start_time TEXT,
                    end_time TEXT, location TEXT, organizer TEXT, status TEXT, my_response TEXT);
CREATE TABLE attendees(event_id TEXT, email TEXT, response TEXT, PRIMARY KEY(event_id, email));
"""


def minutes(hhmm: str) -> int:
    return int(hhmm[:2]) * 60 + int(hhmm[3:])


_HHMM = [f"{m // 60:02d}:{m % 60:02d}" for m in range(24 * 60 + 1)]


def hhmm(m: int) -> str:
    return _HHMM[m]


def _email(name: str) -> str:
    return name.lower().replace(" ", ".") + "@" + DOMAIN


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


class CalendarWorld(World):
    name = "calendar"
    today = date(2025, 6, 2)  # a Monday
    schema = SCHEMA

    def populate(self, rng: random.Random) -> None:
        people = rng.sample(PEOPLE, 11)
        me, contacts = people[0], people[1:]
        self.db.execute("INSERT INTO me VALUES (?, ?)", (me, _email(me)))
        self.db.executemany("INSERT INTO contacts VALUES (?,?,?)",
                            [(_email(p), p, rng.choice(TEAMS)) for p in contacts])
        emails = [_email(p) for p in contacts]
        days = [self.today + timedelta(days=d) for d in range(-7, 19)]
        days = [d for d in days if d.weekday() < 5]
        events, busy = [], []
        for day in days:
            # colleagues' own commitments (seen only through check_availability); the past
            # does not matter for planning, so only from today on
            for e in emails if day >= self.today else ():
                n_busy = BUSY_COUNTS[rng.getrandbits(2)]
                for hour in rng.sample(HOURS, n_busy) if n_busy else ():
                    start, length = BUSY_SHAPES[rng.getrandbits(2)]  # <= 60 min in distinct
                    start += hour * 60                                  # hours: no overlap
                    busy.append((e, str(day), hhmm(start), hhmm(start + length)))
            titles = rng.sample(TITLES, 4)
            for start, end in self._pack(rng, rng.randint(1, 4)):
                events.append((day, start, end, titles.pop()))
        rng.shuffle(events)  # ids follow creation order, not the date
        base = rng.randint(2000, 8000)
        rows, guests = [], []
        for k, (day, start, end, title) in enumerate(events):
            eid, organizer = f"e-{base + k}", rng.choice([_email(me)] * 3 + emails[:6])
            mine = organizer == _email(me)
            status = "cancelled" if rng.random() < 0.07 else "confirmed"
            rows.append((eid, base + k, title, str(day), hhmm(start), hhmm(end), rng.choice(ROOMS),
                         organizer, status, "accepted" if mine else rng.choice(["accepted", "pending"])))
            others = [e for e in emails if e != organizer]
            guests += [(eid, g, rng.choice(GUEST_RESPONSES))
                       for g in rng.sample(others, rng.randint(0 if mine else 1, 3))]
        self.db.executemany("INSERT INTO contact_busy VALUES (?,?,?,?)", busy)
        self.db.executemany("INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
        self.db.executemany("INSERT INTO attendees VALUES (?,?,?)", guests)

    @staticmethod
    def _pack(rng: random.Random, n: int) -> list[tuple[int, int]]:
        """Up to ``n`` non-overlapping meetings on the half-hour grid."""
        taken: list[tuple[int, int]] = []
        for _ in range(n * 4):
            if len(taken) == n:
                break
            dur = rng.choice(DURATIONS)
            start = rng.randrange(DAY_START, DAY_END - dur + 1, 30)
            if not any(overlaps((start, start + dur), t) for t in taken):
                taken.append((start, start + dur))
        return sorted(taken)

    # -- lookups ------------------------------------------------------------------------

    def _me(self) -> str:
        return self.scalar("SELECT email FROM me")

    def _event(self, event_id: str) -> dict[str, Any]:
        return self.by_id("events", "event", event_id)

    def _editable(self, event_id: str) -> dict[str, Any]:
        """The event, if you may change it: yours, not cancelled, not over."""
        e = self._event(event_id)
        if e["status"] == "cancelled":
            raise ToolFailure("EVENT_CANCELLED", f"Event {event_id} is cancelled")
        if e["organizer"] != self._me():
            raise ToolFailure("NOT_ORGANIZER", f"Only the organizer ({e['organizer']}) can change "
                              f"event {event_id}", organizer=e["organizer"])
        if date.fromisoformat(e["date"]) < self.today:
            raise ToolFailure("EVENT_IN_PAST", f"Event {event_id} took place on {e['date']}")
        return e

    def _contact(self, email: str) -> dict[str, Any]:
        return found(self.row("SELECT * FROM contacts WHERE lower(email) = lower(?)", email), "CONTACT_NOT_FOUND",
                     f"No contact with email {email!r}")

    def _future_day(self, value: str) -> date:
        day = parse_date(value)
        if day < self.today:
            raise ToolFailure("DATE_IN_PAST", f"{value} is before today ({self.today})")
        return day

    def _my_busy(self, day: str, skip: str | None = None) -> list[tuple[int, int, str]]:
        return [(minutes(r["start_time"]), minutes(r["end_time"]), r["id"]) for r in self.rows(
            "SELECT * FROM events WHERE date = ? AND status = 'confirmed' "
            "AND my_response != 'declined' AND id IS NOT ? ORDER BY start_time, id", day, skip)]

    def _check_free(self, day: str, start: int, end: int, skip: str | None = None) -> None:
        for s, e, eid in self._my_busy(day, skip):
            if overlaps((start, end), (s, e)):
                raise ToolFailure("SLOT_TAKEN", f"{hhmm(start)}-{hhmm(end)} on {day} overlaps "
                                  f"event {eid} ({hhmm(s)}-{hhmm(e)})", conflicting_event_id=eid)

    def _span(self, start_time: str, duration: int) -> tuple[int, int]:
        start = minutes(start_time)
        if start + duration > 24 * 60:
            raise ToolFailure("INVALID_TIME", "The event must end before midnight")
        return start, start + duration

    def _detail(self, event_id: str) -> dict[str, Any]:
        e = self._event(event_id)
        names = dict(self.db.execute("SELECT email, name FROM contacts UNION SELECT email, name FROM me"))
        guests = self.rows("SELECT * FROM attendees WHERE event_id = ? ORDER BY email", event_id)
        return {
            "event_id": e["id"], "title": e["title"], "date": e["date"],
            "start_time": e["start_time"], "end_time": e["end_time"],
            "duration_minutes": minutes(e["end_time"]) - minutes(e["start_time"]),
            "location": e["location"], "status": e["status"],
            "organizer": {"name": names.get(e["organizer"]), "email": e["organizer"]},
            "attendees": [{"name": names.get(g["email"]), "email": g["email"],
                           "response": g["response"]} for g in guests],
            "my_response": e["my_response"],
        }

    # -- tools --------------------------------------------------------------------------

    @tool("List your (not cancelled) events between two dates, inclusive; defaults to the "
          "next 7 days. At most 31 days at once.",
          {"date_from": prop(DATE, "First day, YYYY-MM-DD (default today)."),
           "date_to": prop(DATE, "Last day, YYYY-MM-DD (default 6 days after date_from).")})
    def list_events(self, date_from: str | None = None, date_to: str | None = None) -> dict:
        first = parse_date(date_from) if date_from else self.today
        last = parse_date(date_to) if date_to else first + timedelta(days=6)
        if last < first or (last - first).days >= MAX_RANGE_DAYS:
            raise ToolFailure("INVALID_DATE_RANGE", "date_to must be on or after date_from and "
                              f"within {MAX_RANGE_DAYS} days of it")
        rows = self.rows("SELECT * FROM events WHERE status = 'confirmed' AND date BETWEEN ? AND ? "
                         "ORDER BY date, start_time, id", str(first), str(last))
        return {"date_from": str(first), "date_to": str(last), "count": len(rows),
                "events": [{"event_id": r["id"], "title": r["title"], "date": r["date"],
                            "start_time": r["start_time"], "end_time": r["end_time"]}
                           for r in rows]}

    @tool("Get one event: time, location, organizer, attendees and their responses.",
          {"event_id": prop(ID, EVENT_ID)}, required=("event_id",))
    def get_event(self, event_id: str) -> dict:
        return self._detail(event_id)

    @tool("Find the times on a day when you have no meetings, as start times on the half hour.",
          {"date": prop(DATE, "Day to search, YYYY-MM-DD."),
           "duration_minutes": integer(15, 480, "Length of the slot needed."),
           "earliest": prop(TIME, "Earliest start, HH:MM (default 09:00)."),
           "latest": prop(TIME, "Latest end, HH:MM (default 17:00).")},
          required=("date", "duration_minutes"))
    def find_free_slots(self, date: str, duration_minutes: int, earliest: str = "09:00",
                        latest: str = "17:00") -> dict:
        day = str(self._future_day(date))
        lo, hi = minutes(earliest), minutes(latest)
        if lo >= hi:
            raise ToolFailure("INVALID_TIME_RANGE", "earliest must be before latest")
        busy = self._my_busy(day)
        start = -(-lo // 30) * 30
        slots = []
        while start + duration_minutes <= hi:
            span = (start, start + duration_minutes)
            if not any(overlaps(span, (s, e)) for s, e, _ in busy):
                slots.append({"start": hhmm(span[0]), "end": hhmm(span[1])})
            start += 30
        return {"date": day, "duration_minutes": duration_minutes, "slots": slots}

    @tool("Create an event you organize. Attendees must be colleagues from the directory; "
          "fails with SLOT_TAKEN if it overlaps one of your events.",
          {"title": {"type": "string", "minLength": 1, "maxLength": 100, "description": "Title."},
           "date": prop(DATE, "Day, YYYY-MM-DD."),
           "start_time": prop(TIME, "Start, HH:MM."),
           "duration_minutes": integer(15, 480, "Length in minutes."),
           "location": {"type": "string", "maxLength": 100, "description": "Room or 'Video call'."},
           "attendees": {"type": "array", "items": {"type": "string", "maxLength": 100},
                         "maxItems": 10, "uniqueItems": True,
                         "description": "Email addresses of colleagues to invite."}},
          required=("title", "date", "start_time", "duration_minutes"), writes=True)
    def create_event(self, title: str, date: str, start_time: str, duration_minutes: int,
                     location: str = "Video call", attendees: list[str] | None = None) -> dict:
        day = str(self._future_day(date))
        start, end = self._span(start_time, duration_minutes)
        guests = [self._contact(a)["email"] for a in attendees or []]
        self._check_free(day, start, end)
        num = self.scalar("SELECT MAX(num) FROM events") + 1
        eid = f"e-{num}"
        self.db.execute("INSERT INTO events VALUES (?,?,?,?,?,?,?,?,'confirmed','accepted')",
                        (eid, num, title, day, hhmm(start), hhmm(end), location, self._me()))
        self.db.executemany("INSERT OR IGNORE INTO attendees VALUES (?,?,'pending')",
                            [(eid, g) for g in guests])
        return self._detail(eid)

    @tool("Move one of your events to a new date and time; attendees are asked to respond again.",
          {"event_id": prop(ID, EVENT_ID),
           "date": prop(DATE, "New day, YYYY-MM-DD."),
           "start_time": prop(TIME, "New start, HH:MM."),
           "duration_minutes": integer(15, 480, "New length (default: keep the current one).")},
          required=("event_id", "date", "start_time"), writes=True)
    def reschedule_event(self, event_id: str, date: str, start_time: str,
                         duration_minutes: int | None = None) -> dict:
        e = self._editable(event_id)
        day = str(self._future_day(date))
        length = duration_minutes or minutes(e["end_time"]) - minutes(e["start_time"])
        start, end = self._span(start_time, length)
        self._check_free(day, start, end, skip=event_id)
        self.db.execute("UPDATE events SET date = ?, start_time = ?, end_time = ? WHERE id = ?",
                        (day, hhmm(start), hhmm(end), event_id))
        self.db.execute("UPDATE attendees SET response = 'pending' WHERE event_id = ?", (event_id,))
        return self._detail(event_id)

    @tool("Cancel one of your events.",
          {"event_id": prop(ID, EVENT_ID),
           "notify_attendees": {"type": "boolean", "default": True,
                                "description": "Email the attendees (default true)."}},
          required=("event_id",), writes=True)
    def cancel_event(self, event_id: str, notify_attendees: bool = True) -> dict:
        self._editable(event_id)
        self.db.execute("UPDATE events SET status = 'cancelled' WHERE id = ?", (event_id,))
        guests = [r[0] for r in self.db.execute(
            "SELECT email FROM attendees WHERE event_id = ? ORDER BY email", (event_id,))]
        return {"event_id": event_id, "status": "cancelled",
                "notified": guests if notify_attendees else []}

    @tool("Invite a colleague to one of your events.",
          {"event_id": prop(ID, EVENT_ID),
           "email": prop(EMAIL, "Colleague's email address.")},
          required=("event_id", "email"), writes=True)
    def invite_attendee(self, event_id: str, email: str) -> dict:
        e = self._editable(event_id)
        guest = self._contact(email)["email"]
        if self.row("SELECT 1 AS x FROM attendees WHERE event_id = ? AND email = ?", event_id, guest) \
                or guest == e["organizer"]:
            raise ToolFailure("ALREADY_INVITED", f"{guest} is already on event {event_id}")
        self.db.execute("INSERT INTO attendees VALUES (?, ?, 'pending')", (event_id, guest))
        return self._detail(event_id)

    @tool("Remove an attendee from one of your events.",
          {"event_id": prop(ID, EVENT_ID),
           "email": prop(EMAIL, "Attendee's email address.")},
          required=("event_id", "email"), writes=True)
    def remove_attendee(self, event_id: str, email: str) -> dict:
        self._editable(event_id)
        if not self.db.execute("DELETE FROM attendees WHERE event_id = ? AND lower(email) = lower(?)",
                               (event_id, email)).rowcount:
            raise ToolFailure("ATTENDEE_NOT_FOUND", f"{email} is not invited to event {event_id}")
        return self._detail(event_id)

    @tool("Answer an invitation to an event someone else organizes. Declined events do not "
          "block your free slots.",
          {"event_id": prop(ID, EVENT_ID),
           "response": enum(RESPONSES, "Your answer.")},
          required=("event_id", "response"), writes=True)
    def respond_to_event(self, event_id: str, response: str) -> dict:
        e = self._event(event_id)
        if e["organizer"] == self._me():
            raise ToolFailure("IS_ORGANIZER", f"You organize event {event_id}; nothing to answer")
        if e["status"] == "cancelled":
            raise ToolFailure("EVENT_CANCELLED", f"Event {event_id} is cancelled")
        self.db.execute("UPDATE events SET my_response = ? WHERE id = ?", (response, event_id))
        return {"event_id": event_id, "title": e["title"], "my_response": response}

    @tool("Search the company directory by name, email or team.",
          {"query": {"type": "string", "minLength": 1, "maxLength": 100,
                     "description": "Words to match, e.g. a first name."}},
          required=("query",))
    def search_contacts(self, query: str) -> dict:
        words = query.lower().split()
        found = [{"name": c["name"], "email": c["email"], "team": c["team"]}
                 for c in self.rows("SELECT * FROM contacts ORDER BY name")
                 if all(w in f"{c['name']} {c['email']} {c['team']}".lower() for w in words)]
        return {"count": len(found), "contacts": found}

    @tool("See when a colleague is busy on a given day (their meetings and yours with them).",
          {"email": prop(EMAIL, "Colleague's email address."),
           "date": prop(DATE, "Day, YYYY-MM-DD.")},
          required=("email", "date"))
    def check_availability(self, email: str, date: str) -> dict:
        c = self._contact(email)
        day = str(parse_date(date))
        own = self.db.execute("SELECT start_time, end_time FROM contact_busy WHERE email = ? "
                              "AND date = ?", (c["email"], day)).fetchall()
        shared = self.db.execute(
            "SELECT start_time, end_time FROM events e WHERE date = ?1 AND status = 'confirmed' "
            "AND (organizer = ?2 OR EXISTS (SELECT 1 FROM attendees a WHERE a.event_id = e.id "
            "AND a.email = ?2 AND a.response != 'declined'))", (day, c["email"])).fetchall()
        busy = sorted(set(own) | set(shared))
        return {"email": c["email"], "name": c["name"], "date": day,
                "busy": [{"start": s, "end": e} for s, e in busy]}
