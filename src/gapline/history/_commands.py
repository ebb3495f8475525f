"""The commands a client sends the engine (wire: ``{"OpenRoom": {...}}``, ``"Shutdown"``).

Part of the protocol vocabulary re-exported by ``_types``; see there for how
Rust-style enums are spelled in Python. Optional fields (``SendMessage``'s
``in_reply_to``, ...) default to ``None`` and are left out of the wire when unset,
so a command written before they existed means the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

MSGTYPES = ("m.text", "m.emote", "m.notice")
"""The message types ``SendMessage`` sends: a message, an action (``/me``), a notice."""

__all__ = [
    "MSGTYPES",
    "AcceptInvite",
    "AcceptVerification",
    "Cancel",
    "CancelSend",
    "CancelVerification",
    "CloseRoom",
    "Command",
    "ConfirmVerification",
    "CreateRoom",
    "DeclineInvite",
    "DumpState",
    "EditMessage",
    "FillGap",
    "HistoryRepair",
    "HistoryRepairCommand",
    "InviteUser",
    "JoinRoom",
    "LeaveRoom",
    "MarkRead",
    "OpenRoom",
    "OpenThread",
    "PaginateBackwards",
    "RedactEvent",
    "RetryRecent",
    "RetrySend",
    "SendMessage",
    "SendReaction",
    "SetTopic",
    "SetTyping",
    "ShrinkTimeline",
    "Shutdown",
    "StartVerification",
]


# --------------------------------------------------------------------------- commands


@dataclass(frozen=True, slots=True)
class OpenRoom:
    """Load retained history and gaps (one ``TimelineReset``), then start a recent load."""

    room_id: str


@dataclass(frozen=True, slots=True)
class CloseRoom:
    """Stop whatever runs in the room, publish ``Idle``, forget its timeline."""

    room_id: str


@dataclass(frozen=True, slots=True)
class FillGap:
    room_id: str
    gap_id: str


@dataclass(frozen=True, slots=True)
class RetryRecent:
    room_id: str


@dataclass(frozen=True, slots=True)
class Cancel:
    room_id: str


HistoryRepairCommand: TypeAlias = FillGap | RetryRecent | Cancel


@dataclass(frozen=True, slots=True)
class HistoryRepair:
    """Wraps a :data:`HistoryRepairCommand` (wire: ``{"HistoryRepair": {"FillGap": ...}}``)."""

    command: HistoryRepairCommand

    @property
    def room_id(self) -> str:
        return self.command.room_id


@dataclass(frozen=True, slots=True)
class SendMessage:
    """Send a text message; ``in_reply_to`` quotes an event, ``thread_root`` posts it in
    that event's thread (both optional, and absent from the wire when unset).

    ``msgtype`` is one of :data:`MSGTYPES` (``m.emote`` is what ``/me`` sends);
    ``markdown`` renders ``body`` as markdown into a ``formatted_body`` (HTML) when it
    has any markup, the body staying the source as typed.
    """

    room_id: str
    body: str
    in_reply_to: str | None = None
    thread_root: str | None = None
    msgtype: str = "m.text"
    markdown: bool = False

    def __post_init__(self) -> None:
        if self.msgtype not in MSGTYPES:
            raise ValueError(f"SendMessage.msgtype must be one of {MSGTYPES}, got {self.msgtype!r}")


@dataclass(frozen=True, slots=True)
class PaginateBackwards:
    """Extension: load up to ``count`` rows older than the oldest loaded row of an open room.

    Retained rows come from the cache first; once the oldest retained event
    is loaded, the room is paginated on the server (from the oldest section's
    cursor). New rows land as ``TimelineChanged`` diffs at the front; the
    answer (``Ok``) comes after them. A call that adds no row means the top of
    the room's accessible history is loaded. It is a history operation of the
    room: it answers ``RoomBusy`` while a recent load or a fill runs (and
    while it runs, they do), and ``Cancel`` interrupts it.
    """

    room_id: str
    count: int = 50
    thread_root: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(
                f"PaginateBackwards.count must be a positive integer, got {self.count!r}"
            )


@dataclass(frozen=True, slots=True)
class SendReaction:
    """React to an event with ``key``, or take this account's reaction with that key back
    (a toggle, as a reaction chip behaves): the reaction is redacted if it exists."""

    room_id: str
    event_id: str
    key: str


@dataclass(frozen=True, slots=True)
class RedactEvent:
    """Redact (delete) an event; ``reason`` is optional."""

    room_id: str
    event_id: str
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class EditMessage:
    """Replace the text of one of this account's messages (an ``m.replace``); with
    ``markdown``, the new text's HTML goes with it as ``SendMessage``'s does."""

    room_id: str
    event_id: str
    body: str
    markdown: bool = False


@dataclass(frozen=True, slots=True)
class MarkRead:
    """This account has read up to ``event_id``: moves the fully-read marker and sends a
    read receipt there (a private one, seen by no one else, with ``private``)."""

    room_id: str
    event_id: str
    private: bool = False


@dataclass(frozen=True, slots=True)
class OpenThread:
    """Open the thread rooted at ``thread_root`` of an open room: its own timeline
    (``TimelineReset`` with ``thread_root``), filled with ``/relations`` and its own
    durable gaps. It stays open until its room closes."""

    room_id: str
    thread_root: str


@dataclass(frozen=True, slots=True)
class ShrinkTimeline:
    """Drop every loaded row but the newest window and reload it as one ``Reset`` diff
    (also how a client returns to the live end after scrolling far back)."""

    room_id: str
    thread_root: str | None = None


@dataclass(frozen=True, slots=True)
class SetTyping:
    """Tell the room this account is (or stopped) typing."""

    room_id: str
    typing: bool


@dataclass(frozen=True, slots=True)
class RetrySend:
    """Queue a message that failed again (its row goes back to ``Pending``); ``id`` is the
    local echo row's id."""

    room_id: str
    id: str


@dataclass(frozen=True, slots=True)
class CancelSend:
    """Drop a queued message that is pending or failed (its row goes); ``id`` is the local
    echo row's id. One the homeserver already has cannot be cancelled (``Failed``)."""

    room_id: str
    id: str


@dataclass(frozen=True, slots=True)
class JoinRoom:
    """Join a room by id (``!``) or alias (``#name:server``); ``Ok`` once the homeserver
    has the join, and the room can be opened then."""

    room: str


@dataclass(frozen=True, slots=True)
class LeaveRoom:
    """Leave a room (closing it first if it is open)."""

    room_id: str


@dataclass(frozen=True, slots=True)
class AcceptInvite:
    """Join a room this account was invited to."""

    room_id: str


@dataclass(frozen=True, slots=True)
class DeclineInvite:
    """Refuse an invite (leave the room one was invited to)."""

    room_id: str


@dataclass(frozen=True, slots=True)
class InviteUser:
    """Invite ``user_id`` to a room this account is in; ``Ok`` once the homeserver sent it."""

    room_id: str
    user_id: str


@dataclass(frozen=True, slots=True)
class SetTopic:
    """Set a room's topic (an empty topic removes it); ``Ok`` once the homeserver has it."""

    room_id: str
    topic: str


@dataclass(frozen=True, slots=True)
class CreateRoom:
    """Create a private room and invite ``invitees``; ``encrypted`` turns on end-to-end
    encryption from the start, ``direct`` makes it a direct chat (``m.direct``). Answers
    ``RoomCreated`` with the new room's id."""

    name: str | None = None
    topic: str | None = None
    invitees: tuple[str, ...] = ()
    encrypted: bool = False
    direct: bool = False


@dataclass(frozen=True, slots=True)
class StartVerification:
    """Ask to verify ``user_id`` interactively (emoji or numbers): one of its devices
    (``device_id``), else every device it has (over to-device), or, with ``room_id``, in
    that room (the way to verify another user in a shared room). ``Ok`` once the request
    is out; the flow shows in ``VerificationChanged`` events."""

    user_id: str
    device_id: str | None = None
    room_id: str | None = None


@dataclass(frozen=True, slots=True)
class AcceptVerification:
    """Agree to a verification another device asked for (its request, or its start)."""

    flow_id: str


@dataclass(frozen=True, slots=True)
class ConfirmVerification:
    """The person compared the emoji (or numbers): ``matches`` says they are the same
    on both screens; ``False`` ends the flow and tells the other side so."""

    flow_id: str
    matches: bool = True


@dataclass(frozen=True, slots=True)
class CancelVerification:
    """End a verification that has not finished (the other side is told)."""

    flow_id: str


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Close every open room (each publishes ``Idle``) and stop the engine."""


@dataclass(frozen=True, slots=True)
class DumpState:
    """Extension: ask for the mirror's state. The bridge answers it from its mirror."""


Command: TypeAlias = (
    OpenRoom
    | CloseRoom
    | HistoryRepair
    | SendMessage
    | PaginateBackwards
    | Shutdown
    | DumpState
    | SendReaction
    | RedactEvent
    | EditMessage
    | MarkRead
    | OpenThread
    | ShrinkTimeline
    | SetTyping
    | RetrySend
    | CancelSend
    | JoinRoom
    | LeaveRoom
    | AcceptInvite
    | DeclineInvite
    | CreateRoom
    | StartVerification
    | AcceptVerification
    | ConfirmVerification
    | CancelVerification
    | InviteUser
    | SetTopic
)
