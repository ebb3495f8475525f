"""Which rows of a timeline quote which events (replies), so a quote follows its event."""

from __future__ import annotations

from collections.abc import Callable

from gapline.history._items import EventItem, ReplyStatus
from gapline.history._timeline_parts import RowKey
from gapline.history._types import TimelineItem

__all__ = ["QuotingRows"]


class QuotingRows:
    """Quoted event id -> the keys of the rows quoting it."""

    __slots__ = ("_by_target",)

    def __init__(self) -> None:
        self._by_target: dict[str, set[RowKey]] = {}

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._by_target

    def quotes_any(self, event_ids: list[str]) -> bool:
        """Some row quotes one of ``event_ids``."""
        return bool(self._by_target) and not self._by_target.keys().isdisjoint(event_ids)

    def clear(self) -> None:
        self._by_target.clear()

    def add(self, key: RowKey, item: EventItem) -> None:
        if item.in_reply_to is not None:
            self._by_target.setdefault(item.in_reply_to.event_id, set()).add(key)

    def add_many(self, keys: list[RowKey], items: list[EventItem]) -> None:
        """:meth:`add` for rows placed together (most quote nothing)."""
        for key, item in zip(keys, items, strict=True):
            if item.in_reply_to is not None:
                self._by_target.setdefault(item.in_reply_to.event_id, set()).add(key)

    def discard(self, key: RowKey, item: EventItem) -> None:
        if item.in_reply_to is None:
            return
        quoting = self._by_target.get(item.in_reply_to.event_id)
        if quoting is not None:
            quoting.discard(key)
            if not quoting:
                del self._by_target[item.in_reply_to.event_id]

    def rows_quoting(self, event_id: str) -> list[RowKey]:
        """The rows quoting ``event_id``, oldest first."""
        return sorted(self._by_target.get(event_id, ()))

    def pending(self, item_at: Callable[[RowKey], TimelineItem | None]) -> set[str]:
        """Event ids quoted by rows that still wait for them (the cache does not hold them)."""
        out = set()
        for target, keys in self._by_target.items():
            for key in keys:
                item = item_at(key)
                if (
                    isinstance(item, EventItem)
                    and item.in_reply_to is not None
                    and item.in_reply_to.status is ReplyStatus.Pending
                ):
                    out.add(target)
                    break
        return out
