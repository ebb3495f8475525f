"""A room list for clients: joined, invited and left rooms with their names, counts, encryption
and last message, kept from ``/sync`` answers.

The engine's cache stores room ids only as keyed hashes, so it cannot list
rooms, and its events carry no room names. A client that shows a room list
feeds every sync answer it sees to a :class:`RoomDirectory` (the TUI wraps its
``MatrixClient.sync`` so the engine's own sync loop feeds it) and reads
:meth:`RoomDirectory.summaries`. Whether a room's history is still loading is
not here: that is the engine's ``RecentHistoryChanged``, which a client
already mirrors.

:meth:`RoomDirectory.summaries` lists the joined rooms by name (what the TUI's
room pane shows); :meth:`RoomDirectory.room_list` is the full list a client
orders by: invites first, then joined rooms by recent activity (the newest
event a sync brought), and the rooms this account left when asked for them.
Direct chats are the rooms this account's ``m.direct`` names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from gapline.matrix import ClientEvent, SyncResponse

__all__ = ["RoomDirectory", "RoomSummary"]


@dataclass(frozen=True, slots=True)
class RoomSummary:
    """What a room list shows of one joined room."""

    room_id: str
    name: str | None = None
    alias: str | None = None
    unread: int = 0
    highlights: int = 0
    """Unread messages that mention this account (the server's ``highlight_count``)."""
    membership: str = "join"
    """``join``, ``invite`` (``inviter`` says who) or ``leave``."""
    encrypted: bool = False
    direct: bool = False
    last_message: str | None = None
    """The first line of the newest message a sync brought (``encrypted message`` when
    it could not be read here), with its sender in ``last_sender``."""
    last_sender: str | None = None
    last_ts: int = 0
    """When the newest event a sync brought was sent (ms): the room's recent activity."""
    inviter: str | None = None

    @property
    def label(self) -> str:
        """The name a person reads: the room name, else its alias, else its id."""
        return self.name or self.alias or self.room_id

    @property
    def initials(self) -> str:
        """One or two letters standing in for the room's avatar."""
        words = [w for w in self.label.lstrip("#!@").replace(":", " ").split() if w[:1].isalnum()]
        letters = "".join(w[0] for w in words[:2]) or self.label[:1]
        return letters.upper()


def _naming(events: Iterable[ClientEvent], summary: RoomSummary) -> RoomSummary:
    for event in events:
        if event.state_key != "":
            continue
        if event.type == "m.room.encryption":
            summary = replace(summary, encrypted=True)
        elif event.type == "m.room.name":
            name = event.content.get("name")
            summary = replace(summary, name=name if isinstance(name, str) and name else None)
        elif event.type == "m.room.canonical_alias":
            alias = event.content.get("alias")
            summary = replace(summary, alias=alias if isinstance(alias, str) and alias else None)
    return summary


def _activity(events: list[ClientEvent], summary: RoomSummary) -> RoomSummary:
    """The newest event's time and the newest message's first line and sender."""
    if not events:
        return summary
    summary = replace(summary, last_ts=max(summary.last_ts, events[-1].origin_server_ts))
    for event in reversed(events):
        if event.type == "m.room.encrypted":
            return replace(summary, last_message="encrypted message", last_sender=event.sender)
        body = event.content.get("body") if event.type == "m.room.message" else None
        if isinstance(body, str):
            first = body.strip().split("\n", 1)[0]
            return replace(summary, last_message=first, last_sender=event.sender)
    return summary


def _invited(room_id: str, state: Iterable[Any], before: RoomSummary | None) -> RoomSummary:
    summary = before or RoomSummary(room_id)
    summary = replace(summary, membership="invite")
    for event in state:
        content = event.content
        if event.type == "m.room.name" and isinstance(content.get("name"), str):
            summary = replace(summary, name=content["name"] or None)
        elif event.type == "m.room.canonical_alias" and isinstance(content.get("alias"), str):
            summary = replace(summary, alias=content["alias"] or None)
        elif event.type == "m.room.encryption":
            summary = replace(summary, encrypted=True)
        elif event.type == "m.room.member" and content.get("membership") == "invite":
            summary = replace(
                summary, inviter=event.sender, direct=content.get("is_direct") is True
            )
    return summary


class RoomDirectory:
    """Joined rooms with names and unread counts; listeners hear of every change.

    Listeners are plain callables run synchronously inside :meth:`observe`;
    they must be quick and must not raise (a TUI posts itself a message).
    """

    def __init__(self, rooms: Iterable[RoomSummary] = ()) -> None:
        self._rooms: dict[str, RoomSummary] = {room.room_id: room for room in rooms}
        self._invites: dict[str, RoomSummary] = {}
        self._left: dict[str, RoomSummary] = {}
        self._direct: set[str] = set()
        self._ignored: set[str] = set()  # m.ignored_user_list: their invites are not listed
        self._listeners: list[Callable[[], None]] = []

    def summaries(self) -> tuple[RoomSummary, ...]:
        """Every joined room, by label (case-insensitive), then id."""
        return tuple(sorted(self._rooms.values(), key=lambda r: (r.label.casefold(), r.room_id)))

    def room_list(self, *, include_left: bool = False) -> tuple[RoomSummary, ...]:
        """Invites (newest first), then joined rooms by recent activity (newest first,
        then by label), then, with ``include_left``, the rooms this account left."""

        def recent(rooms: Iterable[RoomSummary]) -> list[RoomSummary]:
            return sorted(rooms, key=lambda r: (-r.last_ts, r.label.casefold(), r.room_id))

        out = recent(self._invites.values()) + recent(self._rooms.values())
        if include_left:
            out += recent(self._left.values())
        return tuple(out)

    def get(self, room_id: str) -> RoomSummary | None:
        return self._rooms.get(room_id)

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` after each change; returns the function that unsubscribes."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def put(self, summary: RoomSummary) -> None:
        """Add or replace one room (tools and tests; sync answers go through :meth:`observe`)."""
        self._rooms[summary.room_id] = summary
        self._changed()

    def observe(self, response: SyncResponse) -> None:
        """Take one sync answer: joined rooms are added or renamed, left rooms dropped.

        ``unread`` is the server's ``notification_count`` and ``highlights`` its
        ``highlight_count``, which a sync carries for every joined room it mentions.
        """
        changed = self._observe_direct(response)
        for room_id, joined in response.rooms.join.items():
            before = (
                self._rooms.get(room_id)
                or self._invites.pop(room_id, None)
                or self._left.pop(room_id, None)
                or RoomSummary(room_id)
            )
            after = _naming(joined.state.events, replace(before, membership="join"))
            after = _naming(joined.timeline.events, after)
            after = _activity(joined.timeline.events, after)
            counts = joined.unread_notifications
            after = replace(
                after,
                unread=counts.notification_count,
                highlights=counts.highlight_count,
                direct=room_id in self._direct,
                inviter=None,
            )
            if after != self._rooms.get(room_id):
                self._rooms[room_id] = after
                changed = True
        changed = self._observe_ignored(response) or changed
        for room_id, invited in response.rooms.invite.items():
            after = _invited(room_id, invited.invite_state.events, self._invites.get(room_id))
            if after.inviter in self._ignored:
                continue  # an invite from someone this account ignores is not offered
            if after != self._invites.get(room_id):
                self._invites[room_id] = after
                changed = True
        for room_id, left in response.rooms.leave.items():
            before = (
                self._rooms.pop(room_id, None)
                or self._invites.pop(room_id, None)
                or self._left.get(room_id)
                or RoomSummary(room_id)
            )
            after = _activity(left.timeline.events, _naming(left.state.events, before))
            after = replace(after, membership="leave", unread=0, highlights=0, inviter=None)
            if after != self._left.get(room_id):
                self._left[room_id] = after
                changed = True
        if changed:
            self._changed()

    def _observe_ignored(self, response: SyncResponse) -> bool:
        """``m.ignored_user_list``: invites from those users leave the list."""
        events = response.account_data.of_type("m.ignored_user_list")
        if not events:
            return False
        users = events[-1].content.get("ignored_users")
        self._ignored = set(users) if isinstance(users, dict) else set()
        dropped = [r for r, s in self._invites.items() if s.inviter in self._ignored]
        for room_id in dropped:
            del self._invites[room_id]
        return bool(dropped)

    def _observe_direct(self, response: SyncResponse) -> bool:
        """``m.direct`` (user -> rooms) as this sync carried it: which rooms are direct."""
        events = response.account_data.of_type("m.direct")
        if not events:
            return False
        direct = {
            room
            for rooms in events[-1].content.values()
            if isinstance(rooms, list)
            for room in rooms
            if isinstance(room, str)
        }
        if direct == self._direct:
            return False
        self._direct = direct
        for room_id, summary in self._rooms.items():
            self._rooms[room_id] = replace(summary, direct=room_id in direct)
        return True

    def _changed(self) -> None:
        for listener in tuple(self._listeners):
            listener()
