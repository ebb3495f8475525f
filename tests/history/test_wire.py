"""The wire codec against the protocol's pinned example JSON.

The literals below are the protocol's reference examples exactly as they are
written down, spacing included: one-line examples of every command, answer,
item, event and diff, and pretty-printed ones of a gap row and a settled fill.
Where an example only sketches a value (``[ ... ]``, ``..``), a concrete value
is filled in; each such spot is marked.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gapline.history import (
    Append,
    Cancel,
    Clear,
    CloseRoom,
    Continuity,
    DumpState,
    EventItem,
    EventNotFound,
    Failed,
    FillGap,
    GapLifecycle,
    HistoryGapItem,
    HistoryRepair,
    HistoryRepairChanged,
    HistoryRepairReport,
    Insert,
    Interrupted,
    Invalid,
    Ok,
    OpenRoom,
    PaginateBackwards,
    PushBack,
    PushFront,
    ReadMarkerItem,
    RecentHistoryChanged,
    RecentHistoryState,
    Remove,
    RepairPhase,
    RepairStop,
    Reset,
    RetryRecent,
    RoomBusy,
    RoomNotOpen,
    SendMessage,
    Set,
    Shutdown,
    State,
    TimelineChanged,
    TimelineReset,
)
from gapline.history._wire import WireError, dumps, loads, to_wire
from gapline.history._wire_decode import (
    answer_from_wire,
    command_from_wire,
    diff_from_wire,
    event_from_wire,
    item_from_wire,
    report_from_wire,
    state_from_wire,
)

# --------------------------------------------------------------------- commands
COMMAND_EXAMPLES = [
    ('{ "OpenRoom": { "room_id": "!r:example.org" } }', OpenRoom("!r:example.org")),
    ('{ "CloseRoom": { "room_id": "!r:example.org" } }', CloseRoom("!r:example.org")),
    (
        '{ "HistoryRepair": { "FillGap": { "room_id": "!r:example.org", "gap_id": "opaque" } } }',
        HistoryRepair(FillGap("!r:example.org", "opaque")),
    ),
    (
        '{ "HistoryRepair": { "RetryRecent": { "room_id": "!r:example.org" } } }',
        HistoryRepair(RetryRecent("!r:example.org")),
    ),
    (
        '{ "HistoryRepair": { "Cancel": { "room_id": "!r:example.org" } } }',
        HistoryRepair(Cancel("!r:example.org")),
    ),
    (
        '{ "SendMessage": { "room_id": "!r:example.org", "body": "hello" } }',
        SendMessage("!r:example.org", "hello"),
    ),
    ('"Shutdown"', Shutdown()),
]

# --------------------------------------------------------------------- repair commands, another room
REPAIR_EXAMPLES = [
    (
        '{ "HistoryRepair": { "FillGap": { "room_id": "!room:example.org", "gap_id": "opaque" } } }',
        HistoryRepair(FillGap("!room:example.org", "opaque")),
    ),
    (
        '{ "HistoryRepair": { "RetryRecent": { "room_id": "!room:example.org" } } }',
        HistoryRepair(RetryRecent("!room:example.org")),
    ),
    (
        '{ "HistoryRepair": { "Cancel": { "room_id": "!room:example.org" } } }',
        HistoryRepair(Cancel("!room:example.org")),
    ),
]

# --------------------------------------------------------------------- extensions (docs/history.md)
EXTENSION_EXAMPLES = [
    (
        '{ "PaginateBackwards": { "room_id": "!r:example.org", "count": 50 } }',
        PaginateBackwards("!r:example.org", 50),
    ),
    ('"DumpState"', DumpState()),
]

# --------------------------------------------------------------------- answers
ANSWER_EXAMPLES = [
    ('"Ok"', Ok()),
    ('"RoomBusy"', RoomBusy()),
    ('"Interrupted"', Interrupted()),
    ('"EventNotFound"', EventNotFound()),
    ('"RoomNotOpen"', RoomNotOpen()),
    ('{ "Failed": "message" }', Failed("message")),
    ('{ "Invalid": "message" }', Invalid("message")),
]

# --------------------------------------------------------------------- timeline items
EVENT_ITEM_JSON = """{ "Event": { "id": "opaque row id", "event_id": "$e:example.org", "sender": "@a:example.org",
    "origin_server_ts": 1700000000000, "event_type": "m.room.message", "body": "text or null",
    "edited": false, "redacted": false, "receipts": ["@b:example.org"],
    "encrypted": false, "decryption": null, "send_state": null } }"""
GAP_ITEM_JSON = """{ "HistoryGap": { "id": "opaque", "older_boundary": "$older:example.org",
    "newer_boundary": "$newer:example.org", "lifecycle": "Idle", "failure": null } }"""
READ_MARKER_JSON = '{ "ReadMarker": { "id": "read-marker" } }'

EVENT_ITEM = EventItem(
    id="opaque row id",
    event_id="$e:example.org",
    sender="@a:example.org",
    origin_server_ts=1700000000000,
    event_type="m.room.message",
    body="text or null",
    edited=False,
    redacted=False,
    receipts=("@b:example.org",),
)
GAP_ITEM = HistoryGapItem(
    id="opaque",
    older_boundary="$older:example.org",
    newer_boundary="$newer:example.org",
    lifecycle=GapLifecycle.Idle,
    failure=None,
)

# --------------------------------------------------------------------- a gap row, pretty-printed
GAP_ROW_PRETTY = """{
  "HistoryGap": {
    "id": "opaque",
    "older_boundary": "$older:example.org",
    "newer_boundary": "$newer:example.org",
    "lifecycle": "Idle",
    "failure": null
  }
}"""

# --------------------------------------------------------------------- a settled fill, pretty-printed
SETTLED_FILL_PRETTY = """{
  "room_id": "!room:example.org",
  "gap_id": "opaque",
  "pages": 2,
  "events": 63,
  "phase": "Ready",
  "continuity": "Verified",
  "stop": null,
  "failure": null
}"""

# --------------------------------------------------------------------- events
EVENT_EXAMPLES = [
    (
        '{ "RecentHistoryChanged": { "room_id": "!r:example.org", "state": "Loading" } }',
        RecentHistoryChanged("!r:example.org", RecentHistoryState.LOADING),
    ),
    (
        '{ "RecentHistoryChanged": { "room_id": "!r:example.org", "state": { "Failed": "message" } } }',
        RecentHistoryChanged("!r:example.org", RecentHistoryState.failed("message")),
    ),
    (
        """{ "HistoryRepairChanged": { "room_id": "...", "gap_id": "...", "pages": 2, "events": 63,
    "phase": "Ready", "continuity": "Verified", "stop": null, "failure": null } }""",
        HistoryRepairChanged(
            HistoryRepairReport(
                room_id="...",
                gap_id="...",
                pages=2,
                events=63,
                phase=RepairPhase.Ready,
                continuity=Continuity.Verified,
            )
        ),
    ),
    # The example sketches `"items": [ ... ]`; filled with the three item examples.
    (
        '{ "TimelineReset": { "room_id": "...", "items": [ '
        + EVENT_ITEM_JSON
        + ", "
        + GAP_ITEM_JSON
        + ", "
        + READ_MARKER_JSON
        + " ] } }",
        TimelineReset("...", (EVENT_ITEM, GAP_ITEM, ReadMarkerItem())),
    ),
    # The example sketches `"diffs": [ ... ]`; filled with two diffs.
    (
        '{ "TimelineChanged": { "room_id": "...", "diffs": [ {"Remove":{"index":1}}, "Clear" ] } }',
        TimelineChanged("...", (Remove(1), Clear())),
    ),
]

# --------------------------------------------------------------------- the diff vocabulary
# The examples sketch the values as `..`; filled with the item examples.
DIFF_EXAMPLES = [
    ('{"Append":{"values":[' + EVENT_ITEM_JSON + "]}}", Append((EVENT_ITEM,))),
    ('{"PushFront":{"value":' + GAP_ITEM_JSON + "}}", PushFront(GAP_ITEM)),
    ('{"PushBack":{"value":' + READ_MARKER_JSON + "}}", PushBack(ReadMarkerItem())),
    ('{"Insert":{"index":3,"value":' + GAP_ITEM_JSON + "}}", Insert(3, GAP_ITEM)),
    ('{"Set":{"index":0,"value":' + EVENT_ITEM_JSON + "}}", Set(0, EVENT_ITEM)),
    ('{"Remove":{"index":2}}', Remove(2)),
    ('"Clear"', Clear()),
    (
        '{"Reset":{"values":[' + EVENT_ITEM_JSON + "," + GAP_ITEM_JSON + "]}}",
        Reset((EVENT_ITEM, GAP_ITEM)),
    ),
]


def _round_trip(text: str, expected: object, decode) -> None:
    data = json.loads(text)
    decoded = decode(data)
    assert decoded == expected
    assert to_wire(expected) == data
    assert json.loads(dumps(expected)) == data
    assert "\n" not in dumps(expected)


@pytest.mark.parametrize(
    ("text", "expected"), COMMAND_EXAMPLES + REPAIR_EXAMPLES + EXTENSION_EXAMPLES
)
def test_commands_round_trip(text: str, expected: object) -> None:
    _round_trip(text, expected, command_from_wire)


@pytest.mark.parametrize(("text", "expected"), ANSWER_EXAMPLES)
def test_answers_round_trip(text: str, expected: object) -> None:
    _round_trip(text, expected, answer_from_wire)


@pytest.mark.parametrize(("text", "expected"), EVENT_EXAMPLES)
def test_events_round_trip(text: str, expected: object) -> None:
    _round_trip(text, expected, event_from_wire)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (EVENT_ITEM_JSON, EVENT_ITEM),
        (GAP_ITEM_JSON, GAP_ITEM),
        (READ_MARKER_JSON, ReadMarkerItem()),
        (GAP_ROW_PRETTY, GAP_ITEM),
    ],
)
def test_items_round_trip(text: str, expected: object) -> None:
    _round_trip(text, expected, item_from_wire)


@pytest.mark.parametrize(("text", "expected"), DIFF_EXAMPLES)
def test_diffs_round_trip(text: str, expected: object) -> None:
    _round_trip(text, expected, diff_from_wire)


def test_settled_fill_report_is_the_event_payload() -> None:
    report = HistoryRepairReport(
        room_id="!room:example.org",
        gap_id="opaque",
        pages=2,
        events=63,
        phase=RepairPhase.Ready,
        continuity=Continuity.Verified,
    )
    _round_trip(SETTLED_FILL_PRETTY, report, report_from_wire)
    # HistoryRepairChanged is a newtype variant: the report's fields sit under the tag.
    assert to_wire(HistoryRepairChanged(report)) == {
        "HistoryRepairChanged": json.loads(SETTLED_FILL_PRETTY)
    }


@pytest.mark.parametrize(
    ("wire", "state"),
    [
        ("Loading", RecentHistoryState.LOADING),
        ("Loaded", RecentHistoryState.LOADED),
        ("Cancelled", RecentHistoryState.CANCELLED),
        ("Idle", RecentHistoryState.IDLE),
        ({"Failed": "boom"}, RecentHistoryState.failed("boom")),
    ],
)
def test_every_recent_history_state(wire: object, state: RecentHistoryState) -> None:
    event = {"RecentHistoryChanged": {"room_id": "!r:example.org", "state": wire}}
    assert event_from_wire(event) == RecentHistoryChanged("!r:example.org", state)
    assert to_wire(RecentHistoryChanged("!r:example.org", state)) == event


@pytest.mark.parametrize(
    "report",
    [
        HistoryRepairReport(room_id="!r:x", gap_id="g"),
        HistoryRepairReport(
            room_id="!r:x", gap_id="g", pages=4, events=200, phase=RepairPhase.Paused,
            stop=RepairStop.Budget,
        ),
        HistoryRepairReport(
            room_id="!r:x", gap_id="g", pages=1, events=5, phase=RepairPhase.Paused,
            stop=RepairStop.CursorStalled,
        ),
        HistoryRepairReport(
            room_id="!r:x", gap_id="g", pages=2, events=70, phase=RepairPhase.Paused,
            continuity=Continuity.AccessibleStart, stop=RepairStop.HistoryUnavailable,
        ),
        HistoryRepairReport(
            room_id="!r:x", gap_id="g", pages=1, events=50, phase=RepairPhase.Paused,
            stop=RepairStop.Cancelled,
        ),
        HistoryRepairReport(
            room_id="!r:x", gap_id="g", phase=RepairPhase.Paused, failure="server said 500",
        ),
    ],
)  # fmt: skip
def test_every_report_shape_round_trips(report: HistoryRepairReport) -> None:
    assert report_from_wire(to_wire(report)) == report
    assert event_from_wire(to_wire(HistoryRepairChanged(report))) == HistoryRepairChanged(report)


@pytest.mark.parametrize("lifecycle", list(GapLifecycle))
def test_every_gap_lifecycle(lifecycle: GapLifecycle) -> None:
    failure = "timed out" if lifecycle is GapLifecycle.Failed else None
    gap = HistoryGapItem(
        id="g", older_boundary="$o", newer_boundary="$n", lifecycle=lifecycle, failure=failure
    )
    wire = to_wire(gap)
    assert wire["HistoryGap"]["lifecycle"] == lifecycle.value
    assert wire["HistoryGap"]["failure"] == failure
    assert item_from_wire(wire) == gap


def test_event_item_without_body_is_null() -> None:
    item = EventItem(
        id="r1", event_id="$e", sender="@a:x", origin_server_ts=1, event_type="m.room.member",
        body=None, redacted=True,
    )  # fmt: skip
    wire = to_wire(item)
    assert wire["Event"]["body"] is None
    assert wire["Event"]["receipts"] == []
    assert item_from_wire(wire) == item


def test_state_dump_round_trips() -> None:
    report = HistoryRepairReport(room_id="!a:x", gap_id="g", phase=RepairPhase.Bridging)
    state = State(
        recent_history={"!b:x": RecentHistoryState.failed("no"), "!a:x": RecentHistoryState.LOADED},
        repairs={"!a:x": report},
        timelines={"!a:x": (EVENT_ITEM, GAP_ITEM, ReadMarkerItem()), "!b:x": ()},
    )
    wire = to_wire(state)
    assert list(wire) == ["recent_history", "repairs", "timelines"]
    assert list(wire["recent_history"]) == ["!a:x", "!b:x"]  # sorted: stable dumps
    assert wire["recent_history"] == {"!a:x": "Loaded", "!b:x": {"Failed": "no"}}
    assert wire["repairs"]["!a:x"]["phase"] == "Bridging"
    decoded = state_from_wire(json.loads(dumps(state)))
    assert dict(decoded.recent_history) == dict(state.recent_history)
    assert dict(decoded.repairs) == dict(state.repairs)
    assert dict(decoded.timelines) == dict(state.timelines)


def test_non_ascii_text_is_kept_as_is() -> None:
    text = dumps(SendMessage("!r:x", "héllo ✓"))
    assert "héllo ✓" in text
    assert command_from_wire(loads(text)) == SendMessage("!r:x", "héllo ✓")


# --------------------------------------------------------------------- strict decoding

BAD_COMMANDS = [
    ('"Open"', 'unknown variant "Open"'),
    ('{"Explode": {}}', 'unknown variant "Explode"'),
    ('"OpenRoom"', "OpenRoom needs data"),
    ('{"Shutdown": null}', "Shutdown takes no data"),
    ('{"OpenRoom": {"room_id": "!r:x"}, "CloseRoom": {"room_id": "!r:x"}}', "got 2 keys"),
    ("42", "expected a string or a one-key object"),
    ("null", "expected a string or a one-key object"),
    ('{"OpenRoom": "!r:x"}', "command.OpenRoom: expected an object"),
    ('{"OpenRoom": {}}', 'command.OpenRoom: missing field "room_id"'),
    ('{"OpenRoom": {"room_id": 7}}', "command.OpenRoom.room_id: expected a string, got 7"),
    ('{"OpenRoom": {"room_id": "r:x"}}', "starting with '!'"),
    ('{"OpenRoom": {"room_id": "!r:x", "roomid": "!r:x"}}', 'unknown field "roomid"'),
    ('{"SendMessage": {"room_id": "!r:x"}}', 'missing field "body"'),
    ('{"SendMessage": {"room_id": "!r:x", "body": null}}', "SendMessage.body: expected a string"),
    ('{"HistoryRepair": "FillGap"}', "FillGap needs data"),
    ('{"HistoryRepair": {"Fill": {}}}', 'unknown variant "Fill"'),
    (
        '{"HistoryRepair": {"FillGap": {"room_id": "!r:x", "gap_id": 3}}}',
        "command.HistoryRepair.FillGap.gap_id: expected a string, got 3",
    ),
    ('{"HistoryRepair": {"FillGap": {"room_id": "!r:x", "gap_id": ""}}}', "must not be empty"),
    ('{"HistoryRepair": {"Cancel": {"room_id": "!r:x", "gap_id": "g"}}}', 'unknown field "gap_id"'),
    ('{"PaginateBackwards": {"room_id": "!r:x", "count": 0}}', "must be at least 1"),
    ('{"PaginateBackwards": {"room_id": "!r:x", "count": true}}', "expected an integer"),
    ('{"PaginateBackwards": {"room_id": "!r:x", "count": 1.5}}', "expected an integer"),
    ('{"PaginateBackwards": {"room_id": "!r:x"}}', 'missing field "count"'),
]


@pytest.mark.parametrize(("text", "message"), BAD_COMMANDS)
def test_bad_commands_are_typed_errors(text: str, message: str) -> None:
    with pytest.raises(WireError) as info:
        command_from_wire(json.loads(text))
    assert message in str(info.value)


def test_answers_are_not_commands() -> None:
    with pytest.raises(WireError, match='unknown variant "Ok"'):
        command_from_wire("Ok")


def test_bad_json_text() -> None:
    with pytest.raises(WireError, match="not JSON"):
        loads('{"OpenRoom": ')
    with pytest.raises(WireError, match="not JSON"):
        loads(b"\xff\xfe")


@pytest.mark.parametrize(
    ("decode", "value", "message"),
    [
        (answer_from_wire, {"Failed": 3}, "answer.Failed: expected a string"),
        (answer_from_wire, "Fine", 'unknown variant "Fine"'),
        (event_from_wire, {"RecentHistoryChanged": {"room_id": "!r:x", "state": "Done"}}, '"Done"'),
        (item_from_wire, {"ReadMarker": {}}, 'missing field "id"'),
        (
            item_from_wire,
            {"HistoryGap": {"id": "g", "older_boundary": "$o", "newer_boundary": "$n",
                            "lifecycle": "Failed", "failure": None}},
            "failure is set exactly when lifecycle is Failed",
        ),
        (
            item_from_wire,
            {"Event": {"id": "r", "event_id": "$e", "sender": "@a:x", "origin_server_ts": "1",
                       "event_type": "m.room.message", "body": None, "edited": False,
                       "redacted": False, "receipts": []}},
            "item.Event.origin_server_ts: expected an integer",
        ),
        (diff_from_wire, {"Insert": {"index": -1, "value": {"ReadMarker": {"id": "x"}}}}, "negative"),
        (diff_from_wire, {"Pop": {}}, 'unknown variant "Pop"'),
        (report_from_wire, {"room_id": "!r:x"}, 'missing field "gap_id"'),
    ],
)  # fmt: skip
def test_bad_values_of_other_kinds(decode, value: object, message: str) -> None:
    with pytest.raises(WireError) as info:
        decode(value)
    assert message in str(info.value)


def test_to_wire_refuses_foreign_values() -> None:
    with pytest.raises(TypeError):
        to_wire(object())


# --------------------------------------------------------------------- property: any value round-trips

_text = st.text(min_size=1, max_size=12)
_room = _text.map(lambda s: "!" + s)
_event_items = st.builds(
    EventItem,
    id=_text,
    event_id=_text,
    sender=_text,
    origin_server_ts=st.integers(min_value=0, max_value=2**53),
    event_type=_text,
    body=st.none() | st.text(max_size=20),
    edited=st.booleans(),
    redacted=st.booleans(),
    receipts=st.lists(_text, max_size=3).map(tuple),
)
_gap_items = st.sampled_from(list(GapLifecycle)).flatmap(
    lambda lc: st.builds(
        HistoryGapItem,
        id=_text,
        older_boundary=_text,
        newer_boundary=_text,
        lifecycle=st.just(lc),
        failure=_text if lc is GapLifecycle.Failed else st.none(),
    )
)
_items = _event_items | _gap_items | st.just(ReadMarkerItem())
_item_tuples = st.lists(_items, max_size=4).map(tuple)
_index = st.integers(min_value=0, max_value=1000)
_diffs = st.one_of(
    st.builds(Append, _item_tuples),
    st.builds(PushFront, _items),
    st.builds(PushBack, _items),
    st.builds(Insert, _index, _items),
    st.builds(Set, _index, _items),
    st.builds(Remove, _index),
    st.just(Clear()),
    st.builds(Reset, _item_tuples),
)
_commands = st.one_of(
    st.builds(OpenRoom, _room),
    st.builds(CloseRoom, _room),
    st.builds(lambda r, g: HistoryRepair(FillGap(r, g)), _room, _text),
    st.builds(lambda r: HistoryRepair(RetryRecent(r)), _room),
    st.builds(lambda r: HistoryRepair(Cancel(r)), _room),
    st.builds(SendMessage, _room, st.text(max_size=30)),
    st.builds(PaginateBackwards, _room, st.integers(min_value=1, max_value=500)),
    st.just(Shutdown()),
    st.just(DumpState()),
)


@given(_commands)
def test_any_command_round_trips(command) -> None:
    assert command_from_wire(loads(dumps(command))) == command


@given(st.lists(_diffs, max_size=5).map(tuple), _room)
def test_any_timeline_change_round_trips(diffs, room_id: str) -> None:
    event = TimelineChanged(room_id, diffs)
    assert event_from_wire(loads(dumps(event))) == event
