"""The updates a room's sections and gaps go through, and the records they carry.

After matrix-rust-sdk's linked-chunk ``Update``: every change to a room's
history is one of these values, emitted by exactly one function
(:meth:`gapline.history._sections.Sections._emit`). Two readers consume the
*same* list: the store writer applies it inside the write transaction, and the
timeline turns it into ``VectorDiff``\\ s once the transaction committed. So a
``TimelineChanged`` cannot say anything the cache did not commit.

Positions: a room's events are ordered by ``(ord, pos)``. ``ord`` numbers the
room's sections (a new, newer section takes ``max + 1``); ``pos`` orders events
inside one section and goes negative when a section grows backwards (a fill or
a back-pagination prepends). Nothing is ever renumbered, so an event keeps its
key (and its timeline row its id) for as long as it is retained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from gapline.history._aggregates import Aggregate
from gapline.history._items import EventItem, GapLifecycle
from gapline.matrix import ClientEvent

__all__ = [
    "AggregateChanged",
    "DetachedStored",
    "EchoPlaced",
    "EchoRemoved",
    "EchoSettled",
    "EventRewritten",
    "EventsAdded",
    "GapAdded",
    "GapChanged",
    "GapRecord",
    "GapRemoved",
    "Key",
    "MemberRecord",
    "MembersUpdated",
    "ReceiptsChanged",
    "RelationIndexed",
    "Room",
    "RowChanged",
    "RowsHealed",
    "RowsHidden",
    "StoredEvent",
    "Update",
]


class Room(NamedTuple):
    """A timeline as the tables see it: its local number and its keyed hash (for AAD).

    A room's main timeline and each of its threads' timelines are such a
    "room" of the tables, each with its own sections and gaps."""

    rid: int
    key: bytes


Key = tuple[int, int]
"""``(ord, pos)``: where an event sits in its room."""


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """A retained event and its key."""

    ord: int
    pos: int
    event: ClientEvent
    sender_name: str | None = None

    @property
    def key(self) -> Key:
        return (self.ord, self.pos)

    @property
    def event_id(self) -> str:
        return self.event.event_id


@dataclass(frozen=True, slots=True)
class GapRecord:
    """A durable gap: the interval before section ``newer_ord`` that is not retained.

    ``older_ord`` is ``None`` for the *top* of the room (history older than
    the oldest retained event): it is stored so its cursor is never dropped,
    but it is never shown as a row. ``cursor`` paginates backwards from the
    newer boundary; ``None`` when none is known.
    """

    gap_id: str
    newer_ord: int
    older_ord: int | None
    older_boundary: str | None
    newer_boundary: str
    cursor: str | None
    lifecycle: GapLifecycle = GapLifecycle.Idle
    failure: str | None = None

    @property
    def is_top(self) -> bool:
        return self.older_ord is None


@dataclass(frozen=True, slots=True)
class EventsAdded:
    """Events placed at consecutive positions ``pos, pos+1, ...`` of section ``ord``,
    oldest first.

    ``items`` are their rows as the relation rules made them (``None`` until
    ``Sections`` admitted them; a reader given none renders the bare events),
    ``shown`` which of them are rows of this timeline (an edit, a reaction, a
    redaction or a thread reply is kept for continuity but is not a row of the
    room). ``events`` are as stored: one the cache holds a redaction for is
    stored without its content.
    """

    ord: int
    pos: int
    events: tuple[ClientEvent, ...]
    items: tuple[EventItem, ...] | None = None
    shown: tuple[bool, ...] | None = None
    aggregates: tuple[Aggregate | None, ...] | None = None
    """What relations made of each event when it arrived (stored with the room's rows)."""


@dataclass(frozen=True, slots=True)
class GapAdded:
    gap: GapRecord


@dataclass(frozen=True, slots=True)
class GapChanged:
    """Boundary, cursor or lifecycle of an existing gap changed (the id stays)."""

    gap: GapRecord


@dataclass(frozen=True, slots=True)
class GapRemoved:
    """Continuity was proven: the gap is gone for good."""

    gap: GapRecord


@dataclass(frozen=True, slots=True)
class ReceiptsChanged:
    """Read receipts (user -> event id) or the fully-read marker moved."""

    receipts: tuple[tuple[str, str], ...]
    fully_read: str | None


@dataclass(frozen=True, slots=True)
class RowChanged:
    """An event already retained shows differently now (edited, redacted, reacted to, its
    thread grew): wherever its row is loaded, in the room or in a thread, it becomes
    ``item``; replies quoting it quote the new text."""

    item: EventItem


@dataclass(frozen=True, slots=True)
class RowsHealed:
    """Retained events that decrypted now and show as their plaintext alone (nothing
    relates to them, they relate to nothing, so each row is ``render(event)`` with the
    sender's name): ``RowChanged`` for each, rendered where it is applied and only for
    the rows a timeline holds or quotes. A heal is thousands of rows and an open
    window a few hundred; rendering all of them in the write cost a third of it.

    It reaches a timeline exactly as those ``RowChanged`` would (in commit order, to
    the room's and its threads' open timelines), and a row is rendered against what
    the timeline holds when it is applied, as theirs were."""

    rows: tuple[tuple[ClientEvent, str | None], ...]


@dataclass(frozen=True, slots=True)
class AggregateChanged:
    """What the cache holds about events from their relations (stored; not rows), as
    ``(target, aggregate, on_row)``: ``on_row`` says the retained event's row still needs
    the copy (an event placed in the same batch got it with its row)."""

    entries: tuple[tuple[str, Aggregate, bool], ...]


@dataclass(frozen=True, slots=True)
class EventRewritten:
    """A retained event is stored again as ``event`` (a redaction purged its content);
    ``room`` is the timeline holding it when it is not the one being changed (a
    thread's copy of a thread reply)."""

    key: Key
    event: ClientEvent
    sender_name: str | None
    room: Room | None = None


@dataclass(frozen=True, slots=True)
class RowsHidden:
    """Retained events that are not rows after all (an upgrade classified them: edits,
    reactions, redactions, thread replies retained before the relation rules existed)."""

    keys: tuple[Key, ...]


@dataclass(frozen=True, slots=True)
class RelationIndexed:
    """Relation events seen, by (event id, target id, kind): each takes effect once."""

    entries: tuple[tuple[str, str, str], ...]


class MemberRecord(NamedTuple):
    user_id: str
    display_name: str | None
    membership: str


@dataclass(frozen=True, slots=True)
class MembersUpdated:
    """The room's current member state changed for these members."""

    members: tuple[MemberRecord, ...]


@dataclass(frozen=True, slots=True)
class DetachedStored:
    """An event fetched on its own (a replied-to event, with ``/context``) was stored, or
    the server would not return it (``item`` ``None``): replies quoting it can say so."""

    event_id: str
    event: ClientEvent | None
    item: EventItem | None


@dataclass(frozen=True, slots=True)
class EchoPlaced:
    """A local echo (a queued message) is shown as ``item``, or shows differently now
    (acknowledged, failed, retried). ``seq`` is its place in the send queue: echo rows
    sit after every event of the timeline, in queue order."""

    seq: int
    txn_id: str
    item: EventItem


@dataclass(frozen=True, slots=True)
class EchoRemoved:
    """A local echo was cancelled: its row goes."""

    txn_id: str


@dataclass(frozen=True, slots=True)
class EchoSettled:
    """The room retained the server's event for a queued message (``event_id`` when the
    sync matched it by our transaction id): the echo row has become that event, or goes
    if the event is not a row here."""

    txn_id: str
    event_id: str | None = None


Update = (
    EventsAdded
    | GapAdded
    | GapChanged
    | GapRemoved
    | ReceiptsChanged
    | RowChanged
    | RowsHealed
    | AggregateChanged
    | EventRewritten
    | RelationIndexed
    | RowsHidden
    | MembersUpdated
    | DetachedStored
    | EchoPlaced
    | EchoRemoved
    | EchoSettled
)
