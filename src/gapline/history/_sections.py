"""The one place a room's sections and gaps change.

:class:`Sections` runs inside a write transaction. Every change it decides
goes through :meth:`Sections._emit`, which hands the update to the store
writer (same transaction) and records it; once the transaction commits, the
engine gives the recorded list to the room's timeline, which turns it into
diffs. The store and the timeline therefore consume one stream of updates.

Rules held here:

- events are deduplicated by event id; an overlap between a page and retained
  history is the only proof of continuity, and the only way a gap goes away;
- a limited sync always records a gap carrying its ``prev_batch``, whether
  the room has retained events or not (a room with none keeps it as the
  cursor of its *top*), and no path drops a ``prev_batch``;
- a walk backwards (recent load, fill, back-pagination) prepends to the
  section it walks, and each page commits its events together with the gap's
  new cursor;
- a sync's read receipts merge into the retained ones (each user's ``m.read``,
  and this account's own ``m.read.private``, moves to the event it names), and
  the fully-read marker moves with them;
- every batch of events placed passes the relation rules (``_admission``) in
  the same transaction, and is named by the member state as of each event
  (``_members``): forwards for a sync, backwards for a walk;
- a thread's timeline (``thread_root``) is sections and gaps of its own; a
  sync's thread replies extend it only where the room's own history proves
  nothing is missing in between (else they open a section behind a gap).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gapline.history._admission import Admission
from gapline.history._cache_store import CacheStore, thread_key
from gapline.history._members import MemberView
from gapline.history._relations import RelKind, relation_of
from gapline.history._render import render
from gapline.history._types import GapLifecycle
from gapline.history._updates import (
    AggregateChanged,
    DetachedStored,
    EventRewritten,
    EventsAdded,
    GapAdded,
    GapChanged,
    GapRecord,
    GapRemoved,
    Key,
    MembersUpdated,
    ReceiptsChanged,
    RelationIndexed,
    RowChanged,
    RowsHealed,
    RowsHidden,
    StoredEvent,
    Update,
)
from gapline.history._walk_state import PageResult, WalkState
from gapline.matrix import ClientEvent
from gapline.storage import Tx

__all__ = ["Sections", "new_gap_id"]

log = logging.getLogger("gapline.history")

ROOM_CREATE = "m.room.create"


def new_gap_id() -> str:
    return "gap-" + secrets.token_hex(8)


_CONTENT_RELATIONS = (RelKind.REPLACE, RelKind.ANNOTATION)
"""Relations whose effect depends on the (encrypted) content, not only the cleartext."""

_ROOM_LEVEL = (AggregateChanged, RelationIndexed, MembersUpdated, DetachedStored)
"""Updates kept with the room, never with one of its threads' timelines."""


class Sections:
    """A room's (or one of its threads') sections and gaps, changed inside one write
    transaction."""

    def __init__(
        self, store: CacheStore, tx: Tx, room_id: str, *, thread_root: str | None = None
    ) -> None:
        self.store = store
        self.tx = tx
        self.room_id = room_id
        self.thread_root = thread_root
        self.updates: list[Update] = []
        self._keys: dict[str, bytes] = {}  # event id -> hash, computed once per transaction
        self.agg_room = store.note_room(tx, room_id)
        self.room = (
            self.agg_room
            if thread_root is None
            else store.note_room(tx, thread_key(room_id, thread_root))
        )
        self.names: dict[str, str | None] = {}
        """Sender names as of each event of the batch being placed (``_members``)."""
        self.admission = Admission(self)
        self._members: MemberView | None = None

    @property
    def known_keys(self) -> dict[str, bytes]:
        """Event hashes computed in this transaction already."""
        return self._keys

    @property
    def members(self) -> MemberView:
        if self._members is None:
            self._members = MemberView(self.store, self.tx, self.agg_room)
        return self._members

    def _emit(self, update: Update) -> None:
        """The single choke point: write the update, and record it for the timeline.

        Placed events pass the relation rules first; what they change elsewhere
        is emitted right after them, through here as well.
        """
        if isinstance(update, EventsAdded) and update.items is None:
            placed, effects = self.admission.admit(update)
            self._emit(placed)
            for effect in effects:
                self._emit(effect)
            return
        room = self.agg_room if isinstance(update, _ROOM_LEVEL) else self.room
        self.store.write_update(self.tx, room, update, self._key)
        self.updates.append(update)

    def flush_members(self) -> None:
        """Store the member state this transaction moved (and tell the timeline)."""
        if self._members is not None and self._members.changed:
            self._emit(MembersUpdated(tuple(self._members.changed.values())))
            self._members.changed = {}

    def ingest_state(self, events: Sequence[ClientEvent]) -> None:
        """A sync's state block (the room's state just before its timeline)."""
        if any(e.type == "m.room.member" for e in events):
            self.members.apply_state(events)

    def _key(self, event_id: str) -> bytes:
        key = self._keys.get(event_id)
        if key is None:
            key = self._keys[event_id] = self.store.event_key(event_id)
        return key

    def _keys_of(self, events: Sequence[ClientEvent]) -> list[bytes]:
        """The hashes of a batch's ids, computed once and remembered for the writer."""
        ids = [e.event_id for e in events]
        keys = self.store.event_keys(ids)
        self._keys.update(zip(ids, keys, strict=True))
        return keys

    # -- sync ------------------------------------------------------------------------------

    def ingest_sync(
        self, events: Sequence[ClientEvent], *, limited: bool, prev_batch: str | None
    ) -> None:
        """Place one sync's timeline events (oldest first).

        A sync's timeline is contiguous on the server, so events it shares with
        retained history place the new ones: a run of new events goes right
        after the retained event before it in the batch, or right before the
        retained event after it; two neighbours in the batch that sit on either
        side of a gap prove that gap closed. With nothing shared, the new events
        follow the newest retained one (not limited) or open a new section
        behind a history gap carrying ``prev_batch`` (limited).
        """
        store, tx, room = self.store, self.tx, self.room
        if not events:
            # Nothing to anchor a gap to: a gap needs an event on its newer side.
            # The next sync with events records its own prev_batch.
            return
        if self.thread_root is None:
            self.names.update(self.members.forward(events))
        keys = self._keys_of(events)
        where = store.locate(tx, room, keys)
        batch: list[tuple[ClientEvent, bytes]] = []
        seen: set[bytes] = set()
        for event, key in zip(events, keys, strict=True):
            if key not in seen:
                seen.add(key)
                batch.append((event, key))
        shared = [i for i, (_, key) in enumerate(batch) if key in where]
        if not shared:
            self._place_unanchored([e for e, _ in batch], limited=limited, prev_batch=prev_batch)
            return
        first = shared[0]
        anchor = where[batch[first][1]]
        leading = [e for e, _ in batch[:first]]
        self._place_before(anchor, leading, prev_batch)
        previous = anchor
        run: list[ClientEvent] = []
        for event, key in batch[first + 1 :]:
            found = where.get(key)
            if found is None:
                run.append(event)
                continue
            if run:
                previous = self._place_after(previous, run)
                run = []
            self._join_if_adjacent(previous, found)
            previous = found
        if run:
            self._place_after(previous, run)

    def _place_unanchored(
        self, fresh: list[ClientEvent], *, limited: bool, prev_batch: str | None
    ) -> None:
        store, tx, room = self.store, self.tx, self.room
        tail = store.tail(tx, room)
        if tail is None:
            # A room never seen, or with nothing retained: its prev_batch becomes
            # the cursor of the room's top, so paginating back starts there.
            self._emit(EventsAdded(0, 0, tuple(fresh)))
            self._emit(GapAdded(self._top_gap(0, fresh[0].event_id, prev_batch)))
            return
        if not limited:
            # The sync token proves these follow the previous sync's events.
            self._emit(EventsAdded(tail[0], tail[1] + 1, tuple(fresh)))
            return
        # Limited and nothing shared: a new section behind a history gap.
        older = store.event_at(tx, room, tail)
        assert older is not None
        new_ord = tail[0] + 1
        self._emit(EventsAdded(new_ord, 0, tuple(fresh)))
        self._emit(
            GapAdded(
                GapRecord(
                    gap_id=new_gap_id(),
                    newer_ord=new_ord,
                    older_ord=tail[0],
                    older_boundary=older.event_id,
                    newer_boundary=fresh[0].event_id,
                    cursor=prev_batch,
                )
            )
        )

    def _place_before(self, anchor: Key, run: list[ClientEvent], prev_batch: str | None) -> None:
        """New events that precede a retained one in the batch, and the prev_batch that
        walks back from the batch's first event: both belong to the gap below ``anchor``."""
        store, tx, room = self.store, self.tx, self.room
        if store.section_head(tx, room, anchor[0]) != anchor[1]:
            if run:
                log.warning("sync events before a retained event that has a predecessor; skipped")
            return  # what precedes the batch is retained: nothing is unknown there
        gap = store.gap_before(tx, room, anchor[0])
        if gap is None:
            if run:
                log.warning("sync events inside proven-continuous history; skipped")
            return
        if run:
            self._emit(EventsAdded(anchor[0], anchor[1] - len(run), tuple(run)))
        changed = gap
        if run:
            changed = replace(changed, newer_boundary=run[0].event_id)
        # Never drop a prev_batch: it walks back from the batch's first event, which
        # is now this gap's newer boundary.
        if (
            prev_batch is not None
            and (run or changed.cursor is None)
            and changed.lifecycle is not GapLifecycle.Unavailable
        ):
            changed = replace(changed, cursor=prev_batch)
        if changed != gap:
            self._emit(GapChanged(changed))

    def _place_after(self, previous: Key, run: list[ClientEvent]) -> Key:
        """New events that follow a retained one in the batch; returns the last one's key."""
        store, tx, room = self.store, self.tx, self.room
        if store.section_tail(tx, room, previous[0]) != previous[1]:
            log.warning("sync events after a retained event that has a successor; skipped")
            return previous
        self._emit(EventsAdded(previous[0], previous[1] + 1, tuple(run)))
        above = store.gap_before(tx, room, previous[0] + 1)
        if above is not None and above.older_ord == previous[0]:
            self._emit(GapChanged(replace(above, older_boundary=run[-1].event_id)))
        return (previous[0], previous[1] + len(run))

    def _join_if_adjacent(self, older: Key, newer: Key) -> None:
        """Two neighbours of one sync batch on either side of a gap: the gap is closed."""
        store, tx, room = self.store, self.tx, self.room
        if newer[0] != older[0] + 1:
            return
        gap = store.gap_before(tx, room, newer[0])
        if (
            gap is not None
            and gap.older_ord == older[0]
            and store.section_tail(tx, room, older[0]) == older[1]
            and store.section_head(tx, room, newer[0]) == newer[1]
        ):
            self._emit(GapRemoved(gap))

    def _top_gap(self, ord_: int, newer_boundary: str, cursor: str | None) -> GapRecord:
        return GapRecord(
            gap_id=new_gap_id(),
            newer_ord=ord_,
            older_ord=None,
            older_boundary=None,
            newer_boundary=newer_boundary,
            cursor=cursor,
        )

    def set_receipts(self, receipts: dict[str, str], fully_read: str | None) -> None:
        self._emit(ReceiptsChanged(tuple(sorted(receipts.items())), fully_read))

    def mark_read(self, user: str, event_id: str) -> None:
        """This account read up to ``event_id`` (its receipt and the marker move now,
        before the server's echo in a later sync)."""
        stored, marker = self.store.receipts(self.tx, self.room)
        if stored.get(user) != event_id or marker != event_id:
            self.set_receipts({**stored, user: event_id}, event_id)

    def detach(self, event_id: str, event: ClientEvent | None) -> None:
        """Keep an event fetched on its own (``None``: the server would not return it)."""
        item = None
        if event is not None:
            aggregate = self.store.relations.aggregates(self.tx, self.agg_room, [event_id])
            item = render(event, aggregate.get(event_id), me=self.store.me)
        self._emit(DetachedStored(event_id, event, item))

    def reclassify(self, stored: Sequence[StoredEvent]) -> None:
        """Events retained before the relation rules existed (oldest first): they pass
        the rules now, as if they had just arrived; those that are no rows are hidden."""
        if not stored:
            return
        self.admission.placing = False
        placed, effects = self.admission.admit(EventsAdded(0, 0, tuple(s.event for s in stored)))
        self.admission.placing = True
        assert placed.shown is not None
        hidden = tuple(s.key for s, shown in zip(stored, placed.shown, strict=True) if not shown)
        if hidden:
            self._emit(RowsHidden(hidden))
        for before, after in zip(stored, placed.events, strict=True):
            if after is not before.event:
                self._emit(EventRewritten(before.key, after, before.sender_name))
        for effect in effects:
            self._emit(effect)

    def heal(self, stored: Sequence[StoredEvent]) -> None:
        """Retained events that could not be decrypted and now are (oldest first, each
        carrying its plaintext event): stored again, passed through the rules as if they
        had just arrived, and each shown row changed in place (same row id)."""
        if not stored:
            return
        # An edit or a reaction took no effect while its content was unreadable: let it
        # take effect now. A thread reply counted already (its relation is cleartext).
        rels = [relation_of(s.event) for s in stored]
        again = [
            s.event_id
            for s, r in zip(stored, rels, strict=True)
            if r is not None and r.kind in _CONTENT_RELATIONS
        ]
        if again:
            self.store.relations.forget(self.tx, self.agg_room, again, self.known_keys)  # fmt: skip
        self.names.update((s.event_id, s.sender_name) for s in stored if s.sender_name)
        admission = self.admission
        admission.placing, admission.deferred = False, True
        admission.refresh = {s.event_id for s in stored}
        placed, effects = admission.admit(EventsAdded(0, 0, tuple(s.event for s in stored)))
        admission.placing, admission.deferred, admission.refresh = True, False, set()
        assert placed.shown is not None
        # Every row's new body in one statement (not queued: the timeline reads none).
        pairs = zip(stored, placed.events, strict=True)
        rewrites = [EventRewritten(b.key, a, b.sender_name) for b, a in pairs]
        self.store.rewrite_events(self.tx, self.room, rewrites, self._key)
        hidden, copies = [], []
        for before, after, shown, rel in zip(
            stored, placed.events, placed.shown, rels, strict=True
        ):
            if rel is not None:  # a thread reply's own copy (an event with no relation has none)
                admission._rewrite_thread_copy(before, after, copies)
            if not shown:
                hidden.append(before.key)
        # Wherever its row is loaded (room or thread) each row changes: rendered here when
        # the rules had to (relations, quotes), else by the timelines for the rows they hold.
        if placed.items is None:
            names = self.names
            self._emit(RowsHealed(tuple((e, names.get(e.event_id)) for e in placed.events)))
        else:
            for item in placed.items:
                self._emit(RowChanged(item))
        if hidden:
            self._emit(RowsHidden(tuple(hidden)))
        for effect in (*copies, *effects):
            self._emit(effect)

    def extend_threads(self, prev_batch: str | None) -> dict[str, list[Update]]:
        """Carry this sync's thread replies into the timelines of threads already kept.

        A reply follows its thread's newest retained event only when both sit
        in one section of the room's own history (so nothing of the thread is
        missing between them); otherwise it opens a section behind a gap whose
        cursor is the sync's ``prev_batch`` (``/relations`` accepts it).
        """
        out: dict[str, list[Update]] = {}
        store, tx = self.store, self.tx
        for root, replies in self.admission.thread_replies.items():
            key = thread_key(self.room_id, root)
            if store.find_room(tx, key) is None:
                continue  # a thread never opened: its view walks the server when it opens
            thread = Sections(store, tx, self.room_id, thread_root=root)
            thread.names = self.names
            tail = store.tail(tx, thread.room)
            proven = False
            if tail is not None:
                newest = store.event_at(tx, thread.room, tail)
                assert newest is not None
                where = store.locate(
                    tx, self.room, store.event_keys([newest.event_id, replies[0].event_id])
                )
                placed = list(where.values())
                proven = len(placed) == 2 and placed[0][0] == placed[1][0]
            thread.ingest_sync(replies, limited=not proven, prev_batch=prev_batch)
            out[key] = thread.updates
        return out

    def ingest_receipts(
        self, receipts: Mapping[str, Mapping[str, Any]], fully_read: str | None
    ) -> None:
        """Merge one sync's read receipts and fully-read marker into the retained ones.

        ``receipts`` is ``{event_id: {receipt_type: {user_id: ...}}}``; each user's
        ``m.read`` receipt moves to the event it names. Nothing is emitted unless a
        receipt or the marker actually moved.
        """
        if not receipts and fully_read is None:
            return
        stored, stored_marker = self.store.receipts(self.tx, self.room)
        merged = dict(stored)
        me = self.store.me
        for event_id, by_type in receipts.items():
            for kind in ("m.read", "m.read.private"):
                readers = by_type.get(kind)
                for user, receipt in readers.items() if isinstance(readers, dict) else ():
                    thread = receipt.get("thread_id") if isinstance(receipt, dict) else None
                    if thread not in (None, "main"):
                        continue  # a thread's receipt does not move the room's
                    if kind == "m.read" or user == me:
                        merged[user] = event_id
        if merged != stored or (fully_read is not None and fully_read != stored_marker):
            self.set_receipts(merged, fully_read)

    # -- walks backwards -------------------------------------------------------------------

    def walk_page(
        self,
        state: WalkState,
        chunk: Sequence[ClientEvent],
        end: str | None,
        *,
        then: GapLifecycle | None = None,
    ) -> PageResult:
        """Commit one ``/messages?dir=b`` page (newest first) of a backwards walk.

        Events not retained are prepended to the walked section; the walked
        gap's boundary and cursor move with them, in this same transaction.
        A state with a ``gap_id`` and no anchor starts at that gap's newer
        boundary. ``then``: the lifecycle the gap takes if it is still open
        after this page (the page that spends a fill's budget pauses it).
        """
        store, tx, room = self.store, self.tx, self.room
        self.names.update(self.members.backward(chunk))
        keys = self._keys_of(chunk)
        where = store.locate(tx, room, keys)
        anchor = state.anchor
        gap: GapRecord | None = None
        if state.gap_id is not None:
            gap = state.gap  # as the previous page left it, if nothing wrote gaps since
            if (
                gap is None
                or gap.gap_id != state.gap_id
                or store.gap_writes(room) != state.gap_writes
            ):
                gap = store.gap_by_id(tx, room, state.gap_id)
            if gap is None:
                return PageResult(WalkState(anchor), 0, True, False, None)
            if anchor is None:
                head = store.section_head(tx, room, gap.newer_ord)
                assert head is not None
                anchor = (gap.newer_ord, head)
        new_gap = False  # `gap` was created by this page and is not written yet
        run: list[ClientEvent] = []  # prepended this page, newest first
        at_head = anchor is not None  # the page's oldest event so far is at/below the head
        joined = False
        start_reached = end is None
        seen: set[bytes] = set()
        for event, key in zip(chunk, keys, strict=True):
            if event.type == ROOM_CREATE:
                start_reached = True
            if key in seen:
                continue
            seen.add(key)
            found = where.get(key)
            if found is not None:
                if anchor is None:
                    # The fresh position is already retained: walk on only if a
                    # gap lies below this section; otherwise nothing is missing.
                    below = store.nearest_gap(tx, room, found[0])
                    if below is None or below.is_top:
                        joined = True
                        break
                    head = store.section_head(tx, room, below.newer_ord)
                    assert head is not None
                    anchor, gap = (below.newer_ord, head), below
                    at_head = found == anchor
                elif found[0] < anchor[0]:
                    joined = True  # met the older side: continuity is proven
                    break
                else:
                    at_head = found == anchor
                continue
            if anchor is None:
                tail = store.tail(tx, room)
                new_ord = 0 if tail is None else tail[0] + 1
                if tail is None:
                    gap = self._top_gap(new_ord, event.event_id, None)
                else:
                    older = store.event_at(tx, room, tail)
                    assert older is not None
                    gap = GapRecord(
                        gap_id=new_gap_id(),
                        newer_ord=new_ord,
                        older_ord=tail[0],
                        older_boundary=older.event_id,
                        newer_boundary=event.event_id,
                        cursor=None,
                    )
                new_gap = True
                anchor = (new_ord, 1)  # so the first event lands at pos 0
            anchor = (anchor[0], anchor[1] - 1)
            run.append(event)
            at_head = True
        if run:
            assert anchor is not None
            self._emit(EventsAdded(anchor[0], anchor[1], tuple(reversed(run))))
        if gap is None:
            return PageResult(WalkState(anchor), len(run), joined, start_reached, None)
        if joined:
            if not new_gap:
                self._emit(GapRemoved(gap))
            return PageResult(WalkState(anchor), len(run), True, False, None)
        changed = gap
        if run:
            changed = replace(changed, newer_boundary=run[-1].event_id)
        if start_reached:
            changed = replace(
                changed, cursor=None, lifecycle=GapLifecycle.Unavailable, failure=None
            )
        elif at_head and end is not None:
            changed = replace(changed, cursor=end)
        if then is not None and not start_reached:
            changed = replace(changed, lifecycle=then, failure=None)
        writes = store.gap_writes(room)
        if new_gap:
            self._emit(GapAdded(changed))
            writes += 1
        elif changed != gap:
            self._emit(GapChanged(changed))
            writes += 1
        state = WalkState(anchor, changed.gap_id, changed, writes)
        return PageResult(state, len(run), False, start_reached, changed)

    def set_gap_state(
        self, gap_id: str, lifecycle: GapLifecycle, failure: str | None = None
    ) -> GapRecord | None:
        gap = self.store.gap_by_id(self.tx, self.room, gap_id)
        if gap is None:
            return None
        if gap.lifecycle is GapLifecycle.Unavailable:
            return gap  # the start of accessible history does not come back
        changed = replace(
            gap, lifecycle=lifecycle, failure=failure if lifecycle is GapLifecycle.Failed else None
        )
        if changed != gap:
            self._emit(GapChanged(changed))
        return changed
