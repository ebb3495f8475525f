"""Search within the loaded timeline: ``/`` (or ctrl+f) asks, ``n`` and ``N`` step.

Only the rows the pane holds are searched (the loaded history, not the
server's): a match is a message whose text or sender contains the words,
ignoring case. Enter selects the newest match and gives the timeline the
focus; ``n`` goes to the next older match, ``N`` back to a newer one, both
wrapping round. Esc closes the search bar.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from textual.widgets import Input, Label

from gapline.history import EventItem, TimelineItem
from gapline.tui._text import sender_label

if TYPE_CHECKING:
    from gapline.tui._app import GaplineApp

__all__ = ["TimelineSearch", "matches"]


def matches(items: Sequence[TimelineItem], query: str) -> tuple[str, ...]:
    """Ids of the rows matching ``query``, oldest first."""
    needle = query.casefold().strip()
    if not needle:
        return ()
    found = []
    for item in items:
        if not isinstance(item, EventItem) or item.redacted:
            continue
        who = sender_label(item.sender, item.sender_name)
        if needle in (item.body or "").casefold() or needle in who.casefold():
            found.append(item.id)
    return tuple(found)


class TimelineSearch:
    """Timeline search of :class:`~gapline.tui._app.GaplineApp` (a mixin)."""

    search_query: str | None = None
    _search_hits: tuple[str, ...] = ()
    _search_at: int = 0

    def action_search(self: GaplineApp) -> None:
        bar = self.query_one("#search-bar")
        bar.add_class("-shown")
        box = self.query_one("#search", Input)
        box.focus()

    def close_search(self: GaplineApp) -> bool:
        """Hide the search bar; whether it was shown."""
        bar = self.query_one("#search-bar")
        if not bar.has_class("-shown"):
            return False
        bar.remove_class("-shown")
        self.search_query = None
        self._search_hits = ()
        self.timeline.focus()
        return True

    def run_search(self: GaplineApp, query: str) -> None:
        """Find ``query`` in the loaded rows and select the newest match."""
        self.search_query = query
        self._search_hits = matches(self.timeline.items, query)
        self.timeline.focus()
        if not self._search_hits:
            self._search_info("no match in the loaded history")
            return
        self._search_at = len(self._search_hits) - 1
        self._search_show()

    def action_search_next(self: GaplineApp) -> None:
        self._search_step(-1)

    def action_search_previous(self: GaplineApp) -> None:
        self._search_step(1)

    def _search_step(self: GaplineApp, step: int) -> None:
        if self.search_query is None:
            self.notice("/ searches the loaded history first")
            return
        # The rows may have changed since (a fill, new messages): look again.
        self._search_hits = matches(self.timeline.items, self.search_query)
        if not self._search_hits:
            self._search_info("no match in the loaded history")
            return
        current = self.timeline.selected_id
        if current in self._search_hits:
            self._search_at = self._search_hits.index(current) + step
        else:
            self._search_at = min(self._search_at, len(self._search_hits) - 1)
        self._search_at %= len(self._search_hits)
        self._search_show()

    def _search_show(self: GaplineApp) -> None:
        self.timeline.select(self._search_hits[self._search_at], center=True)
        self._search_info(
            f"{self._search_at + 1} of {len(self._search_hits)} · n older · N newer · esc closes"
        )

    def _search_info(self: GaplineApp, text: str) -> None:
        self.query_one("#search-info", Label).update(text)
