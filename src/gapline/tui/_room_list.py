"""The room list pane: invites, then rooms by recent activity, as they change.

One entry a room: its initials standing in for an avatar, a lock when it is
encrypted, ``@`` before the name of a direct chat, its name, whether its history loads, unread and mention counts,
and under it the newest message (or who invited this account). :class:`RoomList`
is mixed into the app (``self`` is the app); the pane is an ``OptionList``
whose option ids are room ids, repainted in place when the rooms are the same
and rebuilt when they are not (a room joined, left, or moved up by activity).
Enter opens the highlighted room; on an invite it accepts it first. ``L`` adds
the rooms this account left at the end (their history stays readable).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from gapline.history import AcceptInvite, Ok, RecentHistoryKind
from gapline.history.rooms import RoomSummary
from gapline.tui._encryption import LOCK
from gapline.tui._text import sender_colour, sender_label

if TYPE_CHECKING:
    from gapline.tui._app import GaplineApp
    from gapline.tui._engine_link import RoomsChanged

__all__ = ["ENTRY_WIDTH", "RoomList", "room_prompt"]


ENTRY_WIDTH = 21
"""Columns of an entry: the pane's width (24) less its border and the options' padding."""


def room_prompt(
    summary: RoomSummary,
    *,
    current: bool = False,
    loading: bool = False,
    width: int | None = None,
) -> Text:
    """A room's entry: ``initials [lock] [@]name [⟳] [(unread[ @mentions])]`` over its last
    line (``@``: a direct chat).

    With ``width`` each line is cut there with an ellipsis (the list never wraps an entry).
    """
    prompt = Text()
    prompt.append(f"{summary.initials:<2}", style=f"bold reverse {sender_colour(summary.room_id)}")
    prompt.append(" ")
    if summary.encrypted:
        prompt.append(f"{LOCK} ")
    if summary.direct:  # a direct chat (m.direct): the person, not a room
        prompt.append("@", style="dim")
    prompt.append(summary.label, style="bold" if current else "")
    if loading:
        prompt.append(" ⟳", style="italic")
    if summary.unread and not current:
        # A mention of this account makes the count stand out (and says so).
        mention = summary.highlights > 0
        count = f" ({summary.unread} @{summary.highlights})" if mention else f" ({summary.unread})"
        prompt.append(count, style="bold reverse" if mention else "bold")
    if summary.membership == "invite":
        who = sender_label(summary.inviter) if summary.inviter else "someone"
        prompt.append(f"\n   invite from {who} · enter joins", style="italic")
    elif summary.membership == "leave":
        prompt.append("\n   left · L hides", style="dim italic")
    elif summary.last_message:
        who = f"{sender_label(summary.last_sender)}: " if summary.last_sender else ""
        first = summary.last_message.splitlines()[0] if summary.last_message.strip() else ""
        prompt.append(f"\n   {who}{first}", style="dim")
    if width is None:
        return prompt
    lines = prompt.split("\n")
    for line in lines:
        line.truncate(width, overflow="ellipsis")
    return Text("\n").join(lines)


class RoomList:
    """The room list of :class:`~gapline.tui._app.GaplineApp` (a mixin)."""

    show_left: bool = False  # the list also holds the rooms this account left (L)

    def action_left_rooms(self: GaplineApp) -> None:
        """Show or hide the rooms this account left, at the end of the list."""
        self.show_left = not self.show_left
        self._refresh_rooms()
        self.notice("showing the rooms you left" if self.show_left else "hiding the rooms you left")

    def on_rooms_changed(self: GaplineApp, _message: RoomsChanged) -> None:
        if self.room_id is None and (rooms := self._joined_ids()):
            self.show_room(rooms[0])
            return
        self._refresh_rooms()
        self._refresh_status()

    def _summaries(self: GaplineApp) -> list[RoomSummary]:
        known = list(self.directory.room_list(include_left=self.show_left))
        ids = {s.room_id for s in known}
        extra = [self.room_id] if self.room_id is not None else []
        extra += list(self.mirror.state.timelines)
        for room_id in extra:
            if room_id not in ids:
                known.append(RoomSummary(room_id))
                ids.add(room_id)
        return known

    def _joined_ids(self: GaplineApp) -> list[str]:
        """The joined rooms in list order (switching skips invites and rooms left)."""
        return [s.room_id for s in self._summaries() if s.membership == "join"]

    def _refresh_rooms(self: GaplineApp) -> None:
        """Repaint the room list; prompts are replaced in place when the rooms are the same."""
        options = self.query_one("#rooms", OptionList)
        summaries = self._summaries()
        ids = [s.room_id for s in summaries]
        prompts = [
            room_prompt(
                s,
                current=s.room_id == self.room_id,
                loading=self.mirror.state.recent(s.room_id).kind is RecentHistoryKind.Loading,
                width=ENTRY_WIDTH,
            )
            for s in summaries
        ]
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

    def choose_room(self: GaplineApp, room_id: str) -> None:
        """Enter on a room in the list: show it (accepting it first when it is an invite)."""
        invite = next((s for s in self.directory.room_list() if s.room_id == room_id), None)
        if invite is not None and invite.membership == "invite":
            self.run_worker(self._accept_then_show(room_id), group="commands")
            return
        self.show_room(room_id)
        self.timeline.focus()

    async def _accept_then_show(self: GaplineApp, room_id: str) -> None:
        answer = await self._execute(AcceptInvite(room_id))
        if isinstance(answer, Ok):
            self.show_room(room_id)
            self.timeline.focus()
