"""Calendar world: created events appear and block slots, only organizers edit, dates are checked."""

from __future__ import annotations

import pytest

from envace.core.errors import error_code, is_error
from envace.envs.calendar import CalendarWorld

DAY = "2025-06-04"


@pytest.fixture
def cal() -> CalendarWorld:
    return CalendarWorld(4)


def ok(world: CalendarWorld, tool: str, **args) -> dict:
    result = world.call(tool, args)
    assert not is_error(result), result
    return result


def mine(cal: CalendarWorld) -> dict:
    return cal.rows("SELECT * FROM events WHERE organizer = (SELECT email FROM me) AND "
                    "status = 'confirmed' AND date > '2025-06-02' ORDER BY id")[0]


def theirs(cal: CalendarWorld) -> dict:
    return cal.rows("SELECT * FROM events WHERE organizer != (SELECT email FROM me) AND "
                    "status = 'confirmed' AND date > '2025-06-02' ORDER BY id")[0]


def test_created_event_is_listed_and_blocks_its_slot(cal):
    start = ok(cal, "find_free_slots", date=DAY, duration_minutes=60)["slots"][0]["start"]
    contact = cal.rows("SELECT email FROM contacts ORDER BY email")[0]["email"]
    e = ok(cal, "create_event", title="Demo prep", date=DAY, start_time=start,
           duration_minutes=60, attendees=[contact])
    assert e["attendees"] == [{"name": e["attendees"][0]["name"], "email": contact,
                               "response": "pending"}]
    listed = ok(cal, "list_events", date_from=DAY, date_to=DAY)["events"]
    assert e["event_id"] in [x["event_id"] for x in listed]
    assert start not in [s["start"] for s in ok(cal, "find_free_slots", date=DAY,
                                                 duration_minutes=60)["slots"]]
    clash = cal.call("create_event", {"title": "X", "date": DAY, "start_time": start,
                                      "duration_minutes": 30})
    assert error_code(clash) == "SLOT_TAKEN" and clash["error"]["conflicting_event_id"] == e["event_id"]
    busy = ok(cal, "check_availability", email=contact, date=DAY)["busy"]
    assert {"start": start, "end": e["end_time"]} in busy


def test_cancel_removes_from_listing_and_frees_the_slot(cal):
    e = mine(cal)
    ok(cal, "cancel_event", event_id=e["id"])
    assert e["id"] not in [x["event_id"] for x in ok(cal, "list_events", date_from=e["date"],
                                                      date_to=e["date"])["events"]]
    assert ok(cal, "get_event", event_id=e["id"])["status"] == "cancelled"
    assert error_code(cal.call("cancel_event", {"event_id": e["id"]})) == "EVENT_CANCELLED"
    ok(cal, "create_event", title="Reuse", date=e["date"], start_time=e["start_time"],
       duration_minutes=30)


def test_reschedule_moves_and_resets_responses(cal):
    e = mine(cal)
    length = int(e["end_time"][:2]) * 60 + int(e["end_time"][3:]) - \
        int(e["start_time"][:2]) * 60 - int(e["start_time"][3:])
    target = "2025-06-16"
    start = ok(cal, "find_free_slots", date=target, duration_minutes=length)["slots"][0]["start"]
    moved = ok(cal, "reschedule_event", event_id=e["id"], date=target, start_time=start)
    assert (moved["date"], moved["start_time"], moved["duration_minutes"]) == (target, start, length)
    assert all(a["response"] == "pending" for a in moved["attendees"])
    assert cal.query(f"SELECT date FROM events WHERE id = '{e['id']}'") == [[target]]


def test_only_the_organizer_edits_and_past_is_frozen(cal):
    other = theirs(cal)
    for tool, extra in [("cancel_event", {}), ("invite_attendee", {"email": "x@acme.io"}),
                        ("reschedule_event", {"date": "2025-06-20", "start_time": "09:00"})]:
        r = cal.call(tool, {"event_id": other["id"], **extra})
        assert error_code(r) == "NOT_ORGANIZER", (tool, r)
    past = cal.rows("SELECT id FROM events WHERE organizer = (SELECT email FROM me) AND "
                    "date < '2025-06-02' AND status = 'confirmed'")[0]["id"]
    assert error_code(cal.call("cancel_event", {"event_id": past})) == "EVENT_IN_PAST"
    assert error_code(cal.call("create_event", {"title": "x", "date": "2025-05-01",
                                                "start_time": "09:00",
                                                "duration_minutes": 30})) == "DATE_IN_PAST"
    assert error_code(cal.call("create_event", {"title": "x", "date": "2025-06-31",
                                                "start_time": "09:00",
                                                "duration_minutes": 30})) == "INVALID_DATE"
    assert error_code(cal.call("create_event", {"title": "x", "date": DAY, "start_time": "9am",
                                                "duration_minutes": 30})) == "INVALID_PARAMETERS"


def test_declining_frees_the_slot_and_invites_are_checked(cal):
    other = theirs(cal)
    assert error_code(cal.call("respond_to_event", {"event_id": mine(cal)["id"],
                                                    "response": "declined"})) == "IS_ORGANIZER"
    ok(cal, "respond_to_event", event_id=other["id"], response="declined")
    assert ok(cal, "get_event", event_id=other["id"])["my_response"] == "declined"
    ok(cal, "create_event", title="Instead", date=other["date"], start_time=other["start_time"],
       duration_minutes=15)
    e = mine(cal)
    assert error_code(cal.call("invite_attendee", {"event_id": e["id"],
                                                   "email": "nobody@acme.io"})) == "CONTACT_NOT_FOUND"
    guest = cal.rows("SELECT email FROM contacts WHERE email NOT IN (SELECT email FROM attendees "
                     "WHERE event_id = ?) ORDER BY email", e["id"])[0]["email"]
    ok(cal, "invite_attendee", event_id=e["id"], email=guest)
    assert error_code(cal.call("invite_attendee", {"event_id": e["id"], "email": guest})) == "ALREADY_INVITED"
    ok(cal, "remove_attendee", event_id=e["id"], email=guest)
    assert error_code(cal.call("remove_attendee", {"event_id": e["id"], "email": guest})) == "ATTENDEE_NOT_FOUND"


def test_listing_range_and_contacts(cal):
    week = ok(cal, "list_events")
    assert (week["date_from"], week["date_to"]) == ("2025-06-02", "2025-06-08")
    assert error_code(cal.call("list_events", {"date_from": "2025-06-10",
                                               "date_to": "2025-06-01"})) == "INVALID_DATE_RANGE"
    name = cal.rows("SELECT name FROM contacts ORDER BY name")[0]["name"]
    found = ok(cal, "search_contacts", query=name.split()[0].lower())["contacts"]
    assert name in [c["name"] for c in found]
