"""The event cache's read operations: windows of rows, gaps, members, single events.

A mixin of :class:`~gapline.history._cache_store.CacheStore` (which holds the
codec, the reads inside a transaction, and the writer). Each operation here
schedules one read on the backend. A room's window reads each row's aggregate
from the row itself (the copy the writer keeps); a thread's window joins its
room's aggregates by primary key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gapline.history._aggregates import Aggregate
from gapline.history._echoes import echo_placed
from gapline.history._items import EventItem
from gapline.history._rows import RowReader
from gapline.history._updates import EchoPlaced, GapRecord, Key, MemberRecord, Room, StoredEvent
from gapline.storage import Tx

if TYPE_CHECKING:
    from gapline.history._cache_store import CacheStore

__all__ = ["CacheReads", "Window", "split_timeline_key", "thread_key"]

_THREAD = "\x00thread\x00"


def thread_key(room_id: str, thread_root: str) -> str:
    """The name a thread's timeline has in the tables (never a valid room id)."""
    return f"{room_id}{_THREAD}{thread_root}"


def split_timeline_key(key: str) -> tuple[str, str | None]:
    """``(room_id, thread_root)`` of a timeline's name (``None``: the room's own)."""
    room_id, _, root = key.partition(_THREAD)
    return room_id, root or None


@dataclass(frozen=True, slots=True)
class Window:
    """What opening a room reads: the newest events, the gaps between them, receipts."""

    events: list[StoredEvent]
    gaps: list[GapRecord]
    receipts: dict[str, str] = field(default_factory=dict)
    fully_read: str | None = None
    known: bool = True
    items: list[EventItem] | None = None
    """The events' rows (``None``: render the bare events)."""
    hidden_tail: str | None = None
    """The room's newest event when it is not a row (a reaction, say): a gap opened
    behind it later still has a loaded older side."""
    echoes: list[EchoPlaced] = field(default_factory=list)
    """Messages queued for the timeline and not yet retained: its local echo rows."""


class CacheReads:
    """Read operations of the cache (see the module docstring)."""

    async def sync_token(self: CacheStore) -> str | None:
        def op(tx: Tx) -> str | None:
            row = tx.one("SELECT token FROM history_sync WHERE id = 1")
            return None if row is None else self._open_text(row[0], b"history/sync")

        return await self.backend.read(op)

    def _timeline(
        self: CacheStore, tx: Tx, room_id: str, thread_root: str | None
    ) -> tuple[Room, Room] | None:
        """The tables' room of a timeline (the room's, or a thread's) and its room's."""
        room = self.find_room(tx, room_id)
        if room is None or thread_root is None:
            return None if room is None else (room, room)
        thread = self.find_room(tx, thread_key(room_id, thread_root))
        return None if thread is None else (thread, room)

    # A room's window reads each row's aggregate from the row itself (its copy, kept by
    # the writer); a thread's window joins its room's aggregates by primary key.
    _WINDOW = (
        "SELECT ord, pos, event, body, agg FROM history_event"
        " WHERE room = ? AND shown = 1{after} ORDER BY ord DESC, pos DESC LIMIT ?"
    )
    _THREAD_WINDOW = (
        "SELECT e.ord, e.pos, e.event, e.body, a.value FROM history_event e"
        " LEFT JOIN history_aggregate a ON a.room = ? AND a.target = e.event"
        " WHERE e.room = ? AND e.shown = 1{after} ORDER BY e.ord DESC, e.pos DESC LIMIT ?"
    )

    def _window(
        self: CacheStore, tx: Tx, rooms: tuple[Room, Room], after: Key | None, limit: int
    ) -> tuple[list[StoredEvent], list[EventItem]]:
        room, agg = rooms
        if room == agg:
            text, args = self._WINDOW, [room.rid]
            older = " AND (ord, pos) < (?, ?)"
        else:
            text, args = self._THREAD_WINDOW, [agg.rid, room.rid]
            older = " AND (e.ord, e.pos) < (?, ?)"
        if after is None:
            sql = text.format(after="")
        else:
            sql = text.format(after=older)
            args += [after[0], after[1]]
        args.append(limit)
        rows = list(reversed(tx.all(sql, tuple(args))))
        events = self._rows(room, [r[:4] for r in rows])
        open_aggregate = self.relations.open
        aggregates = {
            stored.event_id: open_aggregate(agg, bytes(r[2]), r[4])
            for stored, r in zip(events, rows, strict=True)
            if r[4] is not None
        }
        return events, RowReader(self, tx, *rooms).items(events, aggregates)

    async def load_window(
        self: CacheStore, room_id: str, limit: int, *, thread_root: str | None = None
    ) -> Window:
        """The newest ``limit`` rows of a room (or thread), the gaps between them, receipts.

        One index range scan backwards over ``(room, ord, pos)``, skipping the
        events that are not rows; cost is independent of how much the room
        retains.
        """

        def op(tx: Tx) -> Window:
            rooms = self._timeline(tx, room_id, thread_root)
            if rooms is None:
                known = thread_root is not None and self.find_room(tx, room_id) is not None
                echoes = self._echoes(tx, room_id, thread_root)
                return Window([], [], known=known or bool(echoes), items=[], echoes=echoes)
            room = rooms[0]
            events, items = self._window(tx, rooms, None, limit)
            gaps = self.gaps_between(tx, room, events[0].ord, events[-1].ord) if events else []
            receipts, fully_read = self.receipts(tx, rooms[1])
            newest = tx.one(
                "SELECT event, body, shown FROM history_event WHERE room = ?"
                " ORDER BY ord DESC, pos DESC LIMIT 1",
                (room.rid,),
            )
            hidden_tail = None
            if newest is not None and not newest[2]:
                hidden_tail = self._open_event(room, newest[0], newest[1]).event_id
            return Window(
                events,
                gaps,
                receipts,
                fully_read,
                items=items,
                hidden_tail=hidden_tail,
                echoes=self._echoes(tx, room_id, thread_root),
            )

        return await self.backend.read(op)

    def _echoes(
        self: CacheStore, tx: Tx, room_id: str, thread_root: str | None
    ) -> list[EchoPlaced]:
        return [echo_placed(q, self.me) for q in self.sends.of_room(tx, room_id, thread_root)]

    async def load_older(
        self: CacheStore, room_id: str, before: Key, limit: int, *, thread_root: str | None = None
    ) -> Window:
        """Up to ``limit`` rows older than ``before`` and the gaps that then sit
        between loaded rows (including the one right above ``before``' section head)."""

        def op(tx: Tx) -> Window:
            rooms = self._timeline(tx, room_id, thread_root)
            if rooms is None:
                return Window([], [], items=[])
            room = rooms[0]
            events, items = self._window(tx, rooms, before, limit)
            gaps = self.gaps_between(tx, room, events[0].ord, before[0]) if events else []
            return Window(events, gaps, items=items)

        return await self.backend.read(op)

    def room_ids(self: CacheStore, tx: Tx) -> list[str]:
        """Every room (and thread timeline) the store has seen, by name."""
        rows = tx.all("SELECT room, room_id FROM history_room ORDER BY rid")
        return [self.cipher.decrypt(bytes(v), bytes(k)).decode() for k, v in rows]

    def events_after(
        self: CacheStore, tx: Tx, room: Room, after: Key | None, limit: int
    ) -> list[StoredEvent]:
        """Up to ``limit`` events (shown or not) after ``after``, oldest first."""
        if after is None:
            rows = tx.all(
                "SELECT ord, pos, event, body FROM history_event WHERE room = ?"
                " ORDER BY ord, pos LIMIT ?",
                (room.rid, limit),
            )
        else:
            rows = tx.all(
                "SELECT ord, pos, event, body FROM history_event WHERE room = ?"
                " AND (ord, pos) > (?, ?) ORDER BY ord, pos LIMIT ?",
                (room.rid, after[0], after[1], limit),
            )
        return self._rows(room, rows)

    async def room_is_known(self: CacheStore, room_id: str) -> bool:
        return await self.backend.read(lambda tx: self.find_room(tx, room_id) is not None)

    async def gap(
        self: CacheStore, room_id: str, gap_id: str, *, thread_root: str | None = None
    ) -> GapRecord | None:
        room = self._rooms.get(room_id if thread_root is None else thread_key(room_id, thread_root))
        if room is not None:
            known = self.known_gap(room, gap_id)
            if known is not None:
                return known

        def op(tx: Tx) -> GapRecord | None:
            rooms = self._timeline(tx, room_id, thread_root)
            return None if rooms is None else self.gap_by_id(tx, rooms[0], gap_id)

        return await self.backend.read(op)

    async def top_gap(
        self: CacheStore, room_id: str, *, thread_root: str | None = None
    ) -> GapRecord | None:
        def op(tx: Tx) -> GapRecord | None:
            rooms = self._timeline(tx, room_id, thread_root)
            low = None if rooms is None else self.min_ord(tx, rooms[0])
            if rooms is None or low is None:
                return None
            return self.gap_before(tx, rooms[0], low)

        return await self.backend.read(op)

    async def members(self: CacheStore, room_id: str) -> list[MemberRecord]:
        """The room's present members (joined or invited), by user id."""

        def op(tx: Tx) -> list[MemberRecord]:
            room = self.find_room(tx, room_id)
            return [] if room is None else self.relations.all_members(tx, room)

        return await self.backend.read(op)

    async def aggregate(self: CacheStore, room_id: str, event_id: str) -> Aggregate | None:
        """What the cache holds about ``event_id`` from its relations (tests, tools, sending)."""

        def op(tx: Tx) -> Aggregate | None:
            room = self.find_room(tx, room_id)
            if room is None:
                return None
            return self.relations.aggregates(tx, room, [event_id]).get(event_id)

        return await self.backend.read(op)

    async def event(self: CacheStore, room_id: str, event_id: str) -> StoredEvent | None:
        """A retained event of the room's timeline (shown or not), if it is retained."""

        def op(tx: Tx) -> StoredEvent | None:
            room = self.find_room(tx, room_id)
            return None if room is None else self.retained(tx, room, [event_id]).get(event_id)

        return await self.backend.read(op)

    async def all_events(
        self: CacheStore, room_id: str, limit: int = 1_000_000, *, thread_root: str | None = None
    ) -> list[StoredEvent]:
        """Every retained event of a room (or thread), oldest first (tests and tools; bounded)."""

        def op(tx: Tx) -> list[StoredEvent]:
            rooms = self._timeline(tx, room_id, thread_root)
            room = None if rooms is None else rooms[0]
            if room is None:
                return []
            rows = tx.all(
                "SELECT ord, pos, event, body FROM history_event WHERE room = ?"
                " ORDER BY ord, pos LIMIT ?",
                (room.rid, limit),
            )
            return self._rows(room, rows)

        return await self.backend.read(op)

    async def all_gaps(self: CacheStore, room_id: str, limit: int = 10_000) -> list[GapRecord]:
        """Every gap of a room (the top one included), oldest first (tests and tools)."""

        def op(tx: Tx) -> list[GapRecord]:
            room = self.find_room(tx, room_id)
            if room is None:
                return []
            rows = tx.all(
                f"SELECT {self._GAP_COLS} FROM history_gap WHERE room = ?"
                " ORDER BY newer_ord LIMIT ?",
                (room.rid, limit),
            )
            return [self._gap(room, row) for row in rows]

        return await self.backend.read(op)
