"""Decoding the wire protocol: strict readers of every command, answer, event and state.

The decoders are strict, because commands come from other programs and people:
an unknown variant, an unknown or missing field, or a value of the wrong type
raises :class:`~gapline.history._wire.WireError` whose message names the place
(``HistoryRepair.FillGap.gap_id: expected a string, got 3``); the bridge
answers it as ``{"Invalid": message}``. Each decoder is the inverse of
``to_wire`` for its kind of value. Items and diffs are read by ``_wire_items``
(re-exported here), single fields by ``_wire_fields``.

Fields added after the first protocol version are optional on input (a
command written without them means what it meant before): ``SendMessage``'s
``in_reply_to``, ``thread_root``, ``msgtype`` and ``markdown``, ``EditMessage``'s
``markdown``, ``PaginateBackwards``' ``thread_root``,
``TimelineReset``/``TimelineChanged``'s ``thread_root``, and the state's
``threads``, ``typing`` and ``members``.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import TypeVar

from gapline.history._commands import MSGTYPES
from gapline.history._mirror import State
from gapline.history._types import (
    AcceptInvite,
    AcceptVerification,
    Answer,
    Cancel,
    CancelSend,
    CancelVerification,
    CloseRoom,
    Command,
    ConfirmVerification,
    Continuity,
    CreateRoom,
    DeclineInvite,
    DumpState,
    EditMessage,
    Event,
    EventNotFound,
    Failed,
    FillGap,
    HistoryRepair,
    HistoryRepairChanged,
    HistoryRepairReport,
    Interrupted,
    Invalid,
    InviteUser,
    JoinRoom,
    LeaveRoom,
    MarkRead,
    Member,
    MembersChanged,
    Ok,
    OpenRoom,
    OpenThread,
    PaginateBackwards,
    RecentHistoryChanged,
    RecentHistoryKind,
    RecentHistoryState,
    RedactEvent,
    RepairPhase,
    RepairStop,
    RetryRecent,
    RetrySend,
    RoomBusy,
    RoomCreated,
    RoomNotOpen,
    SendMessage,
    SendQueueChanged,
    SendReaction,
    SetTopic,
    SetTyping,
    ShrinkTimeline,
    Shutdown,
    StartVerification,
    TimelineChanged,
    TimelineReset,
    TypingChanged,
    VerificationChanged,
    VerificationPhase,
)
from gapline.history._wire import Json, WireError
from gapline.history._wire_fields import (
    Fields,
    bool_,
    count,
    describe,
    enum_of,
    event_id,
    nonempty,
    opt_enum_of,
    opt_str,
    positive,
    room_id,
    str_,
    str_list,
    variant,
)
from gapline.history._wire_items import diff_from_wire, diffs, item_from_wire, items
from gapline.history._wire_items import member_from_wire as _member

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

T = TypeVar("T")

_COMMAND_UNITS = ("Shutdown", "DumpState")
_COMMAND_DATAS = (
    "OpenRoom",
    "CloseRoom",
    "HistoryRepair",
    "SendMessage",
    "PaginateBackwards",
    "SendReaction",
    "RedactEvent",
    "EditMessage",
    "MarkRead",
    "OpenThread",
    "ShrinkTimeline",
    "SetTyping",
    "RetrySend",
    "CancelSend",
    "JoinRoom",
    "LeaveRoom",
    "AcceptInvite",
    "DeclineInvite",
    "CreateRoom",
    "StartVerification",
    "AcceptVerification",
    "ConfirmVerification",
    "CancelVerification",
    "InviteUser",
    "SetTopic",
)


def _reaction_key(value: Json, where: str) -> str:
    key = nonempty(value, where)
    if len(key) > 256:
        raise WireError(f"{where}: a reaction key is at most 256 characters")
    return key


def _room_or_alias(value: Json, where: str) -> str:
    text = str_(value, where)
    if text.startswith("#") and ":" in text and len(text) >= 4:
        return text
    return room_id(text, where)


def _user_ids(value: Json, where: str) -> tuple[str, ...]:
    return tuple(_user_id(user, where) for user in str_list(value, where))


def _user_id(value: Json, where: str) -> str:
    user = str_(value, where)
    if not (user.startswith("@") and ":" in user):
        raise WireError(f"{where}: expected a Matrix user id (@name:server), got {user!r}")
    return user


def _msgtype(value: Json, where: str) -> str:
    text = str_(value, where)
    if text not in MSGTYPES:
        raise WireError(f"{where}: expected one of {', '.join(MSGTYPES)}, got {text!r}")
    return text


def _device_id(value: Json, where: str) -> str:
    return nonempty(value, where)


def _verification_command(name: str, payload: Json, at: str) -> Command:
    if name == "StartVerification":
        f = Fields(payload, at, ("user_id",), ("device_id", "room_id"))
        return StartVerification(
            f.get("user_id", _user_id),
            device_id=f.opt("device_id", _device_id),
            room_id=f.opt("room_id", room_id),
        )
    if name == "ConfirmVerification":
        f = Fields(payload, at, ("flow_id",), ("matches",))
        return ConfirmVerification(
            f.get("flow_id", nonempty), matches=f.opt("matches", bool_, True) is not False
        )
    kind = AcceptVerification if name == "AcceptVerification" else CancelVerification
    return kind(Fields(payload, at, ("flow_id",)).get("flow_id", nonempty))


def command_from_wire(value: Json, where: str = "command") -> Command:
    """Decode a :data:`Command`; raises :class:`WireError`."""
    name, payload = variant(value, where, _COMMAND_UNITS, _COMMAND_DATAS)
    at = f"{where}.{name}"
    match name:
        case "Shutdown":
            return Shutdown()
        case "DumpState":
            return DumpState()
        case "OpenRoom":
            return OpenRoom(Fields(payload, at, ("room_id",)).get("room_id", room_id))
        case "CloseRoom":
            return CloseRoom(Fields(payload, at, ("room_id",)).get("room_id", room_id))
        case "SendMessage":
            f = Fields(
                payload,
                at,
                ("room_id", "body"),
                ("in_reply_to", "thread_root", "msgtype", "markdown"),
            )
            return SendMessage(
                f.get("room_id", room_id),
                f.get("body", str_),
                in_reply_to=f.opt("in_reply_to", event_id),
                thread_root=f.opt("thread_root", event_id),
                msgtype=f.opt("msgtype", _msgtype, "m.text") or "m.text",
                markdown=bool(f.opt("markdown", bool_)),
            )
        case "PaginateBackwards":
            f = Fields(payload, at, ("room_id", "count"), ("thread_root",))
            return PaginateBackwards(
                f.get("room_id", room_id),
                f.get("count", positive),
                thread_root=f.opt("thread_root", event_id),
            )
        case "SendReaction":
            f = Fields(payload, at, ("room_id", "event_id", "key"))
            return SendReaction(
                f.get("room_id", room_id), f.get("event_id", event_id), f.get("key", _reaction_key)
            )
        case "RedactEvent":
            f = Fields(payload, at, ("room_id", "event_id"), ("reason",))
            return RedactEvent(
                f.get("room_id", room_id), f.get("event_id", event_id), f.opt("reason", str_)
            )
        case "EditMessage":
            f = Fields(payload, at, ("room_id", "event_id", "body"), ("markdown",))
            return EditMessage(
                f.get("room_id", room_id),
                f.get("event_id", event_id),
                f.get("body", str_),
                markdown=bool(f.opt("markdown", bool_)),
            )
        case "MarkRead":
            f = Fields(payload, at, ("room_id", "event_id"), ("private",))
            return MarkRead(
                f.get("room_id", room_id),
                f.get("event_id", event_id),
                private=bool(f.opt("private", bool_)),
            )
        case "OpenThread":
            f = Fields(payload, at, ("room_id", "thread_root"))
            return OpenThread(f.get("room_id", room_id), f.get("thread_root", event_id))
        case "ShrinkTimeline":
            f = Fields(payload, at, ("room_id",), ("thread_root",))
            return ShrinkTimeline(f.get("room_id", room_id), f.opt("thread_root", event_id))
        case "SetTyping":
            f = Fields(payload, at, ("room_id", "typing"))
            return SetTyping(f.get("room_id", room_id), f.get("typing", bool_))
        case "JoinRoom":
            return JoinRoom(Fields(payload, at, ("room",)).get("room", _room_or_alias))
        case "LeaveRoom" | "AcceptInvite" | "DeclineInvite":
            kinds = {"LeaveRoom": LeaveRoom, "AcceptInvite": AcceptInvite}
            kind = kinds.get(name, DeclineInvite)
            return kind(Fields(payload, at, ("room_id",)).get("room_id", room_id))
        case "CreateRoom":
            f = Fields(payload, at, (), ("name", "topic", "invitees", "encrypted", "direct"))
            return CreateRoom(
                name=f.opt("name", str_),
                topic=f.opt("topic", str_),
                invitees=f.opt("invitees", _user_ids) or (),
                encrypted=bool(f.opt("encrypted", bool_)),
                direct=bool(f.opt("direct", bool_)),
            )
        case (
            "StartVerification"
            | "AcceptVerification"
            | "ConfirmVerification"
            | "CancelVerification"
        ):
            return _verification_command(name, payload, at)
        case "InviteUser":
            f = Fields(payload, at, ("room_id", "user_id"))
            return InviteUser(f.get("room_id", room_id), f.get("user_id", _user_id))
        case "SetTopic":
            f = Fields(payload, at, ("room_id", "topic"))
            return SetTopic(f.get("room_id", room_id), f.get("topic", str_))
        case "RetrySend" | "CancelSend":
            f = Fields(payload, at, ("room_id", "id"))
            kind = RetrySend if name == "RetrySend" else CancelSend
            return kind(f.get("room_id", room_id), f.get("id", nonempty))
        case _:  # "HistoryRepair"
            inner, data = variant(payload, at, (), ("FillGap", "RetryRecent", "Cancel"))
            at = f"{at}.{inner}"
            if inner == "FillGap":
                f = Fields(data, at, ("room_id", "gap_id"))
                return HistoryRepair(FillGap(f.get("room_id", room_id), f.get("gap_id", nonempty)))
            room = Fields(data, at, ("room_id",)).get("room_id", room_id)
            return HistoryRepair(RetryRecent(room) if inner == "RetryRecent" else Cancel(room))


_ANSWER_UNITS: dict[str, Answer] = {
    "Ok": Ok(),
    "RoomBusy": RoomBusy(),
    "Interrupted": Interrupted(),
    "EventNotFound": EventNotFound(),
    "RoomNotOpen": RoomNotOpen(),
}


def answer_from_wire(value: Json, where: str = "answer") -> Answer:
    """Decode an answer; raises :class:`WireError`."""
    name, payload = variant(
        value, where, tuple(_ANSWER_UNITS), ("Failed", "Invalid", "RoomCreated")
    )
    if name in _ANSWER_UNITS:
        return _ANSWER_UNITS[name]
    if name == "RoomCreated":
        f = Fields(payload, f"{where}.{name}", ("room_id",))
        return RoomCreated(f.get("room_id", room_id))
    message = str_(payload, f"{where}.{name}")
    return Failed(message) if name == "Failed" else Invalid(message)


def recent_state_from_wire(value: Json, where: str = "state") -> RecentHistoryState:
    units = tuple(k.value for k in RecentHistoryKind if k is not RecentHistoryKind.Failed)
    name, payload = variant(value, where, units, ("Failed",))
    if name == "Failed":
        return RecentHistoryState.failed(str_(payload, f"{where}.Failed"))
    return RecentHistoryState(RecentHistoryKind(name))


_REPORT_FIELDS = ("room_id", "gap_id", "pages", "events", "phase", "continuity", "stop", "failure")


def report_from_wire(value: Json, where: str = "report") -> HistoryRepairReport:
    f = Fields(value, where, _REPORT_FIELDS)
    return HistoryRepairReport(
        room_id=f.get("room_id", str_),
        gap_id=f.get("gap_id", nonempty),
        pages=f.get("pages", count),
        events=f.get("events", count),
        phase=f.get("phase", enum_of(RepairPhase)),
        continuity=f.get("continuity", opt_enum_of(Continuity)),
        stop=f.get("stop", opt_enum_of(RepairStop)),
        failure=f.get("failure", opt_str),
    )


def _members(value: Json, where: str) -> tuple[Member, ...]:
    if not isinstance(value, list):
        raise WireError(f"{where}: expected an array, got {describe(value)}")
    return tuple(_member(v, f"{where}[{i}]") for i, v in enumerate(value))


_EVENTS = (
    "RecentHistoryChanged",
    "HistoryRepairChanged",
    "TimelineReset",
    "TimelineChanged",
    "TypingChanged",
    "MembersChanged",
    "SendQueueChanged",
    "VerificationChanged",
)


def event_from_wire(value: Json, where: str = "event") -> Event:
    """Decode a published event; raises :class:`WireError`."""
    name, payload = variant(value, where, (), _EVENTS)
    at = f"{where}.{name}"
    match name:
        case "RecentHistoryChanged":
            f = Fields(payload, at, ("room_id", "state"))
            return RecentHistoryChanged(
                f.get("room_id", str_), f.get("state", recent_state_from_wire)
            )
        case "HistoryRepairChanged":
            return HistoryRepairChanged(report_from_wire(payload, at))
        case "TimelineReset":
            f = Fields(payload, at, ("room_id", "items"), ("thread_root",))
            return TimelineReset(
                f.get("room_id", str_), f.get("items", items), f.opt("thread_root", str_)
            )
        case "TimelineChanged":
            f = Fields(payload, at, ("room_id", "diffs"), ("thread_root",))
            return TimelineChanged(
                f.get("room_id", str_), f.get("diffs", diffs), f.opt("thread_root", str_)
            )
        case "TypingChanged":
            f = Fields(payload, at, ("room_id", "user_ids"))
            return TypingChanged(f.get("room_id", str_), f.get("user_ids", str_list))
        case "SendQueueChanged":
            f = Fields(payload, at, ("pending", "failed"))
            return SendQueueChanged(f.get("pending", count), f.get("failed", count))
        case "VerificationChanged":
            return _verification_event(payload, at)
        case _:  # MembersChanged
            f = Fields(payload, at, ("room_id", "members"))
            return MembersChanged(f.get("room_id", str_), f.get("members", _members))


_VERIFICATION_OPTIONAL = ("other_device", "room_id", "outgoing", "emoji", "decimals",
                          "cancel_code", "cancel_reason", "cancelled_by_us", "cross_signed")  # fmt: skip


def _emoji(value: Json, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list):
        raise WireError(f"{where}: expected an array, got {describe(value)}")
    pairs = []
    for i, pair in enumerate(value):
        texts = str_list(pair, f"{where}[{i}]")
        if len(texts) != 2:
            raise WireError(f"{where}[{i}]: expected [symbol, name], got {describe(pair)}")
        pairs.append((texts[0], texts[1]))
    return tuple(pairs)


def _decimals(value: Json, where: str) -> tuple[int, int, int]:
    if not isinstance(value, list) or len(value) != 3:
        raise WireError(f"{where}: expected three numbers, got {describe(value)}")
    a, b, c = (count(v, f"{where}[{i}]") for i, v in enumerate(value))
    return (a, b, c)


def _verification_event(payload: Json, at: str) -> VerificationChanged:
    f = Fields(payload, at, ("flow_id", "other_user", "state"), _VERIFICATION_OPTIONAL)
    return VerificationChanged(
        flow_id=f.get("flow_id", nonempty),
        other_user=f.get("other_user", str_),
        other_device=f.opt("other_device", str_),
        room_id=f.opt("room_id", str_),
        state=f.get("state", enum_of(VerificationPhase)),
        outgoing=bool(f.opt("outgoing", bool_)),
        emoji=f.opt("emoji", _emoji),
        decimals=f.opt("decimals", _decimals),
        cancel_code=f.opt("cancel_code", str_),
        cancel_reason=f.opt("cancel_reason", str_),
        cancelled_by_us=bool(f.opt("cancelled_by_us", bool_)),
        cross_signed=bool(f.opt("cross_signed", bool_)),
    )


def _map(value: Json, where: str, check: Callable[[Json, str], T]) -> dict[str, T]:
    if not isinstance(value, dict):
        raise WireError(f"{where}: expected an object, got {describe(value)}")
    return {str_(k, f"{where} key"): check(v, f"{where}[{k}]") for k, v in value.items()}


def state_from_wire(value: Json, where: str = "state") -> State:
    """Decode a mirror :class:`State` (what ``DumpState`` prints)."""
    f = Fields(
        value, where, ("recent_history", "repairs", "timelines"), ("threads", "typing", "members")
    )

    def threads(v: Json, w: str) -> dict[str, MappingProxyType]:
        return {
            r: MappingProxyType(t) for r, t in _map(v, w, lambda x, y: _map(x, y, items)).items()
        }

    return State(
        MappingProxyType(f.get("recent_history", lambda v, w: _map(v, w, recent_state_from_wire))),
        MappingProxyType(f.get("repairs", lambda v, w: _map(v, w, report_from_wire))),
        MappingProxyType(f.get("timelines", lambda v, w: _map(v, w, items))),
        MappingProxyType(f.opt("threads", threads) or {}),
        MappingProxyType(f.opt("typing", lambda v, w: _map(v, w, str_list)) or {}),
        MappingProxyType(f.opt("members", lambda v, w: _map(v, w, _members)) or {}),
    )
