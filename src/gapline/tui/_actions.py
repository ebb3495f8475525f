"""What a reader does with a row: reply, edit, delete, react, open its thread, read.

:class:`RowActions` is mixed into the app. Each action takes the selected row
of the timeline pane and sends one engine command; what the command changes
comes back as diffs like anything else (an edit, a reaction chip). The
compose box has three modes (a message, a reply to a row, an edit of a row)
and says which in its placeholder; ``Esc`` leaves a mode, then the box.
Typing out: the box tells the room once when text appears and again when it
is sent or cleared.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gapline.history import (
    CancelSend,
    EditMessage,
    EventItem,
    MarkRead,
    OpenThread,
    RedactEvent,
    RetrySend,
    SendReaction,
    SetTyping,
    ShrinkTimeline,
)
from gapline.tui._compose import ComposeError, Say, command_for, parse
from gapline.tui._compose_box import ComposeBox
from gapline.tui._text import sender_label

if TYPE_CHECKING:
    from gapline.tui._app import GaplineApp

__all__ = ["PLACEHOLDER", "RowActions"]

PLACEHOLDER = "write a message · enter sends · esc leaves"
QUICK_REACTION = "👍"


class RowActions:
    """Row actions of :class:`~gapline.tui._app.GaplineApp` (a mixin; ``self`` is the app)."""

    compose_mode: tuple[str, str] | None = None  # ("reply" | "edit", event id)
    _typing_sent: bool = False

    def _selected_event(self: GaplineApp) -> EventItem | None:
        item = self.timeline.selected
        if not isinstance(item, EventItem):
            self.notice("select a message first")
            return None
        return item

    def _set_mode(self: GaplineApp, mode: tuple[str, str] | None, placeholder: str) -> None:
        self.compose_mode = mode
        box = self.query_one("#compose", ComposeBox)
        box.placeholder = placeholder
        box.focus()

    def action_reply(self: GaplineApp) -> None:
        item = self._selected_event()
        if item is None or self.room_id is None:
            return
        who = sender_label(item.sender, item.sender_name)
        self._set_mode(("reply", item.event_id), f"reply to {who} · enter sends · esc cancels")

    def action_edit(self: GaplineApp) -> None:
        item = self._selected_event()
        if item is None or self.room_id is None:
            return
        if self.me is not None and item.sender != self.me:
            self.notice("only your own messages can be edited", severity="warning")
            return
        self._set_mode(("edit", item.event_id), "edit your message · enter saves · esc cancels")
        self.query_one("#compose", ComposeBox).value = item.body or ""

    def action_delete(self: GaplineApp) -> None:
        item = self._selected_event()
        if item is None or self.room_id is None or item.redacted:
            return
        if item.send_state is not None:
            # Not on the server yet: drop it from the send queue instead.
            self.command(CancelSend(self.room_id, item.id))
            return
        self.command(RedactEvent(self.room_id, item.event_id))

    def action_retry_send(self: GaplineApp) -> None:
        """Send a message the homeserver refused again."""
        item = self._selected_event()
        if item is None or self.room_id is None:
            return
        if item.send_state is None or item.send_state.message is None:
            self.notice("only a message that was not sent can be retried")
            return
        self.command(RetrySend(self.room_id, item.id))

    def action_react(self: GaplineApp) -> None:
        item = self._selected_event()
        if item is not None and self.room_id is not None and not item.redacted:
            self.command(SendReaction(self.room_id, item.event_id, QUICK_REACTION))

    def action_thread(self: GaplineApp) -> None:
        if self.thread_root is not None:
            return
        item = self._selected_event()
        if item is not None and self.room_id is not None:
            self.show_thread(item.event_id)

    def action_mark_read(self: GaplineApp) -> None:
        """This account read the room up to its newest message."""
        if self.room_id is None or self.thread_root is not None:
            return
        events = [r.item for r in self.timeline.rows if isinstance(r.item, EventItem)]
        if events and self._marked.get(self.room_id) != events[-1].event_id:
            self._marked[self.room_id] = events[-1].event_id
            self.command(MarkRead(self.room_id, events[-1].event_id))

    def action_live(self: GaplineApp) -> None:
        """Back to the live end after scrolling far back: the engine reloads it."""
        if self.room_id is not None and self.timeline.detached:
            self.command(ShrinkTimeline(self.room_id, self.thread_root))

    def submit(self: GaplineApp, text: str) -> bool:
        """The compose box was sent, in its mode: a message, an edit, or a slash command.
        Whether the text was taken (a refused command stays in the box to be fixed)."""
        if self.room_id is None:
            return False
        mode = self.compose_mode
        parsed = parse(text)
        if parsed is None:
            return False
        if isinstance(parsed, ComposeError):
            self.notice(parsed.message, severity="warning")
            return False
        if mode is not None and mode[0] == "edit":
            self.command(EditMessage(self.room_id, mode[1], text.strip(), markdown=True))
        else:
            reply = mode[1] if mode is not None and isinstance(parsed, Say) else None
            self.command(
                command_for(parsed, self.room_id, in_reply_to=reply, thread_root=self.thread_root)
            )
        self.leave_mode()
        self.typed("")
        return True

    def leave_mode(self: GaplineApp) -> bool:
        """Back to plain messages; whether there was a mode to leave."""
        if self.compose_mode is None:
            return False
        self.compose_mode = None
        box = self.query_one("#compose", ComposeBox)
        box.placeholder = PLACEHOLDER
        box.clear()
        return True

    def typed(self: GaplineApp, text: str) -> None:
        """The compose box changed: tell the room when typing starts and stops."""
        typing = bool(text.strip())
        if self.room_id is not None and typing != self._typing_sent:
            self._typing_sent = typing
            self.command(SetTyping(self.room_id, typing))

    def show_thread(self: GaplineApp, root: str) -> None:
        """Switch the pane to the thread rooted at ``root`` (opened in the engine once)."""
        assert self.room_id is not None
        self.thread_root = root
        items = self.mirror.items(self.room_id, root)
        self.timeline.selected_id = None
        self.timeline.reset(items or ())
        if items is None:
            self.command(OpenThread(self.room_id, root))
        self._refresh_status()

    def leave_thread(self: GaplineApp) -> bool:
        if self.thread_root is None or self.room_id is None:
            return False
        root, self.thread_root = self.thread_root, None
        items = self.mirror.items(self.room_id) or ()
        row_id = next((i.id for i in items if getattr(i, "event_id", None) == root), None)
        self.timeline.selected_id = row_id
        self.timeline.reset(items)
        self.timeline.select(row_id)
        self._refresh_status()
        return True
