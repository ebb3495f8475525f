"""A timeline's rows as a sorted list, and the edits of it that each return their diff.

The rows are two parallel lists, ``_keys`` (sorted) and ``_items``; ``_event_keys``
finds an event's row, ``_quoting`` the rows that quote each event, and ``_echoes``
the local echo rows and the ids their events took over. Every edit keeps the four
in step, so :class:`~gapline.history._timeline.Timeline` reasons only in keys and
items, and each edit's ``VectorDiff`` says what it did to the list.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from gapline.history._echoes import ECHO_ORD
from gapline.history._items import EventItem
from gapline.history._timeline_echoes import EchoRows
from gapline.history._timeline_parts import RowKey
from gapline.history._timeline_quotes import QuotingRows
from gapline.history._types import Append, Insert, Remove, Set, TimelineItem, VectorDiff

__all__ = ["SortedRows"]


class SortedRows:
    """The sorted rows of one timeline and their indexes (see the module doc)."""

    def __init__(self) -> None:
        self._keys: list[RowKey] = []
        self._items: list[TimelineItem] = []
        self._event_keys: dict[str, RowKey] = {}
        self._quoting = QuotingRows()
        self._echoes = EchoRows()

    def _track(self, key: RowKey, item: EventItem) -> None:
        self._event_keys[item.event_id] = key
        self._quoting.add(key, item)

    def _untrack(self, key: RowKey, item: TimelineItem) -> None:
        if not isinstance(item, EventItem):
            return
        if key[0] == ECHO_ORD:
            self._echoes.untrack(key, item)
            return
        if self._event_keys.get(item.event_id) == key:
            del self._event_keys[item.event_id]
        self._quoting.discard(key, item)

    def _index(self, key: RowKey) -> int | None:
        i = bisect.bisect_left(self._keys, key)
        return i if i < len(self._keys) and self._keys[i] == key else None

    def _contains(self, key: RowKey) -> bool:
        return self._index(key) is not None

    def _item_at(self, key: RowKey) -> TimelineItem | None:
        i = self._index(key)
        return None if i is None else self._items[i]

    def _insert(self, key: RowKey, item: TimelineItem) -> VectorDiff:
        item = self._echoes.aliased(item)
        i = bisect.bisect_left(self._keys, key)
        self._keys.insert(i, key)
        self._items.insert(i, item)
        return Insert(i, item)

    def _remove(self, key: RowKey) -> VectorDiff | None:
        i = self._index(key)
        if i is None:
            return None
        self._untrack(key, self._items[i])
        del self._keys[i]
        del self._items[i]
        return Remove(i)

    def _set(self, key: RowKey, item: TimelineItem) -> VectorDiff | None:
        item = self._echoes.aliased(item)
        i = self._index(key)
        if i is None or self._items[i] == item:
            return None
        old = self._items[i]
        self._untrack(key, old)
        if isinstance(item, EventItem) and key[0] != ECHO_ORD:
            self._track(key, item)
        self._items[i] = item
        return Set(i, item)

    def _place(self, placed: Sequence[tuple[RowKey, TimelineItem]], out: list[VectorDiff]) -> None:
        """Rows new to the window, in key order: those past the end as one ``Append``."""
        appended: list[TimelineItem] = []
        for row_key, row in placed:
            if not self._keys or row_key > self._keys[-1]:
                self._keys.append(row_key)
                self._items.append(row)
                appended.append(row)
                continue
            if appended:
                out.append(Append(tuple(appended)))
                appended = []
            out.append(self._insert(row_key, row))
        if appended:
            out.append(Append(tuple(appended)))
