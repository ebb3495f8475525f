"""Switching the timeline pane from one room to another (Enter, ctrl+n/ctrl+p).

:class:`RoomSwitching` is mixed into the app (``self`` is the app). Leaving a
room marks it read up to where it was shown; a room not yet open in the
engine is opened, one already open is shown from the mirror at once. The
next/previous keys follow the room list's order and skip invites (those are
joined with Enter in the list).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gapline.history import OpenRoom

if TYPE_CHECKING:
    from gapline.tui._app import GaplineApp

__all__ = ["RoomSwitching"]


class RoomSwitching:
    """Room switching of :class:`~gapline.tui._app.GaplineApp` (a mixin)."""

    def show_room(self: GaplineApp, room_id: str) -> None:
        """Switch the timeline to ``room_id``, opening it in the engine if needed."""
        if room_id == self.room_id and self.mirror.items(room_id) is not None:
            return
        if self.room_id is not None and self.mirror.items(self.room_id) is not None:
            self.action_mark_read()  # leaving a room: read up to where it was shown
        self.thread_root = None
        self.room_id = room_id
        self.close_search()
        items = self.mirror.items(room_id)
        self.timeline.selected_id = None
        self.timeline.reset(items or ())
        if items is None:
            self.command(OpenRoom(room_id))
        self._refresh_rooms()
        self._refresh_status()
        self._refresh_typing()
        self._refresh_members()
        self._show_progress()

    def action_next_room(self: GaplineApp) -> None:
        self._step_room(1)

    def action_previous_room(self: GaplineApp) -> None:
        self._step_room(-1)

    def _step_room(self: GaplineApp, step: int) -> None:
        ids = self._joined_ids()
        if not ids:
            self.notice("no room to switch to")
            return
        at = ids.index(self.room_id) if self.room_id in ids else (-1 if step > 0 else 0)
        self.show_room(ids[(at + step) % len(ids)])
