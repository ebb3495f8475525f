"""Decoding timeline items and diffs: the inverse of ``_wire``'s ``_item`` and ``_diff``.

An ``Event`` item's fields added after the first protocol version
(``sender_name``, ``in_reply_to``, ``reactions``, ``thread_summary``,
``encrypted``, ``decryption``, ``msgtype``, ``formatted_body``) are optional: a row written without them
decodes with their defaults.
"""

from __future__ import annotations

from gapline.history._types import (
    Append,
    Clear,
    EventItem,
    GapLifecycle,
    HistoryGapItem,
    InReplyTo,
    Insert,
    Member,
    PushBack,
    PushFront,
    Reaction,
    ReadMarkerItem,
    Remove,
    ReplyStatus,
    Reset,
    SendState,
    Set,
    ThreadLatest,
    ThreadSummary,
    TimelineItem,
    Undecrypted,
    UtdReason,
    VectorDiff,
)
from gapline.history._wire import Json, WireError
from gapline.history._wire_fields import (
    Fields,
    bool_,
    count,
    describe,
    enum_of,
    int_,
    nonempty,
    opt_str,
    str_,
    str_list,
    variant,
)

__all__ = ["diff_from_wire", "diffs", "item_from_wire", "items", "member_from_wire"]

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
_EVENT_ITEM_OPTIONAL = (
    "sender_name",
    "in_reply_to",
    "reactions",
    "thread_summary",
    "encrypted",
    "decryption",
    "send_state",
    "msgtype",
    "formatted_body",
)
_GAP_FIELDS = ("id", "older_boundary", "newer_boundary", "lifecycle", "failure")
_PREVIEW_FIELDS = ("event_id", "sender", "sender_name", "body", "redacted")


def _decryption(value: Json, where: str) -> Undecrypted | None:
    if value is None:
        return None
    _, payload = variant(value, where, (), ("UnableToDecrypt",))
    f = Fields(payload, f"{where}.UnableToDecrypt", ("session_id", "reason"))
    return Undecrypted(f.get("session_id", str_), f.get("reason", enum_of(UtdReason)))


def _reply(value: Json, where: str) -> InReplyTo:
    f = Fields(value, where, ("event_id", "status", *_PREVIEW_FIELDS[1:]))
    status = f.get("status", enum_of(ReplyStatus))
    sender = f.get("sender", opt_str)
    if (status is ReplyStatus.Ready) != (sender is not None):
        raise WireError(f"{where}: sender is set exactly when status is Ready")
    return InReplyTo(
        event_id=f.get("event_id", nonempty),
        status=status,
        sender=sender,
        sender_name=f.get("sender_name", opt_str),
        body=f.get("body", opt_str),
        redacted=f.get("redacted", bool_),
    )


def _latest(value: Json, where: str) -> ThreadLatest:
    f = Fields(value, where, _PREVIEW_FIELDS)
    return ThreadLatest(
        event_id=f.get("event_id", nonempty),
        sender=f.get("sender", nonempty),
        sender_name=f.get("sender_name", opt_str),
        body=f.get("body", opt_str),
        redacted=f.get("redacted", bool_),
    )


def _thread(value: Json, where: str) -> ThreadSummary:
    f = Fields(value, where, ("count", "latest", "participated"))
    return ThreadSummary(
        count=f.get("count", count),
        latest=f.get("latest", lambda v, w: None if v is None else _latest(v, w)),
        participated=f.get("participated", bool_),
    )


def _reactions(value: Json, where: str) -> tuple[Reaction, ...]:
    if not isinstance(value, list):
        raise WireError(f"{where}: expected an array, got {describe(value)}")
    out = []
    for i, entry in enumerate(value):
        f = Fields(entry, f"{where}[{i}]", ("key", "senders"))
        out.append(Reaction(f.get("key", nonempty), f.get("senders", str_list)))
    return tuple(out)


def _send_state(value: Json, where: str) -> SendState | None:
    if value is None:
        return None
    name, payload = variant(value, where, ("Pending",), ("Failed",))
    if name == "Pending":
        return SendState.PENDING
    return SendState.failed(str_(payload, f"{where}.Failed"))


def member_from_wire(value: Json, where: str = "member") -> Member:
    f = Fields(value, where, ("user_id", "display_name", "membership"))
    return Member(
        user_id=f.get("user_id", nonempty),
        display_name=f.get("display_name", opt_str),
        membership=f.get("membership", nonempty),
    )


def item_from_wire(value: Json, where: str = "item") -> TimelineItem:
    """Decode a timeline item; raises :class:`WireError`."""
    name, payload = variant(value, where, (), ("Event", "HistoryGap", "ReadMarker"))
    at = f"{where}.{name}"
    if name == "Event":
        f = Fields(payload, at, _EVENT_ITEM_FIELDS, _EVENT_ITEM_OPTIONAL)
        return EventItem(
            id=f.get("id", nonempty),
            event_id=f.get("event_id", nonempty),
            sender=f.get("sender", nonempty),
            origin_server_ts=f.get("origin_server_ts", int_),
            event_type=f.get("event_type", nonempty),
            body=f.get("body", opt_str),
            edited=f.get("edited", bool_),
            redacted=f.get("redacted", bool_),
            receipts=f.get("receipts", str_list),
            sender_name=f.opt("sender_name", str_),
            in_reply_to=f.opt("in_reply_to", _reply),
            reactions=f.opt("reactions", _reactions, ()) or (),
            thread_summary=f.opt("thread_summary", _thread),
            encrypted=f.opt("encrypted", bool_, False) or False,
            decryption=f.opt("decryption", _decryption),
            send_state=f.opt("send_state", _send_state),
            msgtype=f.opt("msgtype", nonempty),
            formatted_body=f.opt("formatted_body", str_),
        )
    if name == "HistoryGap":
        f = Fields(payload, at, _GAP_FIELDS)
        try:
            return HistoryGapItem(
                id=f.get("id", nonempty),
                older_boundary=f.get("older_boundary", nonempty),
                newer_boundary=f.get("newer_boundary", nonempty),
                lifecycle=f.get("lifecycle", enum_of(GapLifecycle)),
                failure=f.get("failure", opt_str),
            )
        except ValueError as exc:
            if isinstance(exc, WireError):
                raise
            raise WireError(f"{at}: {exc}") from exc
    return ReadMarkerItem(Fields(payload, at, ("id",)).get("id", nonempty))


def items(value: Json, where: str) -> tuple[TimelineItem, ...]:
    if not isinstance(value, list):
        raise WireError(f"{where}: expected an array, got {describe(value)}")
    return tuple(item_from_wire(v, f"{where}[{i}]") for i, v in enumerate(value))


def diff_from_wire(value: Json, where: str = "diff") -> VectorDiff:
    """Decode a ``VectorDiff``; raises :class:`WireError`."""
    name, payload = variant(
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
            return Append(Fields(payload, at, ("values",)).get("values", items))
        case "Reset":
            return Reset(Fields(payload, at, ("values",)).get("values", items))
        case "PushFront":
            return PushFront(Fields(payload, at, ("value",)).get("value", item_from_wire))
        case "PushBack":
            return PushBack(Fields(payload, at, ("value",)).get("value", item_from_wire))
        case "Remove":
            return Remove(Fields(payload, at, ("index",)).get("index", count))
        case _:  # Insert, Set
            f = Fields(payload, at, ("index", "value"))
            index, item = f.get("index", count), f.get("value", item_from_wire)
            return Insert(index, item) if name == "Insert" else Set(index, item)


def diffs(value: Json, where: str) -> tuple[VectorDiff, ...]:
    if not isinstance(value, list):
        raise WireError(f"{where}: expected an array, got {describe(value)}")
    return tuple(diff_from_wire(v, f"{where}[{i}]") for i, v in enumerate(value))
