"""The wire additions of the timeline (docs/history.md, "Timeline wire additions"): every
literal round-trips, old shapes stay exactly as they were, strict decoding of the new
fields, and any new value round-trips."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gapline.history import (
    Clear,
    EditMessage,
    EventItem,
    InReplyTo,
    MarkRead,
    Member,
    MembersChanged,
    Mirror,
    OpenThread,
    PaginateBackwards,
    Reaction,
    RedactEvent,
    ReplyStatus,
    SendMessage,
    SendReaction,
    SetTyping,
    ShrinkTimeline,
    ThreadLatest,
    ThreadSummary,
    TimelineChanged,
    TimelineReset,
    TypingChanged,
    WireError,
    command_from_wire,
    dumps,
    event_from_wire,
    item_from_wire,
    loads,
    state_from_wire,
    to_wire,
)

COMMANDS = [
    (
        '{"SendMessage": {"room_id": "!r:example.org", "body": "yes", "in_reply_to": "$q:example.org"}}',
        SendMessage("!r:example.org", "yes", in_reply_to="$q:example.org"),
    ),
    (
        '{"SendMessage": {"room_id": "!r:example.org", "body": "in the thread", "thread_root": "$root:example.org"}}',
        SendMessage("!r:example.org", "in the thread", thread_root="$root:example.org"),
    ),
    (
        '{"SendReaction": {"room_id": "!r:example.org", "event_id": "$e:example.org", "key": "👍"}}',
        SendReaction("!r:example.org", "$e:example.org", "👍"),
    ),
    (
        '{"RedactEvent": {"room_id": "!r:example.org", "event_id": "$e:example.org", "reason": "spam"}}',
        RedactEvent("!r:example.org", "$e:example.org", "spam"),
    ),
    (
        '{"RedactEvent": {"room_id": "!r:example.org", "event_id": "$e:example.org"}}',
        RedactEvent("!r:example.org", "$e:example.org"),
    ),
    (
        '{"EditMessage": {"room_id": "!r:example.org", "event_id": "$e:example.org", "body": "fixed"}}',
        EditMessage("!r:example.org", "$e:example.org", "fixed"),
    ),
    (
        '{"MarkRead": {"room_id": "!r:example.org", "event_id": "$e:example.org"}}',
        MarkRead("!r:example.org", "$e:example.org"),
    ),
    (
        '{"MarkRead": {"room_id": "!r:example.org", "event_id": "$e:example.org", "private": true}}',
        MarkRead("!r:example.org", "$e:example.org", private=True),
    ),
    (
        '{"OpenThread": {"room_id": "!r:example.org", "thread_root": "$root:example.org"}}',
        OpenThread("!r:example.org", "$root:example.org"),
    ),
    ('{"ShrinkTimeline": {"room_id": "!r:example.org"}}', ShrinkTimeline("!r:example.org")),
    (
        '{"ShrinkTimeline": {"room_id": "!r:example.org", "thread_root": "$root:example.org"}}',
        ShrinkTimeline("!r:example.org", "$root:example.org"),
    ),
    (
        '{"SetTyping": {"room_id": "!r:example.org", "typing": true}}',
        SetTyping("!r:example.org", True),
    ),
    (
        '{"PaginateBackwards": {"room_id": "!r:example.org", "count": 50, "thread_root": "$root:example.org"}}',
        PaginateBackwards("!r:example.org", 50, thread_root="$root:example.org"),
    ),
]

FULL_ITEM_JSON = """{"Event": {"id": "$e:example.org", "event_id": "$e:example.org",
  "sender": "@b:example.org", "origin_server_ts": 1700000000000, "event_type": "m.room.message",
  "body": "sounds good", "edited": true, "redacted": false, "receipts": [],
  "encrypted": false, "decryption": null, "send_state": null,
  "sender_name": "Bob",
  "in_reply_to": {"event_id": "$q:example.org", "status": "Ready", "sender": "@a:example.org",
    "sender_name": "Alice", "body": "lunch at noon?", "redacted": false},
  "reactions": [{"key": "👍", "senders": ["@a:example.org", "@c:example.org"]}],
  "thread_summary": {"count": 2, "latest": {"event_id": "$t:example.org",
    "sender": "@c:example.org", "sender_name": null, "body": "I'll be late", "redacted": false},
    "participated": true}}}"""
FULL_ITEM = EventItem(
    id="$e:example.org",
    event_id="$e:example.org",
    sender="@b:example.org",
    origin_server_ts=1700000000000,
    event_type="m.room.message",
    body="sounds good",
    edited=True,
    sender_name="Bob",
    in_reply_to=InReplyTo(
        event_id="$q:example.org",
        status=ReplyStatus.Ready,
        sender="@a:example.org",
        sender_name="Alice",
        body="lunch at noon?",
    ),
    reactions=(Reaction("👍", ("@a:example.org", "@c:example.org")),),
    thread_summary=ThreadSummary(
        count=2,
        latest=ThreadLatest(
            event_id="$t:example.org", sender="@c:example.org", body="I'll be late"
        ),
        participated=True,
    ),
)
PENDING_QUOTE = {"event_id": "$q:x", "status": "Pending", "sender": None, "sender_name": None,
                 "body": None, "redacted": False}  # fmt: skip

EVENTS = [
    (
        '{"TypingChanged": {"room_id": "!r:example.org", "user_ids": ["@b:example.org"]}}',
        TypingChanged("!r:example.org", ("@b:example.org",)),
    ),
    (
        '{"MembersChanged": {"room_id": "!r:example.org", "members": [{"user_id": "@b:example.org",'
        ' "display_name": "Bob", "membership": "join"}]}}',
        MembersChanged("!r:example.org", (Member(user_id="@b:example.org", display_name="Bob"),)),
    ),
    (
        '{"TimelineReset": {"room_id": "!r:example.org", "items": [], "thread_root": "$root:example.org"}}',
        TimelineReset("!r:example.org", (), "$root:example.org"),
    ),
    (
        '{"TimelineChanged": {"room_id": "!r:example.org", "diffs": ["Clear"], "thread_root": "$root:example.org"}}',
        TimelineChanged("!r:example.org", (Clear(),), "$root:example.org"),
    ),
]


def _round_trip(text: str, expected: object, decode) -> None:
    data = json.loads(text)
    assert decode(data) == expected
    assert to_wire(expected) == data
    assert json.loads(dumps(expected)) == data


@pytest.mark.parametrize(("text", "expected"), COMMANDS)
def test_new_commands_round_trip(text: str, expected: object) -> None:
    _round_trip(text, expected, command_from_wire)


def test_a_row_with_everything_round_trips() -> None:
    _round_trip(FULL_ITEM_JSON, FULL_ITEM, item_from_wire)


def test_unset_new_fields_leave_the_old_shapes_exactly() -> None:
    plain = EventItem(
        id="r", event_id="$e", sender="@a:x", origin_server_ts=1,
        event_type="m.room.message", body="b",
    )  # fmt: skip
    assert list(to_wire(plain)["Event"]) == [
        "id", "event_id", "sender", "origin_server_ts", "event_type", "body", "edited",
        "redacted", "receipts", "encrypted", "decryption", "send_state",
    ]  # fmt: skip
    assert to_wire(SendMessage("!r:x", "hi")) == {"SendMessage": {"room_id": "!r:x", "body": "hi"}}
    assert to_wire(TimelineReset("!r:x", ())) == {"TimelineReset": {"room_id": "!r:x", "items": []}}
    assert list(to_wire(Mirror().state)) == ["recent_history", "repairs", "timelines"]


@pytest.mark.parametrize(("text", "expected"), EVENTS)
def test_new_events_round_trip(text: str, expected: object) -> None:
    _round_trip(text, expected, event_from_wire)


def test_pending_and_unavailable_quotes() -> None:
    item = json.loads(FULL_ITEM_JSON)
    item["Event"]["in_reply_to"] = PENDING_QUOTE
    decoded = item_from_wire(item)
    assert isinstance(decoded, EventItem) and decoded.in_reply_to == InReplyTo(event_id="$q:x")
    item["Event"]["in_reply_to"] = {**PENDING_QUOTE, "sender": "@a:x"}
    with pytest.raises(WireError, match="sender is set exactly when status is Ready"):
        item_from_wire(item)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"SendReaction": {"room_id": "!r:x", "event_id": "$e", "key": ""}}', "must not be empty"),
        ('{"SendReaction": {"room_id": "!r:x", "event_id": "e", "key": "x"}}', "starting with '$'"),
        (
            '{"SendMessage": {"room_id": "!r:x", "body": "b", "in_reply_to": 3}}',
            "expected a string",
        ),
        ('{"MarkRead": {"room_id": "!r:x", "event_id": "$e", "private": "yes"}}', "true or false"),
        ('{"EditMessage": {"room_id": "!r:x", "event_id": "$e"}}', 'missing field "body"'),
        ('{"OpenThread": {"room_id": "!r:x"}}', 'missing field "thread_root"'),
        ('{"SetTyping": {"room_id": "!r:x", "typing": 1}}', "true or false"),
        ('{"ShrinkTimeline": {"room_id": "!r:x", "thread": "$t"}}', 'unknown field "thread"'),
    ],
)
def test_bad_new_commands_are_typed_errors(text: str, message: str) -> None:
    with pytest.raises(WireError) as info:
        command_from_wire(json.loads(text))
    assert message in str(info.value)


def test_state_with_threads_typing_and_members_round_trips() -> None:
    mirror = Mirror()
    for event in (
        TimelineReset("!r:x", (FULL_ITEM,)),
        TimelineReset("!r:x", (FULL_ITEM,), "$root"),
        TypingChanged("!r:x", ("@b:x",)),
        MembersChanged("!r:x", (Member(user_id="@b:x", display_name="Bob"),)),
    ):
        mirror.apply(event)
    wire = to_wire(mirror.state)
    assert list(wire) == ["recent_history", "repairs", "timelines", "threads", "typing", "members"]
    decoded = state_from_wire(loads(dumps(mirror.state)))
    assert dict(decoded.threads["!r:x"]) == {"$root": (FULL_ITEM,)}
    assert dict(decoded.typing) == {"!r:x": ("@b:x",)}
    assert dict(decoded.members) == {"!r:x": (Member(user_id="@b:x", display_name="Bob"),)}


_text = st.text(min_size=1, max_size=8)
_event_id = _text.map(lambda s: "$" + s)
_quotes = st.builds(InReplyTo, event_id=_text) | st.builds(
    InReplyTo,
    event_id=_text,
    status=st.just(ReplyStatus.Ready),
    sender=_text,
    sender_name=st.none() | _text,
    body=st.none() | _text,
    redacted=st.booleans(),
)
_rows = st.builds(
    EventItem,
    id=_text, event_id=_text, sender=_text, origin_server_ts=st.integers(0, 2**53),
    event_type=_text, body=st.none() | _text, edited=st.booleans(), redacted=st.booleans(),
    receipts=st.lists(_text, max_size=2).map(tuple), sender_name=st.none() | _text,
    in_reply_to=st.none() | _quotes,
    reactions=st.lists(st.builds(Reaction, _text, st.lists(_text, max_size=2).map(tuple)),
                       max_size=2).map(tuple),
    thread_summary=st.none() | st.builds(
        ThreadSummary, count=st.integers(0, 99),
        latest=st.none() | st.builds(ThreadLatest, event_id=_text, sender=_text),
        participated=st.booleans(),
    ),
)  # fmt: skip


@given(_rows)
def test_any_row_round_trips(row: EventItem) -> None:
    assert item_from_wire(loads(dumps(row))) == row


@given(
    st.one_of(
        st.builds(SendMessage, _text.map(lambda s: "!" + s), _text,
                  in_reply_to=st.none() | _event_id, thread_root=st.none() | _event_id),
        st.builds(SendReaction, _text.map(lambda s: "!" + s), _event_id, _text),
        st.builds(MarkRead, _text.map(lambda s: "!" + s), _event_id, private=st.booleans()),
    )
)  # fmt: skip
def test_any_new_command_round_trips(command) -> None:
    assert command_from_wire(loads(dumps(command))) == command
