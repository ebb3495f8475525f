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

from gapline.history._types import GapLifecycle
from gapline.matrix import ClientEvent

__all__ = [
    "EventsAdded",
    "GapAdded",
    "GapChanged",
    "GapRecord",
    "GapRemoved",
    "Key",
    "ReceiptsChanged",
    "StoredEvent",
    "Update",
]

Key = tuple[int, int]
"""``(ord, pos)``: where an event sits in its room."""


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """A retained event and its key."""

    ord: int
    pos: int
    event: ClientEvent

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
    oldest first."""

    ord: int
    pos: int
    events: tuple[ClientEvent, ...]


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


Update = EventsAdded | GapAdded | GapChanged | GapRemoved | ReceiptsChanged
