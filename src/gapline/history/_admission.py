"""The relation rules, applied where events enter the cache.

Every batch of events placed in a timeline (a sync, a recent load, a fill, a
back-pagination, a thread's walk) passes :meth:`Admission.admit` inside the
transaction that places it, called from ``Sections._emit``: the one function
that changes history. It returns the batch as stored (with rows) and the
updates the batch causes elsewhere, so the store and the timeline read one
stream of updates.

Rules (each relation event takes effect once per room, wherever it arrives
first; the relation index remembers it):

- **edits** (``m.replace``) are held per target (:func:`with_edit`), per sender
  while the target is unknown; when the target arrives only its sender's
  count. The visible revision is chosen when a row is rendered. An edit of an
  edit, or an edit whose ``m.new_content`` is not an object, changes nothing;
- **redactions** set a tombstone on the target, whether it is retained or not:
  a retained target is stored again without its content, one arriving later
  is stored without it. A redacted relation event stops counting (an edit is
  withdrawn, a reaction removed, a thread reply shows as deleted);
- **reactions** (``m.annotation`` with a key) are aggregated on the target;
- **thread replies** count on their root (and are rows of the thread only);
- a server's bundled aggregations of an event (its newest edit, its thread's
  summary) are taken as if their events had arrived, with the same checks, and
  the event is stored without them: its aggregate holds what they said.

A changed event that is retained is published as a ``RowChanged``; when it is
the newest reply of a thread, its root's summary changes with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from gapline.history._aggregates import (
    EMPTY,
    Aggregate,
    Annotation,
    Revision,
    only_sender,
    with_annotation,
    with_edit,
    with_latest_reply,
    with_thread_bundle,
    with_thread_reply,
    without_relation,
)
from gapline.history._cache_store import thread_key
from gapline.history._items import EventItem
from gapline.history._relations import (
    REACTION,
    REDACTION,
    Relation,
    RelKind,
    is_redacted,
    relation_of,
    shown_in_room,
)
from gapline.history._render import render, thread_reply
from gapline.history._rows import RowReader
from gapline.history._updates import (
    AggregateChanged,
    DetachedStored,
    EventRewritten,
    EventsAdded,
    RelationIndexed,
    RowChanged,
    StoredEvent,
    Update,
)
from gapline.matrix import ClientEvent

if TYPE_CHECKING:
    from gapline.history._sections import Sections

__all__ = ["Admission", "purged"]

# What a redaction keeps of a state event's content (the spec's redaction algorithm,
# for the keys a row reads); everything else goes.
_KEPT = {
    "m.room.member": ("membership",),
    "m.room.join_rules": ("join_rule",),
    "m.room.history_visibility": ("history_visibility",),
    "m.room.create": ("creator", "room_version"),
}


def purged(event: ClientEvent, redaction_id: str) -> ClientEvent:
    """``event`` as a redaction leaves it: no content beyond what state needs."""
    kept = {k: event.content[k] for k in _KEPT.get(event.type, ()) if k in event.content}
    return msgspec.structs.replace(
        event, content=kept, unsigned={"redacted_because": {"event_id": redaction_id}}
    )


def _unbundled(event: ClientEvent) -> ClientEvent:
    """``event`` without the server's bundled aggregations (``unsigned.m.relations``)."""
    unsigned = {k: v for k, v in event.unsigned.items() if k != "m.relations"}
    return msgspec.structs.replace(event, unsigned=unsigned)


def _event(value: Any) -> ClientEvent | None:
    """``value`` (a bundled event, undecoded) as an event; ``None`` when it is not one."""
    if not isinstance(value, dict):
        # Most bundles carry one kind (a root's thread, an edited event's edit): the other
        # is absent, and a failed conversion raises, which costs more than the rest.
        return None
    try:
        return msgspec.convert(value, ClientEvent)
    except (msgspec.ValidationError, TypeError):
        return None


def _held_edit(aggregate: Aggregate, raw: Any) -> bool:
    """``raw`` (a bundled edit, undecoded) is a revision ``aggregate`` holds already
    (:func:`with_edit` would return it unchanged)."""
    if not isinstance(raw, dict) or not aggregate.edits:
        return False
    event_id = raw.get("event_id")
    return any(r.event_id == event_id for r in aggregate.edits)


def _held_latest(aggregate: Aggregate, raw: Any) -> bool:
    """``raw`` (a bundled thread's newest reply, undecoded) is the newest reply
    ``aggregate`` holds, at the same time (:func:`with_thread_bundle` keeps it unchanged)."""
    thread = aggregate.thread
    if not isinstance(raw, dict) or thread is None or thread.latest is None:
        return False
    latest = thread.latest
    return raw.get("event_id") == latest.event_id and raw.get("origin_server_ts") == latest.ts


@dataclass
class _Batch:
    """What one admission knows: aggregates loaded and changed, relations, events."""

    aggregates: dict[str, Aggregate]
    changed: set[str] = field(default_factory=set)
    relations: dict[str, Relation | None] = field(default_factory=dict)
    events: dict[str, ClientEvent] = field(default_factory=dict)
    index: list[tuple[str, str, str]] = field(default_factory=list)
    loaded: set[str] = field(default_factory=set)  # looked up, whether found or not
    retained: dict[str, StoredEvent | None] = field(default_factory=dict)  # looked up
    detached: dict[str, ClientEvent | None] = field(default_factory=dict)  # looked up
    indexed: dict[str, tuple[str, str] | None] = field(default_factory=dict)  # looked up
    refresh: set[str] = field(default_factory=set)  # rows to carry on as if changed
    rendered: dict[str, tuple[ClientEvent, Aggregate | None, EventItem]] = field(
        default_factory=dict
    )
    """The batch's rows as last rendered, with the event and aggregate they were rendered
    from: a row is rendered again only once either changed (a target several relations
    touch is rendered once a page, not once per relation)."""

    def get(self, event_id: str) -> Aggregate:
        return self.aggregates.get(event_id, EMPTY)

    def put(self, event_id: str, aggregate: Aggregate) -> None:
        if aggregate != self.get(event_id):
            self.aggregates[event_id] = aggregate
            self.changed.add(event_id)


class Admission:
    """The relation rules of one ``Sections`` (one timeline, in one transaction)."""

    def __init__(self, sections: Sections) -> None:
        self.s = sections
        self.placing = True
        """The batch is placed by this admission (its rows get their aggregates with them);
        false when events already retained pass the rules again (an upgrade)."""
        self.refresh: set[str] = set()
        """Events whose rows now read differently though no relation changed them (a
        healed thread reply: its root's summary quotes it again)."""
        self.deferred = False
        """Rows of a batch taking the plain path are not rendered (``items`` is None):
        the caller has them rendered where they are shown (a heal, ``RowsHealed``)."""
        self.thread_replies: dict[str, list[ClientEvent]] = {}
        """Thread replies newly admitted to the room's timeline, by root (for thread views)."""

    def _reader(self) -> RowReader:
        s = self.s
        return RowReader(s.store, s.tx, s.room, s.agg_room)

    def admit(self, update: EventsAdded) -> tuple[EventsAdded, list[Update]]:
        s = self.s
        store, tx, agg_room = s.store, s.tx, s.agg_room
        events = list(update.events)
        rels = [relation_of(e) for e in events]
        ids = [e.event_id for e in events]
        targets = [r.target for r in rels if r is not None]
        batch = _Batch(store.relations.aggregates(tx, agg_room, ids + targets, s.known_keys))
        if not targets and not batch.aggregates:
            quick = self._plain(update, events)
            if quick is not None:
                return quick, []
        batch.loaded.update(ids + targets)
        batch.refresh = self.refresh & set(ids)
        batch.events = {e.event_id: e for e in events}
        batch.relations = dict(zip(ids, rels, strict=True))
        outside = [t for t in targets if t not in batch.events]
        self._retained(batch, outside)  # originals and targets, in one query
        relation_ids = [e.event_id for e, r in zip(events, rels, strict=True) if r is not None]
        seen = (
            set(store.relations.indexed(tx, agg_room, relation_ids, s.known_keys))
            if relation_ids
            else set()
        )
        redacted_now: set[str] = set()
        aggregates = batch.aggregates
        # Whether each event is redacted, kept in step wherever one is purged (below and in
        # _redact): nothing after this loop purges one.
        gone = [is_redacted(e) for e in events]
        for i, event in enumerate(events):
            held = aggregates.get(event.event_id)
            if held is not None and held.redacted_by is not None and not gone[i]:
                events[i] = batch.events[event.event_id] = purged(event, held.redacted_by)
                gone[i] = True
            rel = rels[i]
            if rel is None or gone[i] or event.event_id in seen:
                continue
            seen.add(event.event_id)
            batch.index.append((event.event_id, rel.target, rel.kind.value))
            if not rel.valid:
                continue
            if rel.kind is RelKind.REDACTION:
                self._redact(batch, event, rel.target, events, gone)
                redacted_now.add(rel.target)
            else:
                self._relate(batch, event, rel)
        for i, event in enumerate(events):
            if gone[i]:
                continue
            held = aggregates.get(event.event_id)
            if held is not None and held.edits:
                batch.put(event.event_id, only_sender(held, event.sender))
            if "m.relations" in event.unsigned:  # what _bundles reads; most events have none
                self._bundles(batch, event)
                # Taken into the aggregate: the event is stored without it (the bundle
                # repeats whole events, and the aggregate is where they count).
                events[i] = batch.events[event.event_id] = _unbundled(event)
        items = [self._row(batch, e) for e in events]
        items, effects = self._settle(batch, events, items, redacted_now)
        if s.thread_root is None:
            shown = tuple([shown_in_room(u, r) for u, r in zip(update.events, rels, strict=True)])
            for event, rel, event_gone in zip(events, rels, gone, strict=True):
                if rel is not None and rel.kind is RelKind.THREAD and not event_gone:
                    self.thread_replies.setdefault(rel.target, []).append(event)
        else:
            shown = (True,) * len(events)
        held = (
            tuple(batch.aggregates.get(e.event_id) for e in events)
            if s.thread_root is None
            else None
        )
        placed = EventsAdded(update.ord, update.pos, tuple(events), tuple(items), shown, held)
        return placed, effects

    def _plain(self, update: EventsAdded, events: list[ClientEvent]) -> EventsAdded | None:
        """A batch nothing relates to, and that relates to nothing (most of them): its rows
        are the events themselves. ``None`` when a server bundled aggregations in it."""
        if any("m.relations" in e.unsigned for e in events):
            return None
        s = self.s
        if s.thread_root is None:
            shown = tuple(e.type not in (REDACTION, REACTION) for e in events)
        else:
            shown = (True,) * len(events)
        quoting = any("m.relates_to" in e.content for e in events)
        if self.deferred and not quoting:
            return EventsAdded(update.ord, update.pos, tuple(events), None, shown)
        names = s.names
        items = [render(e, None, sender_name=names.get(e.event_id)) for e in events]
        if quoting:
            items = self._reader().with_quotes(events, items)
        return EventsAdded(update.ord, update.pos, tuple(events), tuple(items), shown)

    def _row(self, batch: _Batch, event: ClientEvent) -> EventItem:
        """The row of a batch event as its aggregate stands now (rendered again only when
        the event or its aggregate changed since it was last rendered: ``render`` reads
        nothing else that a batch changes)."""
        event_id = event.event_id
        aggregate = batch.aggregates.get(event_id)
        last = batch.rendered.get(event_id)
        if last is not None and last[0] is event and last[1] is aggregate:
            return last[2]
        s = self.s
        item = render(event, aggregate, sender_name=s.names.get(event_id), me=s.store.me)
        batch.rendered[event_id] = (event, aggregate, item)
        return item

    # -- one relation event ---------------------------------------------------------------

    # Lookups of events outside the batch, one query for many ids, remembered.

    def _retained(self, batch: _Batch, ids: list[str]) -> None:
        missing = [i for i in dict.fromkeys(ids) if i not in batch.retained]
        if missing:
            found = self.s.store.retained(self.s.tx, self.s.agg_room, missing, self.s.known_keys)
            for event_id in missing:
                batch.retained[event_id] = found.get(event_id)

    def _detached(self, batch: _Batch, ids: list[str]) -> None:
        missing = [i for i in dict.fromkeys(ids) if i not in batch.detached]
        if missing:
            found = self.s.store.relations.detached(
                self.s.tx, self.s.agg_room, missing, self.s.known_keys
            )
            for event_id in missing:
                batch.detached[event_id] = found.get(event_id)

    def _indexed(self, batch: _Batch, ids: list[str]) -> None:
        missing = [i for i in dict.fromkeys(ids) if i not in batch.indexed]
        if missing:
            found = self.s.store.relations.indexed(
                self.s.tx, self.s.agg_room, missing, self.s.known_keys
            )
            for event_id in missing:
                batch.indexed[event_id] = found.get(event_id)

    def _original(self, batch: _Batch, event_id: str) -> ClientEvent | None:
        if event_id in batch.events:
            return batch.events[event_id]
        self._retained(batch, [event_id])
        found = batch.retained[event_id]
        if found is not None:
            batch.events[event_id] = found.event
            return found.event
        return None

    def _load(self, batch: _Batch, event_id: str) -> None:
        """Make sure ``event_id``'s held aggregate is in the batch before changing it."""
        if event_id not in batch.aggregates and event_id not in batch.loaded:
            s = self.s
            batch.aggregates.update(
                s.store.relations.aggregates(s.tx, s.agg_room, [event_id], s.known_keys)
            )
            batch.loaded.add(event_id)

    def _relate(self, batch: _Batch, event: ClientEvent, rel: Relation) -> None:
        target = rel.target
        match rel.kind:
            case RelKind.REPLACE:
                assert rel.new_content is not None
                original = self._original(batch, target)
                if original is not None:
                    inner = relation_of(original)
                    if inner is not None and inner.kind is RelKind.REPLACE:
                        return  # an edit of an edit changes nothing
                revision = Revision(
                    event.event_id,
                    event.sender,
                    event.origin_server_ts,
                    event.type,
                    rel.new_content,
                )
                sender = None if original is None else original.sender
                batch.put(target, with_edit(batch.get(target), revision, sender, from_bundle=False))
            case RelKind.ANNOTATION:
                assert rel.key is not None
                annotation = Annotation(
                    rel.key, event.sender, event.event_id, event.origin_server_ts
                )
                batch.put(target, with_annotation(batch.get(target), annotation))
            case RelKind.THREAD:
                item = self._row(batch, event)
                batch.put(target, with_thread_reply(batch.get(target), thread_reply(item)))

    def _redact(
        self,
        batch: _Batch,
        redaction: ClientEvent,
        target: str,
        events: list[ClientEvent],
        gone: list[bool],
    ) -> None:
        """Redact ``target``; ``gone`` (whether each of ``events`` is redacted) follows."""
        held = batch.get(target)
        if held.redacted_by is None:
            batch.put(target, msgspec.structs.replace(held, redacted_by=redaction.event_id))
        for i, event in enumerate(events):
            if event.event_id == target and not gone[i]:
                events[i] = batch.events[target] = purged(event, redaction.event_id)
                gone[i] = True
        # The target may itself be a relation: it stops counting where it counted.
        rel = batch.relations.get(target)
        related, kind = (rel.target, rel.kind.value) if rel is not None else (None, None)
        if rel is None and target not in batch.relations:
            # Seen before (retained, or taken from a server's bundle): the index says what
            # it related to.
            self._indexed(batch, [target])
            related, kind = batch.indexed[target] or (None, None)
        if related is not None and kind in (RelKind.REPLACE.value, RelKind.ANNOTATION.value):
            self._load(batch, related)
            batch.put(related, without_relation(batch.get(related), target))

    def _bundles(self, batch: _Batch, event: ClientEvent) -> None:
        """What the server bundled with ``event``: its newest edit, its thread's summary."""
        relations = event.unsigned.get("m.relations")
        if not isinstance(relations, dict):
            return
        own = batch.relations.get(event.event_id)  # its relation_of: a bundle's event is unpurged
        held = batch.get(event.event_id)
        raw_edit = relations.get("m.replace")
        # A bundled edit the aggregate holds already (its event came in this page, or
        # earlier) changes nothing, and was indexed when it was first held: not decoded.
        edit = None if _held_edit(held, raw_edit) else _event(raw_edit)
        rel = None if edit is None else relation_of(edit)
        if (
            edit is not None
            and rel is not None
            and rel.kind is RelKind.REPLACE
            and rel.valid
            and rel.target == event.event_id
            and not is_redacted(edit)
            and (own is None or own.kind is not RelKind.REPLACE)
        ):
            assert rel.new_content is not None
            revision = Revision(
                edit.event_id, edit.sender, edit.origin_server_ts, edit.type, rel.new_content
            )
            held = batch.get(event.event_id)
            batch.put(event.event_id, with_edit(held, revision, event.sender, from_bundle=True))
            # Indexed like an edit event that arrived: its redaction withdraws it, and the
            # event itself, arriving later, takes effect no second time.
            batch.index.append((edit.event_id, event.event_id, RelKind.REPLACE.value))
        thread = relations.get("m.thread")
        if isinstance(thread, dict):
            count = thread.get("count")
            raw_latest = thread.get("latest_event")
            # The newest reply the cache holds already is no newer than itself: passing it
            # again changes nothing, so it is neither decoded nor rendered.
            latest_event = (
                None if _held_latest(batch.get(event.event_id), raw_latest) else _event(raw_latest)
            )
            latest = None
            if latest_event is not None and not is_redacted(latest_event):
                latest = thread_reply(render(latest_event, None))
            batch.put(
                event.event_id,
                with_thread_bundle(
                    batch.get(event.event_id),
                    count if isinstance(count, int) and not isinstance(count, bool) else 0,
                    latest,
                    thread.get("current_user_participated") is True,
                ),
            )

    # -- what the batch changed elsewhere -------------------------------------------------

    def _settle(
        self,
        batch: _Batch,
        events: list[ClientEvent],
        items: list[EventItem],
        redacted_now: set[str],
    ) -> tuple[list[EventItem], list[Update]]:
        """Carry the batch's changes to where they show: a changed thread reply into its
        root's summary, changed retained events into ``RowChanged`` rows (stored again
        without content when redacted), quotes into the batch's replies."""
        s = self.s
        reader = self._reader()
        rows = {i.event_id: i for i in items}
        outside: dict[str, tuple[StoredEvent | None, ClientEvent, EventItem]] = {}

        def row_of(event_id: str) -> EventItem | None:
            if event_id in rows:
                if event_id in batch.events and event_id in touched:
                    rows[event_id] = self._row(batch, batch.events[event_id])
                return rows[event_id]
            shown = self._outside(batch, event_id)
            if shown is None:
                return None
            outside[event_id] = shown
            return shown[2]

        touched: set[str] = batch.changed | batch.refresh
        pending = sorted(touched)
        elsewhere = [i for i in pending if i not in rows]
        self._retained(batch, elsewhere)
        self._detached(batch, [i for i in elsewhere if batch.retained[i] is None])
        self._indexed(batch, [i for i in pending if i not in batch.relations])
        while pending:
            event_id = pending.pop()
            item = row_of(event_id)
            if item is None:
                continue
            root = self._thread_of(batch, event_id)
            if root is None:
                continue
            self._load(batch, root)
            before = batch.get(root)
            batch.put(root, with_latest_reply(before, thread_reply(item)))
            if batch.get(root) != before:
                touched.add(root)
                outside.pop(root, None)
                pending.append(root)
        final = [rows[e.event_id] for e in events]
        final = reader.with_quotes(events, final)
        placed_rows = (
            {e.event_id for e in events} if s.thread_root is None and self.placing else set()
        )
        out: list[Update] = []
        if batch.changed:
            entries = tuple(
                (t, batch.aggregates[t], t not in placed_rows) for t in sorted(batch.changed)
            )
            out.append(AggregateChanged(entries))
        for event_id, (found, event, item) in sorted(outside.items()):
            if found is None:
                if event_id in redacted_now:
                    out.append(DetachedStored(event_id, event, item))
                continue
            if event is not found.event:
                out.append(EventRewritten(found.key, event, found.sender_name, room=s.agg_room))
                self._rewrite_thread_copy(found, event, out)
            [shown] = reader.with_quotes([event], [item], rows)
            out.append(RowChanged(shown))
        if batch.index:
            out.append(RelationIndexed(tuple(batch.index)))
        return final, out

    def _thread_of(self, batch: _Batch, event_id: str) -> str | None:
        """The root of the thread ``event_id`` replies in, if it is a thread reply (the
        index says so even once a redaction took its content)."""
        if event_id in batch.relations:
            rel = batch.relations[event_id]
            return rel.target if rel is not None and rel.kind is RelKind.THREAD else None
        self._indexed(batch, [event_id])
        found = batch.indexed[event_id]
        return found[0] if found is not None and found[1] == RelKind.THREAD.value else None

    def _outside(
        self, batch: _Batch, event_id: str
    ) -> tuple[StoredEvent | None, ClientEvent, EventItem] | None:
        """A retained (or detached) event outside the batch, as it shows now."""
        store = self.s.store
        aggregate = batch.get(event_id)
        self._retained(batch, [event_id])
        found = batch.retained[event_id]
        if found is None:
            self._detached(batch, [event_id])
            detached = batch.detached[event_id]
            if detached is None:
                return None
            event = detached
            if aggregate.redacted_by is not None and not is_redacted(event):
                event = purged(event, aggregate.redacted_by)
            return None, event, render(event, aggregate, me=store.me)
        event = found.event
        if aggregate.redacted_by is not None and not is_redacted(event):
            event = purged(event, aggregate.redacted_by)
        batch.events[event_id] = event
        item = render(event, aggregate, sender_name=found.sender_name, me=store.me)
        return found, event, item

    def _rewrite_thread_copy(
        self, found: StoredEvent, event: ClientEvent, out: list[Update]
    ) -> None:
        """A redacted thread reply is also purged from its thread's own timeline."""
        rel = relation_of(found.event)
        if rel is None or rel.kind is not RelKind.THREAD:
            return
        s = self.s
        room = s.store.find_room(s.tx, thread_key(s.room_id, rel.target))
        if room is None:
            return
        copy = s.store.retained(s.tx, room, [found.event_id]).get(found.event_id)
        if copy is not None:
            out.append(EventRewritten(copy.key, event, copy.sender_name, room=room))
