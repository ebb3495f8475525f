"""The rooms a client has open: opening one, closing it, and finding what is open.

Opening registers the room's timeline *before* its window is read, so a commit
landing between the read and the reset queues its updates on the timeline, and
applying them after the reset is idempotent for what the read already saw. A room
is not "open" to commands until its reset is out (``opening``): a command for it
before then answers ``RoomNotOpen`` rather than acting on a timeline with no rows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gapline.history._backup_fetch import BackupFetcher
from gapline.history._cache_store import CacheStore
from gapline.history._operations import Operations, Room
from gapline.history._quotes import Quotes
from gapline.history._timeline import Timeline
from gapline.history._types import (
    Answer,
    EngineConfig,
    Event,
    Failed,
    Invalid,
    Member,
    MembersChanged,
    Ok,
    RecentHistoryChanged,
    RecentHistoryState,
    RoomNotOpen,
    TypingChanged,
)
from gapline.history._walks import Walks

__all__ = ["OpenRooms", "room_id_problem"]


def room_id_problem(room_id: str) -> str | None:
    """Why ``room_id`` is not a room id, or ``None``."""
    # Room version 12 ids carry no server name ("!hash"), so only the sigil is checked.
    if not isinstance(room_id, str) or not room_id.startswith("!") or len(room_id) < 2:
        return f"not a Matrix room id: {room_id!r} (expected !opaque or !opaque:server)"
    return None


class OpenRooms:
    """The open rooms of one engine, keyed by room id (the dict the engine shares with
    its commits, walks and key fetcher, so all of them see one set of open rooms)."""

    def __init__(
        self,
        rooms: dict[str, Room],
        *,
        store: CacheStore,
        config: EngineConfig,
        publish: Callable[[Event], Awaitable[None]],
        operations: Operations,
        walks: Walks,
        quotes: Quotes,
        backup: BackupFetcher | None,
        joined: Callable[[], set[str] | None],
    ) -> None:
        self.rooms = rooms
        self._store = store
        self._config = config
        self._publish = publish
        self._operations = operations
        self._walks = walks
        self._quotes = quotes
        self._backup = backup
        self._joined = joined

    def get(self, room_id: str, thread_root: str | None = None) -> Room | None:
        """The room (or its open thread) if it is open (and done opening)."""
        room = self.rooms.get(room_id)
        if room is not None and thread_root is not None:
            room = room.threads.get(thread_root)
        return None if room is None or room.opening else room

    def quotes_wanted(self, room_id: str) -> Callable[[set[str]], None]:
        """What a timeline of ``room_id`` calls with the replied-to events it lacks."""
        return lambda event_ids: self._quotes.want(room_id, event_ids)

    async def open(self, room_id: str) -> Answer:
        """``OpenRoom``: the stored window as one ``Reset``, then the recent load."""
        problem = room_id_problem(room_id)
        if problem is not None:
            return Invalid(problem)
        if room_id in self.rooms:
            return Ok()
        timeline = Timeline(
            room_id,
            self._publish,
            max_rows=self._config.timeline_window,
            on_quotes=self.quotes_wanted(room_id),
        )
        room = Room(room_id, timeline, opening=True)
        self.rooms[room_id] = room
        try:
            window = await self._store.load_window(room_id, self._config.open_window)
        except BaseException:
            self.rooms.pop(room_id, None)
            raise
        joined = self._joined()
        if not window.known and joined is not None and room_id not in joined:
            self.rooms.pop(room_id, None)
            return Failed(f"unknown room {room_id}: this account has not joined it")
        await self._publish(timeline.reset(window, self._config.open_window))
        room.opening = False
        await timeline.flush_history()
        members = await self._store.members(room_id)
        if members:
            await timeline.publish_event(
                MembersChanged(
                    room_id,
                    tuple(Member(user_id=m.user_id, display_name=m.display_name,
                                 membership=m.membership) for m in members),
                )
            )  # fmt: skip
        timeline.note_quotes()
        # The recent load starts only after the reset is out: opening never waits on it.
        await self._walks.start_recent(room)
        if self._backup is not None:
            self._backup.opened(room_id)
        return Ok()

    async def gap_holder(self, room: Room, gap_id: str) -> Room:
        """The room, or the open thread of it, whose timeline holds ``gap_id``."""
        for thread in list(room.threads.values()):
            if await self._store.gap(room.room_id, gap_id, thread_root=thread.thread_root):
                return thread
        return room

    async def typing(self, room_id: str, users: tuple[str, ...]) -> None:
        """Sync's typing users of a room, published to its timeline (the user left out)."""
        room = self.get(room_id)
        if room is not None:
            others = tuple(sorted(u for u in users if u != self._store.me))
            await room.timeline.publish_event(TypingChanged(room_id, others))

    async def reload(self, room: Room) -> Answer:
        """``ShrinkTimeline``: the newest window again, as one ``Reset`` diff."""
        limit = self._config.open_window
        await room.timeline.reload(
            lambda: self._store.load_window(room.room_id, limit, thread_root=room.thread_root),
            limit,
        )
        return Ok()

    async def cancel(self, room_id: str, flush: Callable[[str], Awaitable[None]]) -> Answer:
        """``Cancel``: stop the room's operation and its threads', then fence with ``flush``."""
        room = self.get(room_id)
        if room is None:
            return RoomNotOpen()
        await self._stop_all(room)
        await flush(room_id)
        return Ok()

    async def close(self, room_id: str) -> None:
        """``CloseRoom``: stop its operations, forget it, close its timelines."""
        room = self.rooms.get(room_id)
        if room is None:
            return
        await self._stop_all(room)
        await self._quotes.forget(room_id)
        if self._backup is not None:
            self._backup.closed(room_id)
        self.rooms.pop(room_id, None)
        room.recent = RecentHistoryState.IDLE
        for thread in list(room.threads.values()):
            thread.timeline.closed = True
        await room.timeline.close(
            lambda: self._publish(RecentHistoryChanged(room_id, RecentHistoryState.IDLE))
        )

    async def _stop_all(self, room: Room) -> None:
        for thread in list(room.threads.values()):
            await self._operations.stop(thread)
        await self._operations.stop(room)
