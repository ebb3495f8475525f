"""A room's timeline rows, and the diff builder that reads the cache's updates.

Rows are kept sorted by a key derived from the cache's ``(ord, pos)``: an
event row sits at ``(ord, pos, 1)``, the read marker right after the event it
marks at ``(ord, pos, 2)``, and a gap row before every event of the section it
precedes at ``(newer_ord, -inf, 0)``. The timeline holds a *window*: every
retained row from ``low`` (its oldest loaded event) up. Updates below the
window are skipped; scrolling back loads them from the store.

Applying updates is idempotent (an event already shown is not shown twice, a
gap already removed is not removed twice), because a read of older rows may
see a commit whose updates are still queued.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Awaitable, Callable, Iterable, Sequence

from gapline.history._cache_store import Window
from gapline.history._types import (
    Append,
    Event,
    EventItem,
    HistoryGapItem,
    Insert,
    ReadMarkerItem,
    Remove,
    Set,
    TimelineChanged,
    TimelineItem,
    TimelineReset,
    TimelineState,
    VectorDiff,
)
from gapline.history._updates import (
    EventsAdded,
    GapAdded,
    GapChanged,
    GapRecord,
    GapRemoved,
    Key,
    ReceiptsChanged,
    StoredEvent,
    Update,
)
from gapline.matrix import ClientEvent

__all__ = ["Timeline", "event_item", "gap_item"]

_GAP_POS = -(2**62)
RowKey = tuple[int, int, int]


def event_item(event: ClientEvent, receipts: Iterable[str] = ()) -> EventItem:
    body = event.content.get("body")
    # Edited: the server aggregated a replacement onto this event.
    relations = event.unsigned.get("m.relations")
    replaced = isinstance(relations, dict) and "m.replace" in relations
    return EventItem(
        id=event.event_id,
        event_id=event.event_id,
        sender=event.sender,
        origin_server_ts=event.origin_server_ts,
        event_type=event.type,
        body=body if isinstance(body, str) else None,
        edited=replaced,
        redacted=event.redacted_because is not None,
        receipts=tuple(sorted(receipts)),
    )


def gap_item(gap: GapRecord) -> HistoryGapItem:
    return HistoryGapItem(
        id=gap.gap_id,
        older_boundary=gap.older_boundary or "",
        newer_boundary=gap.newer_boundary,
        lifecycle=gap.lifecycle,
        failure=gap.failure,
    )


class Timeline:
    """One open room's rows (``state.items``, oldest first) and its queue of updates.

    The cache queues each committed batch of updates with :meth:`queue`;
    :meth:`flush_history` applies everything queued, without replacing the
    timeline, and publishes the diffs as one ``TimelineChanged``.
    """

    def __init__(self, room_id: str, publish: Callable[[Event], Awaitable[None]]) -> None:
        self.room_id = room_id
        self._publish = publish
        self._keys: list[RowKey] = []
        self._items: list[TimelineItem] = []
        self._pending: list[Update] = []
        self._lock = asyncio.Lock()
        self._low: Key | None = None  # oldest loaded event; None: none loaded
        self.complete_below = True  # the window holds the room's oldest retained event
        self._receipts: dict[str, str] = {}  # user -> event id
        self._fully_read: str | None = None
        self._event_keys: dict[str, RowKey] = {}
        self.closed = False
        self._ready = False  # until the reset is built, queued updates wait

    # -- reading ---------------------------------------------------------------------------

    @property
    def state(self) -> TimelineState:
        return TimelineState(tuple(self._items))

    @property
    def low(self) -> Key | None:
        return self._low

    def has_events(self) -> bool:
        return bool(self._event_keys)

    # -- loading ---------------------------------------------------------------------------

    def reset(self, window: Window, limit: int) -> TimelineReset:
        """Fill from the store's newest window; the event to publish as the room opens."""
        self._ready = True
        self._receipts = dict(window.receipts)
        self._fully_read = window.fully_read
        self._keys.clear()
        self._items.clear()
        self._event_keys.clear()
        self.complete_below = len(window.events) < limit
        self._low = window.events[0].key if window.events else None
        for key, item in self._rows(window.events, window.gaps):
            self._keys.append(key)
            self._items.append(item)
        return TimelineReset(self.room_id, tuple(self._items))

    def _rows(
        self, events: Sequence[StoredEvent], gaps: Sequence[GapRecord]
    ) -> list[tuple[RowKey, TimelineItem]]:
        by_event: dict[str, list[str]] = {}
        for user, event_id in self._receipts.items():
            by_event.setdefault(event_id, []).append(user)
        rows: list[tuple[RowKey, TimelineItem]] = []
        for stored in events:
            key = (stored.ord, stored.pos, 1)
            self._event_keys[stored.event_id] = key
            rows.append((key, event_item(stored.event, by_event.get(stored.event_id, ()))))
            if stored.event_id == self._fully_read:
                rows.append(((stored.ord, stored.pos, 2), ReadMarkerItem()))
        for gap in gaps:
            if not gap.is_top:
                rows.append(((gap.newer_ord, _GAP_POS, 0), gap_item(gap)))
        rows.sort(key=lambda row: row[0])
        return rows

    def prepend_window(self, window: Window) -> list[VectorDiff]:
        """Older retained rows read from the store, inserted at the front."""
        diffs: list[VectorDiff] = []
        if not window.events:
            return diffs
        rows = [row for row in self._rows(window.events, window.gaps) if not self._contains(row[0])]
        for key, item in rows:
            diffs.append(self._insert(key, item))
        if self._low is None or window.events[0].key < self._low:
            self._low = window.events[0].key
        return diffs

    # -- the diff builder ------------------------------------------------------------------

    def queue(self, updates: Sequence[Update]) -> None:
        """Called by the cache, in commit order, with what a transaction committed."""
        if not self.closed:
            self._pending.extend(updates)

    async def flush_history(self) -> None:
        """Apply what the cache queued (never a reset) and publish it as one ``TimelineChanged``.

        Cancelling the caller does not cut a flush in half: diffs applied here
        are always published, or readers would fall out of line.
        """
        task = asyncio.create_task(self._flush())  # owned: awaited on every path below
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            await task
            raise

    async def _flush(self) -> None:
        async with self._lock:
            if self.closed or not self._ready or not self._pending:
                return
            pending, self._pending = self._pending, []
            diffs: list[VectorDiff] = []
            for update in pending:
                diffs.extend(self._apply(update))
            if diffs:
                await self._publish(TimelineChanged(self.room_id, tuple(diffs)))

    async def publish_diffs(self, diffs: Sequence[VectorDiff]) -> None:
        async with self._lock:
            if diffs and not self.closed:
                await self._publish(TimelineChanged(self.room_id, tuple(diffs)))

    async def close(self, last: Callable[[], Awaitable[None]]) -> None:
        """Stop publishing; ``last`` (the room's ``Idle``) is the final event for the room."""
        async with self._lock:
            self.closed = True
            self._pending.clear()
            await last()

    def _visible(self, key: Key) -> bool:
        return self.complete_below or (self._low is not None and key >= self._low)

    def _contains(self, key: RowKey) -> bool:
        i = bisect.bisect_left(self._keys, key)
        return i < len(self._keys) and self._keys[i] == key

    def _insert(self, key: RowKey, item: TimelineItem) -> VectorDiff:
        i = bisect.bisect_left(self._keys, key)
        self._keys.insert(i, key)
        self._items.insert(i, item)
        return Insert(i, item)

    def _remove(self, key: RowKey) -> VectorDiff | None:
        i = bisect.bisect_left(self._keys, key)
        if i < len(self._keys) and self._keys[i] == key:
            del self._keys[i]
            del self._items[i]
            return Remove(i)
        return None

    def _set(self, key: RowKey, item: TimelineItem) -> VectorDiff | None:
        i = bisect.bisect_left(self._keys, key)
        if i < len(self._keys) and self._keys[i] == key:
            if self._items[i] == item:
                return None
            self._items[i] = item
            return Set(i, item)
        return None

    def _apply(self, update: Update) -> list[VectorDiff]:
        out: list[VectorDiff] = []
        match update:
            case EventsAdded(ord=ord_, pos=pos, events=events):
                by_event: dict[str, list[str]] = {}
                for user, event_id in self._receipts.items():
                    by_event.setdefault(event_id, []).append(user)
                appended: list[TimelineItem] = []
                for i, event in enumerate(events):
                    key = (ord_, pos + i, 1)
                    if not self._visible(key[:2]) or self._contains(key):
                        continue
                    item = event_item(event, by_event.get(event.event_id, ()))
                    self._event_keys[event.event_id] = key
                    rows = [(key, item)]
                    if event.event_id == self._fully_read:
                        rows.append(((ord_, pos + i, 2), ReadMarkerItem()))
                    for row_key, row in rows:
                        if not self._keys or row_key > self._keys[-1]:
                            # Appends at the end batch into one diff.
                            self._keys.append(row_key)
                            self._items.append(row)
                            appended.append(row)
                            continue
                        if appended:
                            out.append(Append(tuple(appended)))
                            appended = []
                        out.append(self._insert(row_key, row))
                    if self._low is None or key[:2] < self._low:
                        self._low = key[:2]
                if appended:
                    out.append(Append(tuple(appended)))
            case GapAdded(gap=gap) | GapChanged(gap=gap):
                if gap.is_top:
                    return out
                key = (gap.newer_ord, _GAP_POS, 0)
                item = gap_item(gap)
                if self._contains(key):
                    diff = self._set(key, item)
                    if diff is not None:
                        out.append(diff)
                elif self._gap_shown(gap):
                    out.append(self._insert(key, item))
            case GapRemoved(gap=gap):
                diff = self._remove((gap.newer_ord, _GAP_POS, 0))
                if diff is not None:
                    out.append(diff)
            case ReceiptsChanged(receipts=receipts, fully_read=fully_read):
                out.extend(self._move_receipts(dict(receipts), fully_read))
        return out

    def _gap_shown(self, gap: GapRecord) -> bool:
        """A gap row needs a loaded event on each side (never the top row)."""
        if gap.older_ord is None or not self._keys:
            return False
        older = self._event_keys.get(gap.older_boundary or "")
        return older is not None

    def _move_receipts(self, receipts: dict[str, str], fully_read: str | None) -> list[VectorDiff]:
        out: list[VectorDiff] = []
        touched = {
            event_id
            for user in set(receipts) | set(self._receipts)
            for event_id in (receipts.get(user), self._receipts.get(user))
            if event_id is not None and receipts.get(user) != self._receipts.get(user)
        }
        self._receipts = receipts
        by_event: dict[str, list[str]] = {}
        for user, event_id in receipts.items():
            by_event.setdefault(event_id, []).append(user)
        for event_id in sorted(touched):
            key = self._event_keys.get(event_id)
            if key is None:
                continue
            i = bisect.bisect_left(self._keys, key)
            if i < len(self._keys) and self._keys[i] == key:
                item = self._items[i]
                assert isinstance(item, EventItem)
                new = EventItem(
                    id=item.id,
                    event_id=item.event_id,
                    sender=item.sender,
                    origin_server_ts=item.origin_server_ts,
                    event_type=item.event_type,
                    body=item.body,
                    edited=item.edited,
                    redacted=item.redacted,
                    receipts=tuple(sorted(by_event.get(event_id, ()))),
                )
                diff = self._set(key, new)
                if diff is not None:
                    out.append(diff)
        if fully_read is not None and fully_read != self._fully_read:
            old = self._event_keys.get(self._fully_read or "")
            if old is not None:
                diff = self._remove((old[0], old[1], 2))
                if diff is not None:
                    out.append(diff)
            self._fully_read = fully_read
            new_key = self._event_keys.get(fully_read)
            if new_key is not None:
                out.append(self._insert((new_key[0], new_key[1], 2), ReadMarkerItem()))
        return out
