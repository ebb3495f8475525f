"""The side panel (the room's members, or their devices) and the typing line.

:class:`Panels` is mixed into the app (``self`` is the app). ``m`` and ``v``
toggle the side panel; it takes the room list's place when both would not fit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.widgets import Static

from gapline.tui._encryption import CryptoView, device_list
from gapline.tui._text import sender_colour, sender_label, typing_label

if TYPE_CHECKING:
    from gapline.tui._app import GaplineApp

__all__ = ["Panels"]


class Panels:
    """Side panels of :class:`~gapline.tui._app.GaplineApp` (a mixin)."""

    show_devices: bool = False  # the side panel lists the members' devices (v)

    def action_members(self: GaplineApp) -> None:
        panel = self.query_one("#members", Static)
        self.show_devices = False
        panel.set_class(not panel.has_class("-shown"), "-shown")
        self.on_resize()
        self._refresh_members()

    def action_devices(self: GaplineApp) -> None:
        """The members' devices and their trust, in the side panel (v again hides it)."""
        panel = self.query_one("#members", Static)
        self.show_devices = not (panel.has_class("-shown") and self.show_devices)
        panel.set_class(self.show_devices, "-shown")
        self.on_resize()
        self._refresh_members()

    def _names(self: GaplineApp) -> dict[str, str | None]:
        if self.room_id is None:
            return {}
        return {m.user_id: m.display_name for m in self.mirror.members(self.room_id)}

    def _refresh_typing(self: GaplineApp) -> None:
        line = self.query_one("#typing", Static)
        users = self.mirror.typing(self.room_id) if self.room_id is not None else ()
        line.update(typing_label(users, self._names()))
        line.set_class(bool(users), "-typing")

    def _refresh_members(self: GaplineApp) -> None:
        panel = self.query_one("#members", Static)
        if not panel.has_class("-shown"):
            return
        members = self.mirror.members(self.room_id) if self.room_id is not None else ()
        if self.show_devices and isinstance(self._engine, CryptoView):
            found = self._engine.devices(m.user_id for m in members)
            panel.update(device_list(found, self._names()))
            return
        text = Text(f"members ({len(members)})\n", style="bold")
        for member in members:
            name = sender_label(member.user_id, member.display_name)
            text.append(name, style=f"bold {sender_colour(member.user_id)}")
            text.append(" (invited)\n" if member.membership == "invite" else "\n")
        panel.update(text)
