"""The one path every write of history takes, and the order timelines see writes in.

:meth:`Commits.run` runs a store operation and queues the updates it returns
on the open rooms' timelines while holding one lock, so each timeline receives
updates in commit order. The write and the queueing run in a task of their
own that the caller awaits through ``asyncio.shield``: a caller cancelled
mid-write gets its ``CancelledError``, while the write still lands and its
updates still queue. :class:`Commits` owns those tasks until they end;
:meth:`Commits.drain` (at engine shutdown) waits for the last of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from gapline.history._cache_store import CacheStore, split_timeline_key, thread_key
from gapline.history._operations import Room
from gapline.history._sections import Sections
from gapline.history._updates import (
    DetachedStored,
    EchoSettled,
    RowChanged,
    RowsHealed,
    Update,
)
from gapline.storage import Tx

__all__ = ["Commits", "HistoryWrite"]

T = TypeVar("T")

HistoryWrite = Callable[[Tx], tuple[T, dict[str, list[Update]]]]
"""A store operation returning its result and, per room, the updates it committed."""


class Commits:
    """Writes of one store, queued on the timelines of ``rooms`` (the engine's open rooms)."""

    def __init__(self, store: CacheStore, rooms: Mapping[str, Room]) -> None:
        self._store = store
        self._rooms = rooms
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def run(self, op: HistoryWrite[T]) -> T:
        """Run a history write and queue its updates on the open rooms' timelines."""
        return await asyncio.shield(self.start(op))

    def start(self, op: HistoryWrite[T]) -> asyncio.Task[T]:
        """:meth:`run` without waiting: the write's task, which the caller awaits later
        (owned here until it ends, like every write; a heal goes on with its next chunk
        while this one's COMMIT runs)."""

        async def write() -> T:
            async with self._lock:
                result, updates = await self._store.backend.write(op)
                for key, timeline_updates in updates.items():
                    if timeline_updates:
                        self._deliver(key, timeline_updates)
                return result

        task = asyncio.create_task(write())  # owned: kept in _tasks until done, drained
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _deliver(self, key: str, updates: list[Update]) -> None:
        """Queue a timeline's updates on it; a row that changed also reaches the room's
        other open timelines (the room's, its threads'), wherever that row is loaded."""
        room_id, root = split_timeline_key(key)
        room = self._rooms.get(room_id)
        if room is None:
            return
        target = room if root is None else room.threads.get(root)
        if target is not None:
            target.timeline.queue(updates)
        shared = [
            u
            for u in updates
            if isinstance(u, RowChanged | RowsHealed | DetachedStored | EchoSettled)
        ]
        if shared:
            for other in (room, *room.threads.values()):
                if other is not target:
                    other.timeline.queue(shared)

    async def room_write(
        self, room_id: str, fn: Callable[[Sections], T], *, thread_root: str | None = None
    ) -> T:
        """Change one room's (or thread's) sections and gaps (``fn`` runs inside the write
        transaction)."""

        def op(tx: Tx) -> tuple[T, dict[str, list[Update]]]:
            sections = Sections(self._store, tx, room_id, thread_root=thread_root)
            result = fn(sections)
            key = room_id if thread_root is None else thread_key(room_id, thread_root)
            return result, {key: sections.updates}

        return await self.run(op)

    async def drain(self) -> None:
        """Wait until every write started so far has ended (its outcome is its caller's)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
