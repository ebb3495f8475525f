"""Timeline items: the rows a room (or a thread) shows, and the parts an event row carries.

Wire variants are ``Event``, ``HistoryGap`` and ``ReadMarker`` (see
``_types`` for why the Python names end in ``Item``). An event row carries,
beyond its own fields, what the cache's relation rules made of it: the reply
it quotes (:class:`InReplyTo`), the reactions on it (:class:`Reaction`), the
summary of the thread it roots (:class:`ThreadSummary`) and its sender's
display name as of the event. Each of those is a value computed from what
the cache committed, never patched in by a reader.

Everything is immutable. An event row and its parts are msgspec Structs rather than
dataclasses: a fill builds one row per event on the store's writer thread, and a
Struct is built about six times faster (change one with ``msgspec.structs.replace``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

import msgspec

from gapline.e2ee import UtdReason

__all__ = [
    "READ_MARKER_ID",
    "EventItem",
    "GapLifecycle",
    "HistoryGapItem",
    "InReplyTo",
    "Member",
    "Reaction",
    "ReadMarkerItem",
    "ReplyStatus",
    "SendState",
    "SendStateKind",
    "ThreadLatest",
    "ThreadSummary",
    "TimelineItem",
    "Undecrypted",
    "UtdReason",
]

READ_MARKER_ID = "read-marker"


class GapLifecycle(enum.Enum):
    """Where a gap row stands. ``Failed`` carries the row's ``failure`` text."""

    Idle = "Idle"
    Paused = "Paused"
    Failed = "Failed"
    Unavailable = "Unavailable"


class ReplyStatus(enum.Enum):
    """How much of a replied-to event the cache can show.

    ``Ready``: its sender and first line are known (from the cache, or fetched
    once with ``/context``); ``Pending``: not known yet, the engine is fetching
    it; ``Unavailable``: the server would not return it (unknown, not visible,
    or in another room).
    """

    Ready = "Ready"
    Pending = "Pending"
    Unavailable = "Unavailable"


class InReplyTo(msgspec.Struct, frozen=True, kw_only=True):
    """The event a row replies to (``m.in_reply_to``), as far as the cache knows it.

    ``sender``, ``sender_name`` and ``body`` (its first line, ``None`` when it
    has no text) are set only when ``status`` is ``Ready``; ``redacted`` says
    the quoted event was deleted, and then ``body`` is ``None``.
    """

    event_id: str
    status: ReplyStatus = ReplyStatus.Pending
    sender: str | None = None
    sender_name: str | None = None
    body: str | None = None
    redacted: bool = False


class SendStateKind(enum.Enum):
    Pending = "Pending"
    Failed = "Failed"


@dataclass(frozen=True, slots=True)
class SendState:
    """Where a local echo (a message this account queued) stands: ``Pending`` until the
    server's event replaces the row, ``Failed(message)`` after a permanent refusal.

    Build ``Pending`` from :attr:`PENDING` and a failure with :meth:`failed`;
    ``message`` is set exactly when ``kind`` is ``Failed``.
    """

    kind: SendStateKind
    message: str | None = None

    PENDING: ClassVar[SendState]

    def __post_init__(self) -> None:
        if (self.kind is SendStateKind.Failed) != (self.message is not None):
            raise ValueError("SendState carries a message exactly when it is Failed")

    @classmethod
    def failed(cls, message: str) -> SendState:
        return cls(SendStateKind.Failed, message)


SendState.PENDING = SendState(SendStateKind.Pending)


class Reaction(msgspec.Struct, frozen=True):
    """One reaction key on a row and who reacted with it, earliest first."""

    key: str
    senders: tuple[str, ...]


class ThreadLatest(msgspec.Struct, frozen=True, kw_only=True):
    """The newest reply of a thread, as its summary shows it (first line only)."""

    event_id: str
    sender: str
    sender_name: str | None = None
    body: str | None = None
    redacted: bool = False


class ThreadSummary(msgspec.Struct, frozen=True, kw_only=True):
    """What a thread root row says of its thread: how many replies, the newest one,
    and whether this account took part (sent the root or a reply)."""

    count: int
    latest: ThreadLatest | None = None
    participated: bool = False


@dataclass(frozen=True, slots=True)
class Undecrypted:
    """Why an encrypted event's row has no body (wire: ``{"UnableToDecrypt": {...}}``).

    The row changes in place (same id, one ``Set`` diff) once the session's key
    arrives and the event decrypts; a body is shown only after a decryption
    succeeded.
    """

    session_id: str
    reason: UtdReason


class EventItem(msgspec.Struct, frozen=True, kw_only=True):
    """A room event as the timeline shows it (wire variant ``Event``).

    ``id`` is the row id, stable while the row exists (receipts and selection
    hang on it). ``body`` is the visible text: the newest valid replacement's
    when ``edited``, ``None`` when ``redacted`` or when the event has no text
    (an undecryptable message); a state event's body says in words what
    changed ("joined the room"). ``receipts`` lists the users whose read
    receipt sits on this row. ``sender_name`` is the sender's display name in
    the room as of the event (``None``: none known), disambiguated with the
    user id when another member had the same name. ``msgtype`` is a message's type
    (``m.text``, ``m.emote``, ``m.notice``, ...; ``None`` for other events) and
    ``formatted_body`` its HTML (``org.matrix.custom.html``, of the visible revision,
    as the sender wrote it: a reader must sanitise it), ``None`` when it has none. ``encrypted`` says the event
    arrived as ``m.room.encrypted``; ``decryption`` is set (and ``body`` is
    ``None``) while it could not be decrypted. ``send_state`` is ``None`` for an
    event the server ordered, and set on a local echo: a message queued here and not
    yet returned by the server (its ``id`` then survives the server's event replacing it).
    """

    id: str
    event_id: str
    sender: str
    origin_server_ts: int
    event_type: str
    body: str | None
    edited: bool = False
    redacted: bool = False
    receipts: tuple[str, ...] = ()
    sender_name: str | None = None
    in_reply_to: InReplyTo | None = None
    reactions: tuple[Reaction, ...] = ()
    thread_summary: ThreadSummary | None = None
    encrypted: bool = False
    decryption: Undecrypted | None = None
    send_state: SendState | None = None
    msgtype: str | None = None
    formatted_body: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryGapItem:
    """A durable gap between two sections (wire variant ``HistoryGap``).

    ``id`` is the ``gap_id`` that ``FillGap`` takes and survives lifecycle
    changes. Both boundaries are events of the room: the newest event of the
    older section and the oldest event of the newer one. ``failure`` is set
    exactly when ``lifecycle`` is ``Failed``.
    """

    id: str
    older_boundary: str
    newer_boundary: str
    lifecycle: GapLifecycle = GapLifecycle.Idle
    failure: str | None = None

    def __post_init__(self) -> None:
        if (self.lifecycle is GapLifecycle.Failed) != (self.failure is not None):
            raise ValueError("HistoryGapItem.failure is set exactly when lifecycle is Failed")


@dataclass(frozen=True, slots=True)
class ReadMarkerItem:
    """The fully-read marker row (wire variant ``ReadMarker``); its id is always ``read-marker``."""

    id: str = READ_MARKER_ID


TimelineItem: TypeAlias = EventItem | HistoryGapItem | ReadMarkerItem


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    """A room member as the member list shows it (``membership`` is ``join``,
    ``invite``, ``leave``, ``ban`` or ``knock``)."""

    user_id: str
    display_name: str | None = None
    membership: str = "join"
