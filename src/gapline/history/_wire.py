"""The wire protocol: JSON for every command, answer, event, item and diff, in its pinned shapes.

serde conventions: enums are externally tagged (a unit variant is a bare
string, ``"Ok"``; a data variant is a one-key object, ``{"Failed": "why"}``),
fields are snake_case, ``None`` is ``null``, tuples are arrays. A
``HistoryRepairChanged`` carries the report's fields directly under its tag
(a serde newtype variant around a struct).

``to_wire`` turns any protocol value into plain JSON data (dict, list, str,
int, bool, None); ``dumps`` into compact JSON text; ``loads`` parses it. The
strict decoders back from JSON (``*_from_wire``) are in ``_wire_decode``.
"""

from __future__ import annotations

import enum
import json
from typing import Any

from gapline.history._mirror import State
from gapline.history._types import (
    Append,
    Cancel,
    Clear,
    CloseRoom,
    DumpState,
    EventItem,
    EventNotFound,
    Failed,
    FillGap,
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
    RecentHistoryKind,
    RecentHistoryState,
    Remove,
    Reset,
    RetryRecent,
    RoomBusy,
    RoomNotOpen,
    SendMessage,
    Set,
    Shutdown,
    TimelineChanged,
    TimelineItem,
    TimelineReset,
    VectorDiff,
)

__all__ = ["Json", "WireError", "dumps", "loads", "to_wire"]

Json = Any  # what json.loads returns: dict | list | str | int | float | bool | None


class WireError(ValueError):
    """A JSON value that is not a valid protocol value; the message says where and why."""


# =========================================================================== encoding


def dumps(value: object) -> str:
    """Compact JSON text of a protocol value (or of plain JSON data), one line."""
    data = value if _is_plain(value) else to_wire(value)
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def loads(text: str | bytes) -> Json:
    """Parse JSON text; a syntax error becomes a :class:`WireError`."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise WireError(f"not JSON: {exc}") from exc


def _is_plain(value: object) -> bool:
    return value is None or isinstance(value, dict | list | str | int | float | bool)


def _tag(name: str, payload: Json) -> dict[str, Json]:
    return {name: payload}


def _enum(value: enum.Enum | None) -> str | None:
    return None if value is None else value.value


def _report(report: HistoryRepairReport) -> dict[str, Json]:
    return {
        "room_id": report.room_id,
        "gap_id": report.gap_id,
        "pages": report.pages,
        "events": report.events,
        "phase": report.phase.value,
        "continuity": _enum(report.continuity),
        "stop": _enum(report.stop),
        "failure": report.failure,
    }


def _recent_state(state: RecentHistoryState) -> Json:
    if state.kind is RecentHistoryKind.Failed:
        return {"Failed": state.message}
    return state.kind.value


def _item(item: TimelineItem) -> dict[str, Json]:
    match item:
        case EventItem():
            return _tag(
                "Event",
                {
                    "id": item.id,
                    "event_id": item.event_id,
                    "sender": item.sender,
                    "origin_server_ts": item.origin_server_ts,
                    "event_type": item.event_type,
                    "body": item.body,
                    "edited": item.edited,
                    "redacted": item.redacted,
                    "receipts": list(item.receipts),
                },
            )
        case HistoryGapItem():
            return _tag(
                "HistoryGap",
                {
                    "id": item.id,
                    "older_boundary": item.older_boundary,
                    "newer_boundary": item.newer_boundary,
                    "lifecycle": item.lifecycle.value,
                    "failure": item.failure,
                },
            )
        case ReadMarkerItem():
            return _tag("ReadMarker", {"id": item.id})


def _diff(diff: VectorDiff) -> Json:
    match diff:
        case Append(values=values):
            return _tag("Append", {"values": [_item(v) for v in values]})
        case PushFront(value=value):
            return _tag("PushFront", {"value": _item(value)})
        case PushBack(value=value):
            return _tag("PushBack", {"value": _item(value)})
        case Insert(index=index, value=value):
            return _tag("Insert", {"index": index, "value": _item(value)})
        case Set(index=index, value=value):
            return _tag("Set", {"index": index, "value": _item(value)})
        case Remove(index=index):
            return _tag("Remove", {"index": index})
        case Clear():
            return "Clear"
        case Reset(values=values):
            return _tag("Reset", {"values": [_item(v) for v in values]})


def _state(state: State) -> dict[str, Json]:
    return {
        "recent_history": {r: _recent_state(s) for r, s in sorted(state.recent_history.items())},
        "repairs": {r: _report(rep) for r, rep in sorted(state.repairs.items())},
        "timelines": {r: [_item(i) for i in items] for r, items in sorted(state.timelines.items())},
    }


def to_wire(value: object) -> Json:
    """The JSON data of any protocol value: command, answer, event, item, diff, report, state."""
    match value:
        # commands
        case OpenRoom(room_id=room_id):
            return _tag("OpenRoom", {"room_id": room_id})
        case CloseRoom(room_id=room_id):
            return _tag("CloseRoom", {"room_id": room_id})
        case HistoryRepair(command=command):
            return _tag("HistoryRepair", to_wire(command))
        case FillGap(room_id=room_id, gap_id=gap_id):
            return _tag("FillGap", {"room_id": room_id, "gap_id": gap_id})
        case RetryRecent(room_id=room_id):
            return _tag("RetryRecent", {"room_id": room_id})
        case Cancel(room_id=room_id):
            return _tag("Cancel", {"room_id": room_id})
        case SendMessage(room_id=room_id, body=body):
            return _tag("SendMessage", {"room_id": room_id, "body": body})
        case PaginateBackwards(room_id=room_id, count=count):
            return _tag("PaginateBackwards", {"room_id": room_id, "count": count})
        case Shutdown():
            return "Shutdown"
        case DumpState():
            return "DumpState"
        # answers
        case Ok():
            return "Ok"
        case RoomBusy():
            return "RoomBusy"
        case Interrupted():
            return "Interrupted"
        case EventNotFound():
            return "EventNotFound"
        case RoomNotOpen():
            return "RoomNotOpen"
        case Failed(message=message):
            return _tag("Failed", message)
        case Invalid(message=message):
            return _tag("Invalid", message)
        # events
        case RecentHistoryChanged(room_id=room_id, state=state):
            return _tag("RecentHistoryChanged", {"room_id": room_id, "state": _recent_state(state)})
        case HistoryRepairChanged(report=report):
            return _tag("HistoryRepairChanged", _report(report))
        case TimelineReset(room_id=room_id, items=items):
            return _tag("TimelineReset", {"room_id": room_id, "items": [_item(i) for i in items]})
        case TimelineChanged(room_id=room_id, diffs=diffs):
            return _tag("TimelineChanged", {"room_id": room_id, "diffs": [_diff(d) for d in diffs]})
        # parts
        case EventItem() | HistoryGapItem() | ReadMarkerItem():
            return _item(value)
        case Append() | PushFront() | PushBack() | Insert() | Set() | Remove() | Clear() | Reset():
            return _diff(value)
        case HistoryRepairReport():
            return _report(value)
        case RecentHistoryState():
            return _recent_state(value)
        case State():
            return _state(value)
    raise TypeError(f"not a wire protocol value: {value!r}")
