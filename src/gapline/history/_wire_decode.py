"""Decoding the wire protocol: strict readers of every command, answer, event, item and diff.

The decoders are strict, because commands come from other programs and people:
an unknown variant, an unknown or missing field, or a value of the wrong type
raises :class:`~gapline.history._wire.WireError` whose message names the place
(``HistoryRepair.FillGap.gap_id: expected a string, got 3``); the bridge
answers it as ``{"Invalid": message}``. Each decoder is the inverse of
``to_wire`` for its kind of value.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TypeVar

from gapline.history._mirror import State
from gapline.history._types import (
    Answer,
    Append,
    Cancel,
    Clear,
    CloseRoom,
    Command,
    Continuity,
    DumpState,
    Event,
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
    RecentHistoryKind,
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
    TimelineChanged,
    TimelineItem,
    TimelineReset,
    VectorDiff,
)
from gapline.history._wire import Json, WireError

__all__ = [
    "answer_from_wire",
    "command_from_wire",
    "diff_from_wire",
    "event_from_wire",
    "item_from_wire",
    "recent_state_from_wire",
    "report_from_wire",
    "state_from_wire",
]

E = TypeVar("E", bound=enum.Enum)
T = TypeVar("T")


def _describe(value: Json) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _variant(
    value: Json, where: str, units: tuple[str, ...], datas: tuple[str, ...]
) -> tuple[str, Json]:
    """Split an externally tagged enum value into (variant name, payload)."""
    known = ", ".join([*units, *datas])
    if isinstance(value, str):
        if value in units:
            return value, None
        if value in datas:
            raise WireError(f"{where}: {value} needs data, as {{{json.dumps(value)}: ...}}")
        raise WireError(f"{where}: unknown variant {json.dumps(value)} (expected one of {known})")
    if isinstance(value, dict):
        if len(value) != 1:
            raise WireError(
                f"{where}: an enum value is a bare string or an object with one key, "
                f"got {len(value)} keys"
            )
        ((name, payload),) = value.items()
        if name in datas:
            return name, payload
        if name in units:
            raise WireError(f"{where}: {name} takes no data; write {json.dumps(name)}")
        raise WireError(f"{where}: unknown variant {json.dumps(name)} (expected one of {known})")
    raise WireError(f"{where}: expected a string or a one-key object, got {_describe(value)}")


class _Fields:
    """Strict access to an object's fields: every field read, none unknown, types checked."""

    def __init__(self, value: Json, where: str, names: tuple[str, ...]) -> None:
        if not isinstance(value, dict):
            raise WireError(f"{where}: expected an object, got {_describe(value)}")
        unknown = [k for k in value if k not in names]
        if unknown:
            raise WireError(
                f"{where}: unknown field {json.dumps(unknown[0])} (fields: {', '.join(names)})"
            )
        missing = [k for k in names if k not in value]
        if missing:
            raise WireError(f"{where}: missing field {json.dumps(missing[0])}")
        self._value: Mapping[str, Json] = value
        self._where = where

    def get(self, name: str, check: Callable[[Json, str], T]) -> T:
        return check(self._value[name], f"{self._where}.{name}")


def _str(value: Json, where: str) -> str:
    if not isinstance(value, str):
        raise WireError(f"{where}: expected a string, got {_describe(value)}")
    return value


def _nonempty(value: Json, where: str) -> str:
    text = _str(value, where)
    if not text:
        raise WireError(f"{where}: must not be empty")
    return text


def _room_id(value: Json, where: str) -> str:
    # Commands only (events come from the engine and are taken as written).
    # Only the sigil is checked: room versions 12+ drop the ":server" part.
    text = _str(value, where)
    if len(text) < 2 or not text.startswith("!"):
        raise WireError(
            f"{where}: expected a Matrix room ID starting with '!', got {_describe(text)}"
        )
    return text


def _opt_str(value: Json, where: str) -> str | None:
    return None if value is None else _str(value, where)


def _int(value: Json, where: str) -> int:
    # bool is an int subclass in Python; true is not a number on the wire.
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f"{where}: expected an integer, got {_describe(value)}")
    return value


_MAX_INT = 2**53 - 1  # what every JSON reader represents exactly


def _count(value: Json, where: str) -> int:
    number = _int(value, where)
    if number < 0:
        raise WireError(f"{where}: must not be negative, got {number}")
    return number


def _positive(value: Json, where: str) -> int:
    # Commands' counts: bounded, so a 4,000-digit count never reaches the engine.
    number = _int(value, where)
    if number < 1:
        raise WireError(f"{where}: must be at least 1, got {number}")
    if number > _MAX_INT:
        raise WireError(f"{where}: outside -(2^53-1)..2^53-1, got {_describe(number)}")
    return number


def _bool(value: Json, where: str) -> bool:
    if not isinstance(value, bool):
        raise WireError(f"{where}: expected true or false, got {_describe(value)}")
    return value


def _str_list(value: Json, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise WireError(f"{where}: expected an array, got {_describe(value)}")
    return tuple(_str(v, f"{where}[{i}]") for i, v in enumerate(value))


def _enum_of(kind: type[E]) -> Callable[[Json, str], E]:
    def check(value: Json, where: str) -> E:
        for member in kind:
            if member.value == value:
                return member
        names = ", ".join(json.dumps(m.value) for m in kind)
        raise WireError(f"{where}: expected one of {names}, got {_describe(value)}")

    return check


def _opt_enum_of(kind: type[E]) -> Callable[[Json, str], E | None]:
    check = _enum_of(kind)

    def opt(value: Json, where: str) -> E | None:
        return None if value is None else check(value, where)

    return opt


_COMMAND_UNITS = ("Shutdown", "DumpState")
_COMMAND_DATAS = (
    "OpenRoom",
    "CloseRoom",
    "HistoryRepair",
    "SendMessage",
    "PaginateBackwards",
)


def command_from_wire(value: Json, where: str = "command") -> Command:
    """Decode a :data:`Command`; raises :class:`WireError`."""
    name, payload = _variant(value, where, _COMMAND_UNITS, _COMMAND_DATAS)
    at = f"{where}.{name}"
    match name:
        case "Shutdown":
            return Shutdown()
        case "DumpState":
            return DumpState()
        case "OpenRoom":
            return OpenRoom(_Fields(payload, at, ("room_id",)).get("room_id", _room_id))
        case "CloseRoom":
            return CloseRoom(_Fields(payload, at, ("room_id",)).get("room_id", _room_id))
        case "SendMessage":
            f = _Fields(payload, at, ("room_id", "body"))
            return SendMessage(f.get("room_id", _room_id), f.get("body", _str))
        case "PaginateBackwards":
            f = _Fields(payload, at, ("room_id", "count"))
            return PaginateBackwards(f.get("room_id", _room_id), f.get("count", _positive))
        case _:  # "HistoryRepair"
            inner, data = _variant(payload, at, (), ("FillGap", "RetryRecent", "Cancel"))
            at = f"{at}.{inner}"
            if inner == "FillGap":
                f = _Fields(data, at, ("room_id", "gap_id"))
                return HistoryRepair(
                    FillGap(f.get("room_id", _room_id), f.get("gap_id", _nonempty))
                )
            room_id = _Fields(data, at, ("room_id",)).get("room_id", _room_id)
            return HistoryRepair(
                RetryRecent(room_id) if inner == "RetryRecent" else Cancel(room_id)
            )


_ANSWER_UNITS: dict[str, Answer] = {
    "Ok": Ok(),
    "RoomBusy": RoomBusy(),
    "Interrupted": Interrupted(),
    "EventNotFound": EventNotFound(),
    "RoomNotOpen": RoomNotOpen(),
}


def answer_from_wire(value: Json, where: str = "answer") -> Answer:
    """Decode an answer; raises :class:`WireError`."""
    name, payload = _variant(value, where, tuple(_ANSWER_UNITS), ("Failed", "Invalid"))
    if name in _ANSWER_UNITS:
        return _ANSWER_UNITS[name]
    message = _str(payload, f"{where}.{name}")
    return Failed(message) if name == "Failed" else Invalid(message)


def recent_state_from_wire(value: Json, where: str = "state") -> RecentHistoryState:
    units = tuple(k.value for k in RecentHistoryKind if k is not RecentHistoryKind.Failed)
    name, payload = _variant(value, where, units, ("Failed",))
    if name == "Failed":
        return RecentHistoryState.failed(_str(payload, f"{where}.Failed"))
    return RecentHistoryState(RecentHistoryKind(name))


_REPORT_FIELDS = ("room_id", "gap_id", "pages", "events", "phase", "continuity", "stop", "failure")


def report_from_wire(value: Json, where: str = "report") -> HistoryRepairReport:
    f = _Fields(value, where, _REPORT_FIELDS)
    return HistoryRepairReport(
        room_id=f.get("room_id", _str),
        gap_id=f.get("gap_id", _nonempty),
        pages=f.get("pages", _count),
        events=f.get("events", _count),
        phase=f.get("phase", _enum_of(RepairPhase)),
        continuity=f.get("continuity", _opt_enum_of(Continuity)),
        stop=f.get("stop", _opt_enum_of(RepairStop)),
        failure=f.get("failure", _opt_str),
    )


_EVENT_ITEM_FIELDS = (
    "id",
    "event_id",
    "sender",
    "origin_server_ts",
    "event_type",
    "body",
    "edited",
    "redacted",
    "receipts",
)
_GAP_FIELDS = ("id", "older_boundary", "newer_boundary", "lifecycle", "failure")


def item_from_wire(value: Json, where: str = "item") -> TimelineItem:
    """Decode a timeline item; raises :class:`WireError`."""
    name, payload = _variant(value, where, (), ("Event", "HistoryGap", "ReadMarker"))
    at = f"{where}.{name}"
    if name == "Event":
        f = _Fields(payload, at, _EVENT_ITEM_FIELDS)
        return EventItem(
            id=f.get("id", _nonempty),
            event_id=f.get("event_id", _nonempty),
            sender=f.get("sender", _nonempty),
            origin_server_ts=f.get("origin_server_ts", _int),
            event_type=f.get("event_type", _nonempty),
            body=f.get("body", _opt_str),
            edited=f.get("edited", _bool),
            redacted=f.get("redacted", _bool),
            receipts=f.get("receipts", _str_list),
        )
    if name == "HistoryGap":
        f = _Fields(payload, at, _GAP_FIELDS)
        try:
            return HistoryGapItem(
                id=f.get("id", _nonempty),
                older_boundary=f.get("older_boundary", _nonempty),
                newer_boundary=f.get("newer_boundary", _nonempty),
                lifecycle=f.get("lifecycle", _enum_of(GapLifecycle)),
                failure=f.get("failure", _opt_str),
            )
        except ValueError as exc:
            if isinstance(exc, WireError):
                raise
            raise WireError(f"{at}: {exc}") from exc
    return ReadMarkerItem(_Fields(payload, at, ("id",)).get("id", _nonempty))


def _items(value: Json, where: str) -> tuple[TimelineItem, ...]:
    if not isinstance(value, list):
        raise WireError(f"{where}: expected an array, got {_describe(value)}")
    return tuple(item_from_wire(v, f"{where}[{i}]") for i, v in enumerate(value))


def diff_from_wire(value: Json, where: str = "diff") -> VectorDiff:
    """Decode a ``VectorDiff``; raises :class:`WireError`."""
    name, payload = _variant(
        value,
        where,
        ("Clear",),
        ("Append", "PushFront", "PushBack", "Insert", "Set", "Remove", "Reset"),
    )
    at = f"{where}.{name}"
    match name:
        case "Clear":
            return Clear()
        case "Append":
            return Append(_Fields(payload, at, ("values",)).get("values", _items))
        case "Reset":
            return Reset(_Fields(payload, at, ("values",)).get("values", _items))
        case "PushFront":
            return PushFront(_Fields(payload, at, ("value",)).get("value", item_from_wire))
        case "PushBack":
            return PushBack(_Fields(payload, at, ("value",)).get("value", item_from_wire))
        case "Remove":
            return Remove(_Fields(payload, at, ("index",)).get("index", _count))
        case _:  # Insert, Set
            f = _Fields(payload, at, ("index", "value"))
            index, item = f.get("index", _count), f.get("value", item_from_wire)
            return Insert(index, item) if name == "Insert" else Set(index, item)


def _diffs(value: Json, where: str) -> tuple[VectorDiff, ...]:
    if not isinstance(value, list):
        raise WireError(f"{where}: expected an array, got {_describe(value)}")
    return tuple(diff_from_wire(v, f"{where}[{i}]") for i, v in enumerate(value))


def event_from_wire(value: Json, where: str = "event") -> Event:
    """Decode a published event; raises :class:`WireError`."""
    name, payload = _variant(
        value,
        where,
        (),
        ("RecentHistoryChanged", "HistoryRepairChanged", "TimelineReset", "TimelineChanged"),
    )
    at = f"{where}.{name}"
    match name:
        case "RecentHistoryChanged":
            f = _Fields(payload, at, ("room_id", "state"))
            return RecentHistoryChanged(
                f.get("room_id", _str), f.get("state", recent_state_from_wire)
            )
        case "HistoryRepairChanged":
            return HistoryRepairChanged(report_from_wire(payload, at))
        case "TimelineReset":
            f = _Fields(payload, at, ("room_id", "items"))
            return TimelineReset(f.get("room_id", _str), f.get("items", _items))
        case _:  # TimelineChanged
            f = _Fields(payload, at, ("room_id", "diffs"))
            return TimelineChanged(f.get("room_id", _str), f.get("diffs", _diffs))


def _map(value: Json, where: str, check: Callable[[Json, str], T]) -> dict[str, T]:
    if not isinstance(value, dict):
        raise WireError(f"{where}: expected an object, got {_describe(value)}")
    return {_str(k, f"{where} key"): check(v, f"{where}[{k}]") for k, v in value.items()}


def state_from_wire(value: Json, where: str = "state") -> State:
    """Decode a mirror :class:`State` (what ``DumpState`` prints)."""
    f = _Fields(value, where, ("recent_history", "repairs", "timelines"))
    return State(
        MappingProxyType(f.get("recent_history", lambda v, w: _map(v, w, recent_state_from_wire))),
        MappingProxyType(f.get("repairs", lambda v, w: _map(v, w, report_from_wire))),
        MappingProxyType(f.get("timelines", lambda v, w: _map(v, w, _items))),
    )
