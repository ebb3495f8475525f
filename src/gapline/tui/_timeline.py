"""The timeline pane: one row widget per item id, updated in place from diffs.

Rows are never rebuilt wholesale when a diff lands: an ``Insert`` mounts one
widget, a ``Set`` of the same id updates the existing widget's item (so a
gap changing state, an edit, a receipt repaint one row), a ``Remove``
removes one. Only a ``Reset`` (a room opened or switched to) replaces them
all. When rows land above the viewport (a fill, a back-pagination) the pane
keeps the row at the top of the view where it was; when the view was at the
bottom it stays at the bottom (a live room follows new messages).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import tzinfo

from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message

from gapline.history import (
    Append,
    Clear,
    HistoryGapItem,
    HistoryRepairReport,
    Insert,
    PushBack,
    PushFront,
    Remove,
    Reset,
    Set,
    TimelineItem,
    VectorDiff,
)
from gapline.tui._rows import EventRow, GapRow, MarkerRow, Row, row_for
from gapline.tui._text import FillProgress

__all__ = ["EventRow", "GapRow", "MarkerRow", "Row", "TimelineView"]  # rows: see _rows


class TimelineView(VerticalScroll, can_focus=True):
    """Rows of one room, oldest at the top; ``selected_id`` survives any diff that keeps it."""

    BINDINGS = [
        Binding("up,k", "move(-1)", "Up", show=False),
        Binding("down,j", "move(1)", "Down", show=False),
        Binding("home", "edge(0)", "Oldest", show=False),
        Binding("end", "edge(-1)", "Newest", show=False),
    ]

    DEFAULT_CSS = """
    TimelineView { height: 1fr; scrollbar-size-vertical: 1; }
    """

    def __init__(self, *, tz: tzinfo | None = None, id: str | None = None) -> None:
        super().__init__(id=id)
        self.tz = tz
        self.rows: list[Row] = []
        self.selected_id: str | None = None
        self.progress: dict[str, FillProgress] = {}
        self.reports: dict[str, HistoryRepairReport] = {}
        self.muted_style = "dim"
        self.sender_style = "bold"
        self.thread_style = "italic"
        self.me: str | None = None
        self.detached = False  # rows were dropped at the newest end (scrolled far back)
        self._place: tuple[bool, Row | None, float] | None = None

    def on_mount(self) -> None:
        self._restyle_for_theme()
        self.watch(self.app, "theme", lambda _theme: self._restyle_for_theme(), init=False)

    def _restyle_for_theme(self) -> None:
        # Rich styles for the parts of a row; taken from the theme so they read
        # on dark and light backgrounds alike.
        variables = self.app.get_css_variables()
        self.sender_style = f"bold {variables.get('text-primary', 'blue')}"
        self.thread_style = f"italic {variables.get('text-accent', 'magenta')}"
        for row in self.rows:
            row.refresh()

    # -- reading -------------------------------------------------------------------------

    @property
    def items(self) -> tuple[TimelineItem, ...]:
        return tuple(row.item for row in self.rows)

    def row(self, item_id: str) -> Row | None:
        return next((r for r in self.rows if r.item.id == item_id), None)

    @property
    def selected(self) -> TimelineItem | None:
        row = self.row(self.selected_id) if self.selected_id is not None else None
        return None if row is None else row.item

    # -- writing -------------------------------------------------------------------------

    def reset(self, items: Iterable[TimelineItem]) -> None:
        """Replace every row (a room was opened or switched to); the view goes to the end."""
        self.remove_children()
        self.rows = [row_for(item, self) for item in items]
        if self.rows:
            self.mount_all(self.rows)
        if self.selected_id is None or self.row(self.selected_id) is None:
            self.selected_id = self.rows[-1].item.id if self.rows else None
        self.detached = False
        self._mark_selected()
        self.call_after_refresh(self.scroll_end, animate=False, immediate=True)

    def apply(self, diffs: Sequence[VectorDiff]) -> None:
        """Apply one ``TimelineChanged``'s diffs to the rows, in place."""
        # Where the reader is, measured once per burst of diffs: a burst (a fill's
        # pages, a back-pagination) lands before the layout catches up, so the
        # rows' regions are only trustworthy before the first diff of a burst.
        if self._place is None:
            anchor = self._top_visible_row()
            self._place = (
                self.scroll_y >= self.max_scroll_y - 1,
                anchor,
                (anchor.virtual_region.y - self.scroll_y) if anchor is not None else 0,
            )
            self.call_after_refresh(self._keep_place)
        selected_index = self._index_of(self.selected_id)
        grew_at_front = False
        for diff in diffs:
            match diff:
                case PushFront() | Insert(index=0):
                    grew_at_front = True
                case Remove(index=index) if grew_at_front and index == len(self.rows) - 1:
                    self.detached = True  # the engine left the live end to bound the rows
                case Reset():
                    self.detached = False
            self._apply_one(diff)
        if self.selected_id is not None and self.row(self.selected_id) is None:
            # The selected row went away (a filled gap): select what now sits at its place.
            if self.rows:
                index = min(selected_index if selected_index is not None else 0, len(self.rows) - 1)
                self.selected_id = self.rows[index].item.id
            else:
                self.selected_id = None
        elif self.selected_id is None and self.rows:
            self.selected_id = self.rows[-1].item.id
        self._mark_selected()

    def _mark_selected(self) -> None:
        for index, row in enumerate(self.rows):
            row.set_class(row.item.id == self.selected_id, "-selected")
            if isinstance(row, MarkerRow):
                # The unread divider says something only while messages follow it.
                row.display = index < len(self.rows) - 1

    def _keep_place(self) -> None:
        if self._place is None:
            return
        at_bottom, anchor, offset = self._place
        self._place = None
        if at_bottom:
            self.scroll_end(animate=False)
        elif anchor is not None and anchor.parent is self:
            self.scroll_to(y=anchor.virtual_region.y - offset, animate=False, immediate=True)

    def refresh_gaps(self) -> None:
        """Repaint gap rows after fill progress or reports changed."""
        for row in self.rows:
            if isinstance(row, GapRow):
                row.restyle()

    def _apply_one(self, diff: VectorDiff) -> None:
        match diff:
            case Append(values=values):
                new = [row_for(v, self) for v in values]
                self.rows.extend(new)
                if new:
                    self.mount_all(new)
            case PushBack(value=value):
                self._insert(len(self.rows), value)
            case PushFront(value=value):
                self._insert(0, value)
            case Insert(index=index, value=value):
                self._insert(index, value)
            case Set(index=index, value=value):
                old = self.rows[index]
                if old.item.id == value.id and type(old.item) is type(value):
                    old.set_item(value)  # same row, new state: repaint in place
                else:
                    self._insert(index, value)
                    self._remove(index + 1)
            case Remove(index=index):
                self._remove(index)
            case Clear():
                self.remove_children()
                self.rows = []
            case Reset(values=values):
                self.remove_children()
                self.rows = [row_for(v, self) for v in values]
                if self.rows:
                    self.mount_all(self.rows)

    def _insert(self, index: int, item: TimelineItem) -> None:
        if not 0 <= index <= len(self.rows):
            raise IndexError(f"Insert at {index} into {len(self.rows)} rows")
        row = row_for(item, self)
        if index < len(self.rows):
            self.mount(row, before=self.rows[index])
        else:
            self.mount(row)
        self.rows.insert(index, row)

    def _remove(self, index: int) -> None:
        row = self.rows.pop(index)
        row.remove()

    def _index_of(self, item_id: str | None) -> int | None:
        if item_id is None:
            return None
        return next((i for i, r in enumerate(self.rows) if r.item.id == item_id), None)

    def _top_visible_row(self) -> Row | None:
        top = self.scroll_y
        for row in self.rows:
            region = row.virtual_region
            if region.height and region.y + region.height > top:
                return row
        return None

    # -- selection -----------------------------------------------------------------------

    def select(self, item_id: str | None, *, center: bool = False) -> None:
        self.selected_id = item_id
        self._mark_selected()
        row = self.row(item_id) if item_id is not None else None
        if row is None:
            return
        if center:
            # After the pending layout, so a row mounted just now has its place.
            self.call_after_refresh(self.scroll_to_center, row, animate=False, immediate=True)
        else:
            self.scroll_to_widget(row, animate=False, immediate=True)

    def action_move(self, step: int) -> None:
        if not self.rows:
            return
        index = self._index_of(self.selected_id)
        index = len(self.rows) - 1 if index is None else index + step
        self.select(self.rows[max(0, min(index, len(self.rows) - 1))].item.id)

    class LiveRequested(Message):
        """``End`` on a window that left the live end: the app asks the engine for it."""

    def action_edge(self, index: int) -> None:
        if index == -1 and self.detached:
            self.post_message(self.LiveRequested())
        if self.rows:
            self.select(self.rows[index].item.id)

    @property
    def at_top(self) -> bool:
        return self.scroll_y <= 0

    def gaps(self) -> list[HistoryGapItem]:
        return [row.item for row in self.rows if isinstance(row.item, HistoryGapItem)]

    def nearest_gap(self) -> HistoryGapItem | None:
        """The selected gap; else the nearest gap above the selection; else the newest gap."""
        index = self._index_of(self.selected_id)
        if index is not None:
            for row in reversed(self.rows[: index + 1]):
                if isinstance(row.item, HistoryGapItem):
                    return row.item
        gaps = self.gaps()
        return gaps[-1] if gaps else None
