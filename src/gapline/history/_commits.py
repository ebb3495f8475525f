"""The one path every write of history takes, and the order timelines see writes in.

:meth:`Commits.run` runs a store operation and queues the updates it returns
on the open rooms' timelines while holding one lock, so each timeline receives
updates in commit order. The write and the queueing run in a task of their
own that the caller awaits through ``asyncio.shield``: a caller cancelled
mid-write gets its ``CancelledError``, while the write still lands and its
updates still queue. :meth:`Commits.start` hands that task out instead (a walk's
page, a heal's chunk: their callers await it later, one task a write rather than
two). :class:`Commits` owns those tasks until they end; :meth:`Commits.drain` (at
engine shutdown) waits for the last of them.

:class:`StatementsRan` lets a caller go on beside a write's ``COMMIT``: an fsync,
which holds no GIL, so the event loop's next work (showing the last page, checking
the next chunk) costs nothing on top of it.
"""

from __future__ import annotations

import asyncio
import contextlib
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

__all__ = ["Commits", "HistoryWrite", "StatementsRan"]

T = TypeVar("T")

HistoryWrite = Callable[[Tx], tuple[T, dict[str, list[Update]]]]
"""A store operation returning its result and, per room, the updates it committed."""


class StatementsRan:
    """Called from the store's thread inside a write, once its statements ran and before
    its ``COMMIT``; :meth:`wait` on the loop returns then (or when the write ended first:
    it failed, or never called). Made on the loop that waits."""

    __slots__ = ("_future", "_loop")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._future: asyncio.Future[None] = self._loop.create_future()

    def __call__(self) -> None:
        # Inside the write's transaction: a loop closed meanwhile (nobody waits any more)
        # must not make the write fail.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._settle)

    def _settle(self, _write: object = None) -> None:
        if not self._future.done():
            self._future.set_result(None)

    async def wait(self, write: asyncio.Future[Any]) -> None:
        """Until the statements of ``write`` (the write this was given to) have run."""
        write.add_done_callback(self._settle)
        await self._future


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
        """:meth:`run` without the wait: the write's task, started now and owned here
        (it lands and queues its updates whether or not its caller still waits)."""

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
        return await asyncio.shield(self.start_room_write(room_id, fn, thread_root=thread_root))

    def start_room_write(
        self, room_id: str, fn: Callable[[Sections], T], *, thread_root: str | None = None
    ) -> asyncio.Task[T]:
        """:meth:`room_write` without the wait (see :meth:`start`)."""

        def op(tx: Tx) -> tuple[T, dict[str, list[Update]]]:
            sections = Sections(self._store, tx, room_id, thread_root=thread_root)
            result = fn(sections)
            key = room_id if thread_root is None else thread_key(room_id, thread_root)
            return result, {key: sections.updates}

        return self.start(op)

    async def drain(self) -> None:
        """Wait until every write started so far has ended (its outcome is its caller's)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
