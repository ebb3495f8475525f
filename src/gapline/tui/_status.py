"""The room's title line, its status line, and the progress line of a running fill.

:class:`StatusLines` is mixed into the app (``self`` is the app). The status
line says how the room's recent history stands and how many messages wait in
the send queue, and leads with a warning while the homeserver is unreachable
(the engine keeps retrying; queued messages go when it answers again).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.widgets import Label, ProgressBar, Static

from gapline.history import RecentHistoryKind
from gapline.history.rooms import RoomSummary
from gapline.tui._encryption import LOCK, room_encrypted
from gapline.tui._text import queue_label, recent_label

if TYPE_CHECKING:
    from gapline.tui._app import GaplineApp

__all__ = ["StatusLines"]


class StatusLines:
    """Title, status and progress lines of :class:`~gapline.tui._app.GaplineApp` (a mixin)."""

    def _show_progress(self: GaplineApp) -> None:
        """The progress line shows the running fill of the room on screen, if any."""
        gap_id = self._fills.get(self.room_id) if self.room_id is not None else None
        progress = self.timeline.progress.get(gap_id) if gap_id is not None else None
        box = self.query_one("#fill")
        box.set_class(progress is not None, "-running")
        if progress is None:
            return
        self.query_one(ProgressBar).update(progress=progress.pages)
        pages = "page" if progress.pages == 1 else "pages"
        of = f" of {self.page_budget}" if self.page_budget is not None else ""
        self.query_one("#fill-label", Label).update(
            f"filling: {progress.pages} {pages}{of}, {progress.events} events"
        )

    def _refresh_status(self: GaplineApp) -> None:
        title = self.query_one("#room-title", Static)
        status = self.query_one("#status", Static)
        parts = []
        problem = self.reachability.problem
        signed_out = self.reachability.signed_out
        if signed_out is not None:
            parts.append(f"⚠ signed out: {signed_out}")
        elif self.reachability.password_wanted is not None:
            parts.append("⚠ session expired: waiting for the password")
        elif problem is not None:
            parts.append("⚠ homeserver unreachable, retrying")
        status.set_class(problem is not None or signed_out is not None, "-offline")
        # The queue before the history's state: offline, what waits to go matters most.
        queue = self.mirror.send_queue
        queued = queue_label(queue.pending, queue.failed)
        if queued is not None:
            parts.append(queued)
        if self.room_id is None:
            title.update("no room open")
            parts.append("choose a room on the left")
        else:
            summary = self.directory.get(self.room_id) or RoomSummary(self.room_id)
            label = summary.label
            if room_encrypted(self._engine, self.room_id, self.mirror.items(self.room_id)):
                label = f"{LOCK} {label}"
            if self.thread_root is None:
                title.update(label)
            else:
                title.update(f"{label} / thread · esc back to the room")
            state = self.mirror.state.recent(self.room_id)
            status.set_class(state.kind is RecentHistoryKind.Failed, "-failed")
            parts.append(recent_label(state, report=self.mirror.state.repairs.get(self.room_id)))
        status.update(" · ".join(parts))
