"""The small pure parts of a timeline: a row's key, a gap's row, rows of bare events, the
event a row shows, and which of two quotes of one event a row keeps."""

from __future__ import annotations

from collections.abc import Sequence

from gapline.history._items import EventItem, InReplyTo, ReplyStatus
from gapline.history._render import render
from gapline.history._types import HistoryGapItem, TimelineItem
from gapline.history._updates import GapRecord, StoredEvent

__all__ = ["RowKey", "bare_rows", "better_quote", "event_of", "gap_item"]

RowKey = tuple[int, int, int]
"""``(ord, pos, 1)`` an event, ``(ord, pos, 2)`` the read marker after it, ``(ord, -inf, 0)``
a gap (see ``_timeline``)."""


def gap_item(gap: GapRecord) -> HistoryGapItem:
    return HistoryGapItem(
        id=gap.gap_id,
        older_boundary=gap.older_boundary or "",
        newer_boundary=gap.newer_boundary,
        lifecycle=gap.lifecycle,
        failure=gap.failure,
    )


def bare_rows(events: Sequence[StoredEvent]) -> list[EventItem]:
    return [render(s.event, None, sender_name=s.sender_name) for s in events]


def event_of(item: TimelineItem | None) -> str:
    return item.event_id if isinstance(item, EventItem) else ""


def better_quote(current: InReplyTo, new: InReplyTo) -> InReplyTo:
    """A quote never goes back from ready (or unavailable) to pending."""
    if new.status is ReplyStatus.Pending and current.status is not ReplyStatus.Pending:
        return current
    return new
