"""A room list for clients: each joined room's name and unread count, kept from ``/sync`` answers.

The engine's cache stores room ids only as keyed hashes, so it cannot list
rooms, and its events carry no room names. A client that shows a room list
feeds every sync answer it sees to a :class:`RoomDirectory` (the TUI wraps its
``MatrixClient.sync`` so the engine's own sync loop feeds it) and reads
:meth:`RoomDirectory.summaries`. Whether a room's history is still loading is
not here: that is the engine's ``RecentHistoryChanged``, which a client
already mirrors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

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

    @property
    def label(self) -> str:
        """The name a person reads: the room name, else its alias, else its id."""
        return self.name or self.alias or self.room_id


def _naming(events: Iterable[ClientEvent], summary: RoomSummary) -> RoomSummary:
    for event in events:
        if event.state_key != "":
            continue
        if event.type == "m.room.name":
            name = event.content.get("name")
            summary = replace(summary, name=name if isinstance(name, str) and name else None)
        elif event.type == "m.room.canonical_alias":
            alias = event.content.get("alias")
            summary = replace(summary, alias=alias if isinstance(alias, str) and alias else None)
    return summary


class RoomDirectory:
    """Joined rooms with names and unread counts; listeners hear of every change.

    Listeners are plain callables run synchronously inside :meth:`observe`;
    they must be quick and must not raise (a TUI posts itself a message).
    """

    def __init__(self, rooms: Iterable[RoomSummary] = ()) -> None:
        self._rooms: dict[str, RoomSummary] = {room.room_id: room for room in rooms}
        self._listeners: list[Callable[[], None]] = []

    def summaries(self) -> tuple[RoomSummary, ...]:
        """Every joined room, by label (case-insensitive), then id."""
        return tuple(sorted(self._rooms.values(), key=lambda r: (r.label.casefold(), r.room_id)))

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
        changed = False
        for room_id, joined in response.rooms.join.items():
            before = self._rooms.get(room_id) or RoomSummary(room_id)
            after = _naming(joined.state.events, before)
            after = _naming(joined.timeline.events, after)
            counts = joined.unread_notifications
            after = replace(
                after, unread=counts.notification_count, highlights=counts.highlight_count
            )
            if after != self._rooms.get(room_id):
                self._rooms[room_id] = after
                changed = True
        for room_id in response.rooms.leave:
            if self._rooms.pop(room_id, None) is not None:
                changed = True
        if changed:
            self._changed()

    def _changed(self) -> None:
        for listener in tuple(self._listeners):
            listener()
