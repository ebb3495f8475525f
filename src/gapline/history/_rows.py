"""Rows of retained events, read inside a transaction: the event, its aggregate, its quote.

:class:`RowReader` is how both readers of the cache get an event's row: the
store when a room (or thread) opens or scrolls back, and ``Sections`` when
events enter. Both call :func:`~gapline.history._render.render` on the same
inputs, so what a diff published and what a later open reads are the same.

A reply's quote is resolved here, in order: an event of the same batch, a
retained event of the room (shown or not), an event of the timeline being
read (a thread's own copy), an event fetched on its own before (detached), or
nothing yet (``Pending``: the engine fetches it once with ``/context``).
One level only: a quote never quotes, so a reply chain that loops ends here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from msgspec.structs import replace

from gapline.history._aggregates import Aggregate
from gapline.history._items import EventItem, InReplyTo
from gapline.history._relations import reply_target
from gapline.history._render import render, reply_preview
from gapline.history._updates import Room, StoredEvent
from gapline.matrix import ClientEvent
from gapline.storage import Tx

if TYPE_CHECKING:
    from gapline.history._cache_store import CacheStore

__all__ = ["RowReader"]


class RowReader:
    """Renders rows of ``room``'s events (``agg_room`` holds their aggregates)."""

    def __init__(self, store: CacheStore, tx: Tx, room: Room, agg_room: Room) -> None:
        self.store = store
        self.tx = tx
        self.room = room
        self.agg_room = agg_room

    def aggregates(self, event_ids: Sequence[str]) -> dict[str, Aggregate]:
        return self.store.relations.aggregates(self.tx, self.agg_room, event_ids)

    def items(
        self, stored: Sequence[StoredEvent], aggregates: Mapping[str, Aggregate] | None = None
    ) -> list[EventItem]:
        """The rows of ``stored`` (oldest first), quotes resolved; ``aggregates`` when the
        caller read them already (``None``: read them here)."""
        if aggregates is None:
            aggregates = self.aggregates([s.event_id for s in stored])
        me = self.store.me
        items = [
            render(s.event, aggregates.get(s.event_id), sender_name=s.sender_name, me=me)
            for s in stored
        ]
        return self.with_quotes([s.event for s in stored], items)

    def with_quotes(
        self,
        events: Sequence[ClientEvent],
        items: Sequence[EventItem],
        known: Mapping[str, EventItem] | None = None,
    ) -> list[EventItem]:
        """``items`` with each reply's quote filled in (``known``: rows already rendered)."""
        targets = {
            t for e in events if "m.relates_to" in e.content and (t := reply_target(e)) is not None
        }
        if not targets:
            return list(items)
        rendered = {i.event_id: i for i in items}
        if known:
            rendered.update(known)
        quotes = self.quotes(targets, rendered)
        out = []
        for event, item in zip(events, items, strict=True):
            target = reply_target(event)
            if target is not None and not item.redacted:
                item = replace(item, in_reply_to=quotes[target])
            out.append(item)
        return out

    def quotes(self, targets: set[str], known: Mapping[str, EventItem]) -> dict[str, InReplyTo]:
        """How each of ``targets`` is quoted, from the best source the cache has."""
        out = {t: reply_preview(t, known[t], unavailable=False) for t in targets if t in known}
        missing = [t for t in targets if t not in out]
        for where in dict.fromkeys((self.agg_room, self.room)):
            if not missing:
                break
            found = self.store.retained(self.tx, where, missing)
            aggregates = self.aggregates(list(found))
            for event_id, stored in found.items():
                item = render(
                    stored.event,
                    aggregates.get(event_id),
                    sender_name=stored.sender_name,
                    me=self.store.me,
                )
                out[event_id] = reply_preview(event_id, item, unavailable=False)
            missing = [t for t in missing if t not in out]
        if missing:
            detached = self.store.relations.detached(self.tx, self.agg_room, missing)
            aggregates = self.aggregates([t for t, e in detached.items() if e is not None])
            for event_id, event in detached.items():
                item = (
                    None
                    if event is None
                    else render(event, aggregates.get(event_id), me=self.store.me)
                )
                out[event_id] = reply_preview(event_id, item, unavailable=event is None)
        for target in targets:
            out.setdefault(target, reply_preview(target, None, unavailable=False))
        return out
