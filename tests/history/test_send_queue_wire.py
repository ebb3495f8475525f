"""The send queue's wire shapes: the echo row's ``send_state``, ``RetrySend`` and
``CancelSend``, ``SendQueueChanged``; exact JSON both ways and strict decoding."""

from __future__ import annotations

import json

import pytest

from gapline.history import (
    CancelSend,
    EventItem,
    Mirror,
    RetrySend,
    SendQueueChanged,
    SendState,
    WireError,
    command_from_wire,
    dumps,
    event_from_wire,
    item_from_wire,
    to_wire,
)

ECHO = {
    "Event": {
        "id": "echo:gl1",
        "event_id": "echo:gl1",
        "sender": "@a:example.org",
        "origin_server_ts": 1700000000000,
        "event_type": "m.room.message",
        "body": "hello",
        "edited": False,
        "redacted": False,
        "receipts": [],
        "encrypted": False,
        "decryption": None,
        "send_state": "Pending",
    }
}
ECHO_ITEM = EventItem(
    id="echo:gl1",
    event_id="echo:gl1",
    sender="@a:example.org",
    origin_server_ts=1700000000000,
    event_type="m.room.message",
    body="hello",
    send_state=SendState.PENDING,
)


def test_pending_and_failed_rows_round_trip() -> None:
    assert item_from_wire(ECHO) == ECHO_ITEM
    assert to_wire(ECHO_ITEM) == ECHO
    failed = json.loads(json.dumps(ECHO))
    failed["Event"]["send_state"] = {"Failed": "too large"}
    item = item_from_wire(failed)
    assert isinstance(item, EventItem) and item.send_state == SendState.failed("too large")
    assert to_wire(item) == failed
    ordered = json.loads(json.dumps(ECHO))
    ordered["Event"]["send_state"] = None
    assert to_wire(item_from_wire(ordered)) == ordered
    # A row written before the field existed decodes as one the server ordered.
    del ordered["Event"]["send_state"]
    decoded = item_from_wire(ordered)
    assert isinstance(decoded, EventItem) and decoded.send_state is None


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('{"RetrySend": {"room_id": "!r:example.org", "id": "echo:gl1"}}', None),
        ('{"CancelSend": {"room_id": "!r:example.org", "id": "echo:gl1"}}', None),
    ],
)
def test_commands_round_trip(text: str, value: object) -> None:
    data = json.loads(text)
    command = command_from_wire(data)
    kind = RetrySend if "RetrySend" in data else CancelSend
    assert command == kind("!r:example.org", "echo:gl1")
    assert to_wire(command) == data
    assert "\n" not in dumps(command)


def test_queue_counts_round_trip_and_reach_the_mirror() -> None:
    data = {"SendQueueChanged": {"pending": 2, "failed": 1}}
    event = event_from_wire(data)
    assert event == SendQueueChanged(pending=2, failed=1)
    assert to_wire(event) == data
    mirror = Mirror()
    assert mirror.send_queue == SendQueueChanged(0, 0)
    mirror.apply(event)
    assert mirror.send_queue == event


@pytest.mark.parametrize(
    "bad",
    [
        {"send_state": "Sent"},
        {"send_state": {"Failed": 3}},
        {"send_state": {"Pending": "x"}},
        {"send_state": {"Failed": None}},
    ],
)
def test_bad_send_states_are_refused(bad: dict) -> None:
    value = json.loads(json.dumps(ECHO))
    value["Event"].update(bad)
    with pytest.raises(WireError):
        item_from_wire(value)


@pytest.mark.parametrize(
    "bad",
    [
        {"RetrySend": {"room_id": "!r:example.org"}},
        {"CancelSend": {"room_id": "!r:example.org", "id": ""}},
        {"RetrySend": {"room_id": "nope", "id": "echo:x"}},
        {"CancelSend": {"room_id": "!r:example.org", "id": "echo:x", "extra": 1}},
        {"SendQueueChanged": {"pending": -1, "failed": 0}},
    ],
)
def test_bad_commands_and_counts_are_refused(bad: dict) -> None:
    decode = event_from_wire if "SendQueueChanged" in bad else command_from_wire
    with pytest.raises(WireError):
        decode(bad)
