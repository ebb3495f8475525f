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
    AcceptInvite,
    AcceptVerification,
    Append,
    Cancel,
    CancelSend,
    CancelVerification,
    Clear,
    CloseRoom,
    ConfirmVerification,
    CreateRoom,
    DeclineInvite,
    DumpState,
    EditMessage,
    EventItem,
    EventNotFound,
    Failed,
    FillGap,
    HistoryGapItem,
    HistoryRepair,
    HistoryRepairChanged,
    HistoryRepairReport,
    InReplyTo,
    Insert,
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
    PushBack,
    PushFront,
    ReadMarkerItem,
    RecentHistoryChanged,
    RecentHistoryKind,
    RecentHistoryState,
    RedactEvent,
    Remove,
    Reset,
    RetryRecent,
    RetrySend,
    RoomBusy,
    RoomCreated,
    RoomNotOpen,
    SendMessage,
    SendQueueChanged,
    SendReaction,
    SendState,
    SendStateKind,
    Set,
    SetTopic,
    SetTyping,
    ShrinkTimeline,
    Shutdown,
    StartVerification,
    ThreadSummary,
    TimelineChanged,
    TimelineItem,
    TimelineReset,
    TypingChanged,
    Undecrypted,
    VectorDiff,
    VerificationChanged,
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


def _with(base: dict[str, Json], **optional: Json) -> dict[str, Json]:
    """``base`` plus each optional field that is set (serde's ``skip_serializing_if``):
    a value written before the field existed keeps its exact JSON."""
    base.update((k, v) for k, v in optional.items() if v is not None)
    return base


def _reply(reply: InReplyTo) -> dict[str, Json]:
    return {
        "event_id": reply.event_id,
        "status": reply.status.value,
        "sender": reply.sender,
        "sender_name": reply.sender_name,
        "body": reply.body,
        "redacted": reply.redacted,
    }


def _thread(summary: ThreadSummary) -> dict[str, Json]:
    latest = summary.latest
    return {
        "count": summary.count,
        "latest": None
        if latest is None
        else {
            "event_id": latest.event_id,
            "sender": latest.sender,
            "sender_name": latest.sender_name,
            "body": latest.body,
            "redacted": latest.redacted,
        },
        "participated": summary.participated,
    }


def _member(member: Member) -> dict[str, Json]:
    return {
        "user_id": member.user_id,
        "display_name": member.display_name,
        "membership": member.membership,
    }


def _send_state(state: SendState | None) -> Json:
    if state is None:
        return None
    if state.kind is SendStateKind.Failed:
        return {"Failed": state.message}
    return state.kind.value


def _decryption(decryption: Undecrypted | None) -> Json:
    if decryption is None:
        return None
    return {
        "UnableToDecrypt": {
            "session_id": decryption.session_id,
            "reason": decryption.reason.value,
        }
    }


def _item(item: TimelineItem) -> dict[str, Json]:
    match item:
        case EventItem():
            return _tag(
                "Event",
                _with(
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
                        # Pinned: always present, null/false when unset.
                        "encrypted": item.encrypted,
                        "decryption": _decryption(item.decryption),
                        "send_state": _send_state(item.send_state),
                    },
                    sender_name=item.sender_name,
                    in_reply_to=None if item.in_reply_to is None else _reply(item.in_reply_to),
                    reactions=[{"key": r.key, "senders": list(r.senders)} for r in item.reactions]
                    or None,
                    thread_summary=None
                    if item.thread_summary is None
                    else _thread(item.thread_summary),
                    msgtype=item.msgtype,
                    formatted_body=item.formatted_body,
                ),
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
    return _with(
        {
            "recent_history": {
                r: _recent_state(s) for r, s in sorted(state.recent_history.items())
            },
            "repairs": {r: _report(rep) for r, rep in sorted(state.repairs.items())},
            "timelines": {
                r: [_item(i) for i in items] for r, items in sorted(state.timelines.items())
            },
        },
        threads={
            r: {root: [_item(i) for i in items] for root, items in sorted(roots.items())}
            for r, roots in sorted(state.threads.items())
        }
        or None,
        typing={r: list(users) for r, users in sorted(state.typing.items())} or None,
        members={r: [_member(m) for m in members] for r, members in sorted(state.members.items())}
        or None,
    )


def _verification(v: VerificationChanged) -> dict[str, Json]:
    return {
        "flow_id": v.flow_id,
        "other_user": v.other_user,
        "other_device": v.other_device,
        "room_id": v.room_id,
        "state": v.state.value,
        "outgoing": v.outgoing,
        "emoji": None if v.emoji is None else [list(pair) for pair in v.emoji],
        "decimals": None if v.decimals is None else list(v.decimals),
        "cancel_code": v.cancel_code,
        "cancel_reason": v.cancel_reason,
        "cancelled_by_us": v.cancelled_by_us,
        "cross_signed": v.cross_signed,
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
        case SendMessage(room_id=room_id, body=body, in_reply_to=reply, thread_root=root):
            return _tag(
                "SendMessage",
                _with(
                    {"room_id": room_id, "body": body},
                    in_reply_to=reply,
                    thread_root=root,
                    msgtype=None if value.msgtype == "m.text" else value.msgtype,
                    markdown=value.markdown or None,
                ),
            )
        case PaginateBackwards(room_id=room_id, count=count, thread_root=root):
            return _tag(
                "PaginateBackwards",
                _with({"room_id": room_id, "count": count}, thread_root=root),
            )
        case SendReaction(room_id=room_id, event_id=event_id, key=key):
            return _tag("SendReaction", {"room_id": room_id, "event_id": event_id, "key": key})
        case RedactEvent(room_id=room_id, event_id=event_id, reason=reason):
            return _tag(
                "RedactEvent", _with({"room_id": room_id, "event_id": event_id}, reason=reason)
            )
        case EditMessage(room_id=room_id, event_id=event_id, body=body, markdown=markdown):
            return _tag(
                "EditMessage",
                _with(
                    {"room_id": room_id, "event_id": event_id, "body": body},
                    markdown=markdown or None,
                ),
            )
        case MarkRead(room_id=room_id, event_id=event_id, private=private):
            return _tag(
                "MarkRead",
                _with({"room_id": room_id, "event_id": event_id}, private=private or None),
            )
        case OpenThread(room_id=room_id, thread_root=root):
            return _tag("OpenThread", {"room_id": room_id, "thread_root": root})
        case ShrinkTimeline(room_id=room_id, thread_root=root):
            return _tag("ShrinkTimeline", _with({"room_id": room_id}, thread_root=root))
        case SetTyping(room_id=room_id, typing=typing):
            return _tag("SetTyping", {"room_id": room_id, "typing": typing})
        case RetrySend(room_id=room_id, id=row_id):
            return _tag("RetrySend", {"room_id": room_id, "id": row_id})
        case CancelSend(room_id=room_id, id=row_id):
            return _tag("CancelSend", {"room_id": room_id, "id": row_id})
        case JoinRoom(room=room):
            return _tag("JoinRoom", {"room": room})
        case LeaveRoom(room_id=room_id):
            return _tag("LeaveRoom", {"room_id": room_id})
        case InviteUser(room_id=room_id, user_id=user_id):
            return _tag("InviteUser", {"room_id": room_id, "user_id": user_id})
        case SetTopic(room_id=room_id, topic=topic):
            return _tag("SetTopic", {"room_id": room_id, "topic": topic})
        case AcceptInvite(room_id=room_id):
            return _tag("AcceptInvite", {"room_id": room_id})
        case DeclineInvite(room_id=room_id):
            return _tag("DeclineInvite", {"room_id": room_id})
        case CreateRoom(name=name, topic=topic, invitees=invitees, encrypted=enc, direct=direct):
            return _tag(
                "CreateRoom",
                _with(
                    {},
                    name=name,
                    topic=topic,
                    invitees=list(invitees) or None,
                    encrypted=enc or None,
                    direct=direct or None,
                ),
            )
        case StartVerification(user_id=user, device_id=device, room_id=room):
            return _tag("StartVerification", _with({"user_id": user}, device_id=device,
                                                   room_id=room))  # fmt: skip
        case AcceptVerification(flow_id=flow):
            return _tag("AcceptVerification", {"flow_id": flow})
        case ConfirmVerification(flow_id=flow, matches=matches):
            return _tag("ConfirmVerification", _with({"flow_id": flow},
                                                     matches=None if matches else False))  # fmt: skip
        case CancelVerification(flow_id=flow):
            return _tag("CancelVerification", {"flow_id": flow})
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
        case RoomCreated(room_id=room_id):
            return _tag("RoomCreated", {"room_id": room_id})
        # events
        case RecentHistoryChanged(room_id=room_id, state=state):
            return _tag("RecentHistoryChanged", {"room_id": room_id, "state": _recent_state(state)})
        case HistoryRepairChanged(report=report):
            return _tag("HistoryRepairChanged", _report(report))
        case TimelineReset(room_id=room_id, items=items, thread_root=root):
            return _tag(
                "TimelineReset",
                _with({"room_id": room_id, "items": [_item(i) for i in items]}, thread_root=root),
            )
        case TimelineChanged(room_id=room_id, diffs=diffs, thread_root=root):
            return _tag(
                "TimelineChanged",
                _with({"room_id": room_id, "diffs": [_diff(d) for d in diffs]}, thread_root=root),
            )
        case TypingChanged(room_id=room_id, user_ids=user_ids):
            return _tag("TypingChanged", {"room_id": room_id, "user_ids": list(user_ids)})
        case MembersChanged(room_id=room_id, members=members):
            return _tag(
                "MembersChanged", {"room_id": room_id, "members": [_member(m) for m in members]}
            )
        case SendQueueChanged(pending=pending, failed=failed):
            return _tag("SendQueueChanged", {"pending": pending, "failed": failed})
        case VerificationChanged():
            return _tag("VerificationChanged", _verification(value))
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
