"""The room list pane: one line per room, its name, whether it loads, its unread count.

:class:`RoomList` is mixed into the app (``self`` is the app). The pane is an
``OptionList`` whose option ids are room ids; it is repainted in place when
the rooms are the same, rebuilt when they are not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from gapline.history import RecentHistoryKind
from gapline.history.rooms import RoomSummary

if TYPE_CHECKING:
    from gapline.tui._app import GaplineApp
    from gapline.tui._engine_link import RoomsChanged

__all__ = ["RoomList"]


class RoomList:
    """The room list of :class:`~gapline.tui._app.GaplineApp` (a mixin)."""

    def on_rooms_changed(self: GaplineApp, _message: RoomsChanged) -> None:
        if self.room_id is None and (rooms := self.directory.summaries()):
            self.show_room(rooms[0].room_id)
            return
        self._refresh_rooms()
        self._refresh_status()

    def _summaries(self: GaplineApp) -> list[RoomSummary]:
        known = list(self.directory.summaries())
        ids = {s.room_id for s in known}
        extra = [self.room_id] if self.room_id is not None else []
        extra += list(self.mirror.state.timelines)
        for room_id in extra:
            if room_id not in ids:
                known.append(RoomSummary(room_id))
                ids.add(room_id)
        return known

    def _refresh_rooms(self: GaplineApp) -> None:
        """Repaint the room list; prompts are replaced in place when the rooms are the same."""
        options = self.query_one("#rooms", OptionList)
        summaries = self._summaries()
        ids = [s.room_id for s in summaries]
        prompts = [self._room_prompt(s) for s in summaries]
        same = options.option_count == len(ids) and all(
            options.get_option_at_index(i).id == room_id for i, room_id in enumerate(ids)
        )
        if same:
            for room_id, prompt in zip(ids, prompts, strict=True):
                options.replace_option_prompt(room_id, prompt)
        else:
            options.clear_options()
            options.add_options(
                Option(prompt, id=room_id) for room_id, prompt in zip(ids, prompts, strict=True)
            )
        if self.room_id in ids and options.highlighted != ids.index(self.room_id):
            options.highlighted = ids.index(self.room_id)

    def _room_prompt(self: GaplineApp, summary: RoomSummary) -> Text:
        prompt = Text(no_wrap=True, overflow="ellipsis")
        prompt.append(summary.label, style="bold" if summary.room_id == self.room_id else "")
        if self.mirror.state.recent(summary.room_id).kind is RecentHistoryKind.Loading:
            prompt.append(" ⟳", style="italic")
        if summary.unread and summary.room_id != self.room_id:
            # A mention of this account makes the count stand out (and says so).
            mention = summary.highlights > 0
            count = (
                f" ({summary.unread} @{summary.highlights})" if mention else f" ({summary.unread})"
            )
            prompt.append(count, style="bold reverse" if mention else "bold")
        return prompt
