"""The rows of the timeline pane: one widget per item, repainted in place on a ``Set``.

An event row is its sender (display name, in a colour of its own per user), its
time and text (its HTML rendered safely, an emote as ``* name does``, a notice dimmed),
and around it what the cache made of the event: the reply it
quotes above, its reaction chips and its thread's summary below. A message of
this account still in the send queue is dimmed with "… sending" beside it, or,
refused for good, says why below with the keys that retry or discard it. A gap row is a
rule with the gap's state in words; the read marker is the unread divider.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.widgets import Static

from gapline.history import EventItem, HistoryGapItem, ReadMarkerItem, TimelineItem
from gapline.tui._html import body_text, clean
from gapline.tui._text import (
    event_body,
    event_time,
    gap_label,
    reactions_line,
    reply_line,
    send_line,
    sender_colour,
    sender_label,
    thread_line,
)

if TYPE_CHECKING:
    from gapline.tui._timeline import TimelineView

__all__ = ["EventRow", "GapRow", "MarkerRow", "Row", "row_for"]

INDENT = " " * 7  # under the time column


class Row(Static):
    """A timeline row; ``item`` is swapped in place when a ``Set`` of the same id lands."""

    DEFAULT_CSS = """
    Row { height: auto; padding: 0 1; }
    Row.-selected {
        background: $boost; text-style: bold;
        padding: 0 1 0 0; border-left: outer $accent 50%;
    }
    TimelineView:focus Row.-selected { background: $accent 30%; border-left: outer $accent; }
    """

    def __init__(self, item: TimelineItem, view: TimelineView) -> None:
        super().__init__()
        self.item = item
        self._view = view

    @property
    def item_id(self) -> str:
        return self.item.id

    def set_item(self, item: TimelineItem) -> None:
        self.item = item
        self.refresh(layout=True)

    def on_click(self) -> None:
        self._view.select(self.item.id)


class EventRow(Row):
    """A message: time, sender, body (edited and redacted states shown), with the reply it
    quotes above it and its reactions and thread summary below."""

    def render(self) -> Text:
        assert isinstance(self.item, EventItem)
        item = self.item
        muted = self._view.muted_style
        body, placeholder = event_body(item)
        line = Text(no_wrap=False)
        quote = reply_line(item)
        if quote is not None:
            line.append(f"{INDENT}{clean(quote)}\n", style="italic " + muted)
        line.append(event_time(item, self._view.tz), style=muted)
        line.append("  ")
        who = clean(sender_label(item.sender, item.sender_name))
        line.append(who, style=f"bold {sender_colour(item.sender)}")
        line.append("  ")
        sending = send_line(item)
        shown = Text(clean(body)) if placeholder else body_text(item, who)
        if placeholder or sending:
            shown.stylize("italic " + muted)
        line.append_text(shown)
        if item.edited and not item.redacted:
            line.append(" (edited)", style=muted)
        if sending is not None:
            failed = item.send_state is not None and item.send_state.message is not None
            if failed:
                line.append(f"\n{INDENT}{clean(sending)}", style="bold red")
            else:
                line.append(f"  {sending}", style=muted)
        chips = reactions_line(item, self._view.me)
        if chips is not None:
            line.append(f"\n{INDENT}{clean(chips)}")
        thread = thread_line(item)
        if thread is not None:
            line.append(f"\n{INDENT}{clean(thread)}", style=self._view.thread_style)
        return line


class GapRow(Row):
    """A gap: a rule across the pane with the gap's state in its middle."""

    DEFAULT_CSS = """
    GapRow { color: $text-warning; text-style: bold; }
    GapRow.-filling { color: $text-success; }
    GapRow.-failed { color: $text-error; }
    GapRow.-unavailable { color: $text-muted; text-style: italic; }
    """

    def render(self) -> Text:
        assert isinstance(self.item, HistoryGapItem)
        label = gap_label(
            self.item,
            progress=self._view.progress.get(self.item.id),
            report=self._view.reports.get(self.item.id),
        )
        width = self.content_region.width
        if len(label) + 6 > width:
            # Too narrow for the rule: the words alone, wrapped, still say it all.
            return Text(label, no_wrap=False)
        return Text(f" {label} ".center(width, "─"), no_wrap=False)

    def set_item(self, item: TimelineItem) -> None:
        super().set_item(item)
        self.restyle()

    def restyle(self) -> None:
        assert isinstance(self.item, HistoryGapItem)
        lifecycle = self.item.lifecycle.value
        self.set_class(self.item.id in self._view.progress, "-filling")
        self.set_class(lifecycle == "Failed", "-failed")
        self.set_class(lifecycle == "Unavailable", "-unavailable")
        self.refresh(layout=True)


class MarkerRow(Row):
    """The unread divider at the fully-read marker; hidden while nothing follows it."""

    DEFAULT_CSS = """
    MarkerRow { color: $text-error; }
    """

    def render(self) -> Text:
        label = " new messages "
        return Text(label.center(max(self.content_region.width, len(label)), "┄"))


def row_for(item: TimelineItem, view: TimelineView) -> Row:
    match item:
        case EventItem():
            return EventRow(item, view)
        case HistoryGapItem():
            row = GapRow(item, view)
            row.restyle()
            return row
        case ReadMarkerItem():
            return MarkerRow(item, view)
    raise TypeError(f"not a timeline item: {item!r}")
