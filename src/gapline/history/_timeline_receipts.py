"""Read receipts on a timeline's rows: who has read up to each event, and the fully-read
marker's event.

A row carries the users whose receipt sits on its event. The map by event is built
once per change of receipts, not once per row, and a row is copied only when its
receipts differ: copying a row is most of what placing it costs.
"""

from __future__ import annotations

from collections.abc import Mapping

from msgspec.structs import replace

from gapline.history._items import EventItem

__all__ = ["RowReceipts", "with_receipts"]


def with_receipts(item: EventItem, by_event: dict[str, tuple[str, ...]]) -> EventItem:
    """``item`` carrying the receipts on its event: the item itself when they are the same
    (most rows: copying a row is most of what placing it costs)."""
    receipts = by_event.get(item.event_id, ())
    return item if item.receipts == receipts else replace(item, receipts=receipts)


class RowReceipts:
    """A timeline's receipts (user -> event id) and its fully-read event."""

    __slots__ = ("_by_event", "_by_user", "fully_read")

    def __init__(self) -> None:
        self._by_user: dict[str, str] = {}
        self._by_event: dict[str, tuple[str, ...]] | None = None  # _by_user by event, cached
        self.fully_read: str | None = None

    def load(self, receipts: Mapping[str, str], fully_read: str | None) -> None:
        """The receipts and marker of a window read from the store."""
        self._by_user = dict(receipts)
        self._by_event = None
        self.fully_read = fully_read

    def readers(self) -> dict[str, tuple[str, ...]]:
        """The users whose receipt sits on each event (built once per change of receipts)."""
        if self._by_event is None:
            by_event: dict[str, list[str]] = {}
            for user, event_id in self._by_user.items():
                by_event.setdefault(event_id, []).append(user)
            self._by_event = {e: tuple(sorted(users)) for e, users in by_event.items()}
        return self._by_event

    def move(self, receipts: dict[str, str]) -> list[str]:
        """Take the room's new receipts; the events whose readers changed, sorted."""
        old = self._by_user
        touched = {
            event_id
            for user in set(receipts) | set(old)
            for event_id in (receipts.get(user), old.get(user))
            if event_id is not None and receipts.get(user) != old.get(user)
        }
        self._by_user = receipts
        self._by_event = None
        return sorted(touched)
