"""A room's (or thread's) timeline rows, and the diff builder that reads the cache's updates.

Rows are kept sorted by a key derived from the cache's ``(ord, pos)``: an
event row sits at ``(ord, pos, 1)``, the read marker right after the event it
marks at ``(ord, pos, 2)``, and a gap row before every event of the section it
precedes at ``(newer_ord, -inf, 0)``. The timeline holds a *window*: the rows
from ``low`` (its oldest loaded row) up to ``high`` (its newest; ``None``
while the window reaches the live end). Updates outside the window are
skipped; scrolling loads them from the store.

The window is bounded (``EngineConfig.timeline_window``): loading older rows
past the bound drops rows at the newest end, by ``Remove`` diffs, and the
window no longer follows the live end. :meth:`Timeline.reload` (a
``ShrinkTimeline``, or returning to the live end) replaces the rows with the
newest window as exactly one ``Reset`` diff; row ids do not change.

Rows come from the cache's updates: ``EventsAdded`` carries the rows the
relation rules made, ``RowChanged`` a retained event's new row (an edit, a
redaction, a reaction, a thread reply), wherever it is loaded. A reply's
quote follows the quoted row. Applying updates is idempotent (an event
already shown is not shown twice, a gap already removed is not removed
twice), because a read of older rows may see a commit whose updates are
still queued.

Local echoes (messages in the send queue) sit after every event at
``(ECHO_ORD, seq, 1)`` (``_timeline_echoes``); receipts are in
``_timeline_receipts``, the rows quoting each event in ``_timeline_quotes``, and
the sorted rows with the edits that return their diffs in ``_timeline_rows``.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from msgspec.structs import replace

from gapline.history._cache_store import Window
from gapline.history._echoes import ECHO_ORD
from gapline.history._items import EventItem, InReplyTo, Member
from gapline.history._render import preview_of, render, reply_preview
from gapline.history._timeline_parts import RowKey, bare_rows, better_quote, event_of, gap_item
from gapline.history._timeline_receipts import RowReceipts, with_receipts
from gapline.history._timeline_rows import SortedRows
from gapline.history._types import (
    Append,
    Event,
    Insert,
    MembersChanged,
    ReadMarkerItem,
    Remove,
    Reset,
    Set,
    TimelineChanged,
    TimelineItem,
    TimelineReset,
    TimelineState,
    VectorDiff,
)
from gapline.history._updates import (
    DetachedStored,
    EchoPlaced,
    EchoRemoved,
    EchoSettled,
    EventsAdded,
    GapAdded,
    GapChanged,
    GapRecord,
    GapRemoved,
    Key,
    MembersUpdated,
    ReceiptsChanged,
    RowChanged,
    RowsHealed,
    Update,
)
from gapline.matrix import ClientEvent

__all__ = ["Timeline", "gap_item"]

_GAP_POS = -(2**62)


class Timeline(SortedRows):
    """One open room's (or thread's) rows, oldest first, and its queue of updates.

    The cache queues each committed batch of updates with :meth:`queue`;
    :meth:`flush_history` applies everything queued, without replacing the
    timeline, and publishes the diffs as one ``TimelineChanged``.
    """

    def __init__(
        self,
        room_id: str,
        publish: Callable[[Event], Awaitable[None]],
        *,
        thread_root: str | None = None,
        max_rows: int = 3000,
        on_quotes: Callable[[set[str]], None] | None = None,
    ) -> None:
        super().__init__()
        self.room_id = room_id
        self.thread_root = thread_root
        self.max_rows = max_rows
        self._publish = publish
        self._on_quotes = on_quotes
        self._pending: list[Update] = []
        self._lock = asyncio.Lock()
        self._low: Key | None = None  # oldest loaded row; None: none loaded
        self._high: Key | None = None  # newest loaded row when detached from the live end
        self.complete_below = True  # the window holds the room's oldest retained event
        self._receipts = RowReceipts()
        # Recent events that are not rows (reactions, edits...): a gap opened behind one
        # of them still has its older side loaded. Bounded: only the newest matter.
        self._hidden: deque[str] = deque(maxlen=64)
        self.closed = False
        self._ready = False  # until the reset is built, queued updates wait

    # -- reading ---------------------------------------------------------------------------

    @property
    def state(self) -> TimelineState:
        return TimelineState(tuple(self._items))

    @property
    def low(self) -> Key | None:
        return self._low

    @property
    def at_live_end(self) -> bool:
        """Whether the window follows the live end (new events append)."""
        return self._high is None

    def has_events(self) -> bool:
        return bool(self._event_keys)

    def pending_quotes(self) -> set[str]:
        """Event ids quoted by loaded rows that the cache does not hold yet."""
        return self._quoting.pending(self._item_at)

    # -- loading ---------------------------------------------------------------------------

    def reset(self, window: Window, limit: int) -> TimelineReset:
        """Fill from the store's newest window; the event to publish as it opens."""
        self._ready = True
        self._fill(window, limit)
        return TimelineReset(self.room_id, tuple(self._items), self.thread_root)

    def _fill(self, window: Window, limit: int) -> None:
        self._receipts.load(window.receipts, window.fully_read)
        self._keys.clear()
        self._items.clear()
        self._event_keys.clear()
        self._quoting.clear()
        self._hidden.clear()
        self._echoes.clear()
        if window.hidden_tail is not None:
            self._hidden.append(window.hidden_tail)
        self._high = None
        self.complete_below = len(window.events) < limit
        self._low = window.events[0].key if window.events else None
        for key, item in self._rows(window):
            self._keys.append(key)
            self._items.append(item)

    async def reload(self, read: Callable[[], Awaitable[Window]], limit: int) -> None:
        """Replace the rows with the newest window, published as exactly one ``Reset``.

        Updates queued before the read began are already in what it reads; the
        ones queued after it are applied afterwards (idempotently).
        """
        async with self._lock:
            if self.closed:
                return
            seen = len(self._pending)
            window = await read()
            del self._pending[:seen]
            self._fill(window, limit)
            await self._publish(
                TimelineChanged(self.room_id, (Reset(tuple(self._items)),), self.thread_root)
            )
        self.note_quotes()

    def _rows(self, window: Window) -> list[tuple[RowKey, TimelineItem]]:
        by_event = self._receipts.readers()
        items = window.items if window.items is not None else bare_rows(window.events)
        rows: list[tuple[RowKey, TimelineItem]] = []
        for stored, item in zip(window.events, items, strict=True):
            key = (stored.ord, stored.pos, 1)
            self._track(key, item)
            rows.append((key, with_receipts(item, by_event)))
            if stored.event_id == self._receipts.fully_read:
                rows.append(((stored.ord, stored.pos, 2), ReadMarkerItem()))
        for gap in window.gaps:
            if not gap.is_top:
                rows.append(((gap.newer_ord, _GAP_POS, 0), gap_item(gap)))
        for echo in window.echoes:
            if echo.txn_id not in self._echoes.settled:
                key = (ECHO_ORD, echo.seq, 1)
                self._echoes.track(key, echo)
                rows.append((key, echo.item))
        rows.sort(key=lambda row: row[0])
        aliased = self._echoes.aliased
        return [(key, aliased(item)) for key, item in rows]

    def _prepend_window(self, window: Window) -> list[VectorDiff]:
        """Older retained rows read from the store, inserted at the front; rows past the
        bound go at the newest end (under the lock: no reload runs meanwhile)."""
        diffs: list[VectorDiff] = []
        if not window.events:
            return diffs
        rows = [row for row in self._rows(window) if not self._contains(row[0])]
        for key, item in rows:
            diffs.append(self._insert(key, item))
        if self._low is None or window.events[0].key < self._low:
            self._low = window.events[0].key
        diffs.extend(self._bound())
        return diffs

    async def prepend_read(self, read: Callable[[Key], Awaitable[Window]]) -> Window | None:
        """Rows older than the oldest loaded one, read and placed at the front under the
        lock (``None``: closed, or none older): an update committed during the read (a heal
        of these rows) is applied to them after, as in ``reload``, not missed before."""
        async with self._lock:
            low = self._low
            if self.closed or self.complete_below or low is None:
                return None
            window = await read(low)
            diffs = self._prepend_window(window)
            if diffs:
                await self._publish(TimelineChanged(self.room_id, tuple(diffs), self.thread_root))
        self.note_quotes()
        return window

    def _bound(self, *, newest: bool = True) -> list[VectorDiff]:
        """Keep at most ``max_rows`` rows.

        Rows that landed at the front (scrolling back) push rows out at the newest
        end: the window leaves the live end, and updates newer than its newest row
        are not shown until it reloads. Rows that landed at the end (the live end
        moving on) push rows out at the oldest end, as scrolling back would load
        them again; the top of a window is never a gap or marker row.
        """
        diffs: list[VectorDiff] = []
        if len(self._items) <= self.max_rows:
            return diffs
        if newest:
            while len(self._items) > self.max_rows:
                key = self._keys.pop()
                self._untrack(key, self._items.pop())
                diffs.append(Remove(len(self._items)))
            if self._keys:
                self._high = self._keys[-1][:2]
            return diffs
        while self._items and (
            len(self._items) > self.max_rows or not isinstance(self._items[0], EventItem)
        ):
            key = self._keys.pop(0)
            self._untrack(key, self._items.pop(0))
            diffs.append(Remove(0))
        self.complete_below = False
        self._low = self._keys[0][:2] if self._keys else None
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
            first = self._keys[0] if self._keys else None
            members: dict[str, Member] = {}
            for update in pending:
                if isinstance(update, MembersUpdated):
                    for record in update.members:
                        members[record.user_id] = Member(
                            user_id=record.user_id,
                            display_name=record.display_name,
                            membership=record.membership,
                        )
                    continue
                diffs.extend(self._apply(update))
            grew_at_front = first is not None and bool(self._keys) and self._keys[0] < first
            diffs.extend(self._bound(newest=grew_at_front))
            if diffs:
                await self._publish(TimelineChanged(self.room_id, tuple(diffs), self.thread_root))
            if members and self.thread_root is None:
                ordered = tuple(members[u] for u in sorted(members))
                await self._publish(MembersChanged(self.room_id, ordered))
        self.note_quotes()

    def note_quotes(self) -> None:
        if self._on_quotes is not None and not self.closed:
            wanted = self.pending_quotes()
            if wanted:
                self._on_quotes(wanted)

    async def publish_diffs(self, diffs: Sequence[VectorDiff]) -> None:
        async with self._lock:
            if diffs and not self.closed:
                await self._publish(TimelineChanged(self.room_id, tuple(diffs), self.thread_root))
        self.note_quotes()

    async def publish_event(self, event: Event) -> None:
        """Publish a room event in line with the timeline's diffs (typing, members)."""
        async with self._lock:
            if not self.closed:
                await self._publish(event)

    async def close(self, last: Callable[[], Awaitable[None]]) -> None:
        """Stop publishing; ``last`` (the room's ``Idle``) is the final event for the room."""
        async with self._lock:
            self.closed = True
            self._pending.clear()
            await last()

    def _visible(self, key: Key) -> bool:
        if self._high is not None and key > self._high:
            return False
        return self.complete_below or (self._low is not None and key >= self._low)

    def _apply(self, update: Update) -> list[VectorDiff]:
        out: list[VectorDiff] = []
        match update:
            case EventsAdded(ord=ord_, pos=pos, events=events, items=items, shown=shown):
                rows = items if items is not None else [render(e, None) for e in events]
                flags = shown if shown is not None else (True,) * len(events)
                by_event = self._receipts.readers()
                if self._place_run(ord_, pos, rows, flags, by_event, out):
                    return out
                # The loop of every page placed: locals, one bisect per row (the index
                # that says whether the row is loaded is where it goes).
                keys, echoes, quoting = self._keys, self._echoes, self._quoting
                fully_read, high = self._receipts.fully_read, self._high
                for i, item in enumerate(rows):
                    key = (ord_, pos + i, 1)
                    txn = echoes.answered(events[i]) if echoes.keys else None
                    if txn is not None:
                        shown_here = flags[i] and self._visible(key[:2]) and not self._contains(key)
                        placed_item = with_receipts(item, by_event)
                        out.extend(self._settle_echo(txn, key if shown_here else None, placed_item))
                        if shown_here:
                            self._track(key, item)
                            if self._low is None or key[:2] < self._low:
                                self._low = key[:2]
                            out.extend(self._quoted(item))
                            continue
                    at, low = key[:2], self._low
                    visible = (high is None or at <= high) and (
                        self.complete_below or (low is not None and at >= low)
                    )
                    event_id = item.event_id
                    if not flags[i]:
                        if visible:
                            self._hidden.append(event_id)
                        if event_id in quoting:  # a hidden event may still be quoted
                            out.extend(self._quoted(item))
                        continue
                    if not visible:
                        continue
                    j = bisect.bisect_left(keys, key)
                    if j < len(keys) and keys[j] == key:
                        continue
                    self._track(key, item)
                    row = with_receipts(item, by_event)
                    if event_id == fully_read:
                        self._place(((key, row), ((ord_, pos + i, 2), ReadMarkerItem())), out)
                    elif j == len(keys):  # at the end: appended, as one diff
                        keys.append(key)
                        self._items.append(row)
                        out.append(Append((row,)))
                    else:
                        row = echoes.aliased(row)
                        keys.insert(j, key)
                        self._items.insert(j, row)
                        out.append(Insert(j, row))
                    if low is None or at < low:
                        self._low = at
                    if event_id in quoting:
                        out.extend(self._quoted(item))
            case GapAdded(gap=gap) | GapChanged(gap=gap):
                if gap.is_top:
                    return out
                key = (gap.newer_ord, _GAP_POS, 0)
                item = gap_item(gap)
                if self._contains(key):
                    diff = self._set(key, item)
                    if diff is not None:
                        out.append(diff)
                elif self._gap_shown(gap, key):
                    out.append(self._insert(key, item))
            case GapRemoved(gap=gap):
                diff = self._remove((gap.newer_ord, _GAP_POS, 0))
                if diff is not None:
                    out.append(diff)
            case ReceiptsChanged(receipts=receipts, fully_read=fully_read):
                out.extend(self._move_receipts(dict(receipts), fully_read))
            case RowChanged(item=item):
                key = self._event_keys.get(item.event_id)
                if key is not None:
                    current = self._item_at(key)
                    if isinstance(current, EventItem):
                        quote = item.in_reply_to
                        if quote is not None and current.in_reply_to is not None:
                            quote = better_quote(current.in_reply_to, quote)
                        row = item  # as it comes when nothing is to carry over (a heal)
                        if current.receipts != item.receipts or quote is not item.in_reply_to:
                            row = replace(item, receipts=current.receipts, in_reply_to=quote)
                        diff = self._set(key, row)
                        if diff is not None:
                            out.append(diff)
                out.extend(self._quoted(item))
            case RowsHealed(rows=rows):
                out.extend(self._healed(rows))
            case DetachedStored(event_id=event_id, item=item):
                quote = reply_preview(event_id, item, unavailable=item is None)
                out.extend(self._requote(event_id, quote))
            case EchoPlaced(seq=seq, txn_id=txn, item=item):
                if txn in self._echoes.settled:
                    return out
                key = (ECHO_ORD, seq, 1)
                if self._contains(key):
                    self._echoes.forget_event(event_of(self._item_at(key)))
                    diff = self._set(key, item)
                    if diff is not None:
                        out.append(diff)
                    self._echoes.track(key, EchoPlaced(seq, txn, item))
                elif self._visible(key[:2]):
                    out.append(self._insert(key, item))
                    self._echoes.track(key, EchoPlaced(seq, txn, item))
            case EchoRemoved(txn_id=txn) | EchoSettled(txn_id=txn):
                # A settled echo whose event is not a row of this window (a limited sync
                # put it in a gap, it went to a thread) leaves; a cancelled one too.
                if isinstance(update, EchoSettled):
                    self._echoes.settled.add(txn)
                key = self._echoes.keys.get(txn)
                if key is not None:
                    diff = self._remove(key)
                    if diff is not None:
                        out.append(diff)
        return out

    def _place_run(
        self,
        ord_: int,
        pos: int,
        rows: Sequence[EventItem],
        flags: Sequence[bool],
        by_event: dict[str, tuple[str, ...]],
        out: list[VectorDiff],
    ) -> bool:
        """Place a page's rows in one go when they are the simple case the row-by-row loop
        of ``_apply`` would place one after another at consecutive indexes: every row
        shown and in the window, none loaded already, nothing else loaded between them,
        no echo waiting, no fully-read marker and no quote among them. The diffs are the
        ones that loop makes; ``False`` (nothing done) for anything else."""
        if not rows or self._echoes.keys or not all(flags):
            return False
        first, last = (ord_, pos, 1), (ord_, pos + len(rows) - 1, 1)
        if not (self._visible(first[:2]) and self._visible(last[:2])):
            return False
        keys = self._keys
        j = bisect.bisect_left(keys, first)
        if j < len(keys) and keys[j] <= last:
            return False  # a row already loaded, or another row between them
        ids = [item.event_id for item in rows]
        if self._receipts.fully_read in ids or self._quoting.quotes_any(ids):
            return False
        placed = [
            with_receipts(item, by_event) if by_event or item.receipts else item for item in rows
        ]
        run = [(ord_, pos + i, 1) for i in range(len(rows))]
        if j == len(keys):  # at the end: appended, one diff a row
            out.extend(Append((row,)) for row in placed)
        else:
            if self._echoes.aliasing:
                placed = [self._echoes.aliased(row) for row in placed]
            out.extend(Insert(j + i, row) for i, row in enumerate(placed))
        keys[j:j] = run
        self._items[j:j] = placed
        self._event_keys.update(zip(ids, run, strict=True))  # what _track does, for a run
        self._quoting.add_many(run, list(rows))
        if self._low is None or first[:2] < self._low:
            self._low = first[:2]
        return True

    def _healed(self, rows: Sequence[tuple[ClientEvent, str | None]]) -> list[VectorDiff]:
        """``RowChanged`` for the healed events held or quoted here; no other is rendered."""
        out: list[VectorDiff] = []
        held, quoting = self._event_keys, self._quoting
        for event, name in rows:
            if event.event_id in held or event.event_id in quoting:
                out.extend(self._apply(RowChanged(render(event, None, sender_name=name))))
        return out

    def _settle_echo(self, txn: str, key: RowKey | None, item: EventItem) -> list[VectorDiff]:
        """The server's event for an echo row arrived: it takes the row's place and id
        (``key`` ``None``: it is not a row here, and the echo goes)."""
        self._echoes.settled.add(txn)
        old = self._echoes.keys.get(txn)
        i = None if old is None else self._index(old)
        if old is None or i is None:
            return [] if key is None else [self._insert(key, item)]
        echo = self._items[i]
        assert isinstance(echo, EventItem)
        self._untrack(old, echo)
        del self._keys[i]
        del self._items[i]
        if key is None:
            return [Remove(i)]
        self._echoes.alias(item.event_id, echo.id)
        j = bisect.bisect_left(self._keys, key)
        if j == i:
            self._keys.insert(i, key)
            self._items.insert(i, self._echoes.aliased(item))
            return [Set(i, self._items[i])]
        return [Remove(i), self._insert(key, item)]

    def _quoted(self, item: EventItem) -> list[VectorDiff]:
        """Rows quoting ``item`` quote it as it is now."""
        if item.event_id not in self._quoting:
            return []
        return self._requote(item.event_id, preview_of(item))

    def _requote(self, event_id: str, quote: InReplyTo) -> list[VectorDiff]:
        out: list[VectorDiff] = []
        for key in self._quoting.rows_quoting(event_id):
            row = self._item_at(key)
            if isinstance(row, EventItem) and row.in_reply_to is not None:
                diff = self._set(
                    key, replace(row, in_reply_to=better_quote(row.in_reply_to, quote))
                )
                if diff is not None:
                    out.append(diff)
        return out

    def _gap_shown(self, gap: GapRecord, key: RowKey) -> bool:
        """A gap row needs its older side loaded (the top of a window is never a gap row):
        its older boundary is a loaded row, or a recent event that is not a row; and it
        must lie inside the window."""
        if gap.older_ord is None or not self._keys or key < self._keys[0]:
            return False
        older = gap.older_boundary or ""
        if older not in self._event_keys and older not in self._hidden:
            return False
        return self._high is None or key[:2] <= self._high

    def _move_receipts(self, receipts: dict[str, str], fully_read: str | None) -> list[VectorDiff]:
        out: list[VectorDiff] = []
        touched = self._receipts.move(receipts)
        by_event = self._receipts.readers()
        for event_id in touched:
            key = self._event_keys.get(event_id)
            item = None if key is None else self._item_at(key)
            if key is not None and isinstance(item, EventItem):
                diff = self._set(key, with_receipts(item, by_event))
                if diff is not None:
                    out.append(diff)
        if fully_read is not None and fully_read != self._receipts.fully_read:
            old = self._event_keys.get(self._receipts.fully_read or "")
            if old is not None:
                diff = self._remove((old[0], old[1], 2))
                if diff is not None:
                    out.append(diff)
            self._receipts.fully_read = fully_read
            new_key = self._event_keys.get(fully_read)
            if new_key is not None:
                out.append(self._insert((new_key[0], new_key[1], 2), ReadMarkerItem()))
        return out
