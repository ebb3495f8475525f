"""Opening a thread view: a second timeline of a room, for one thread.

``OpenThread(room_id, thread_root)`` of an open room:

1. registers the thread's timeline in the cache (from then on, each sync's
   replies in that thread extend it, see ``Sections.extend_threads``) and in
   the room (``Room.threads``);
2. finds the root event (retained, else ``GET /event``) to put at the top of
   the thread once a walk reaches its start; a root the server will not
   return answers ``EventNotFound``;
3. publishes the thread's retained rows as a ``TimelineReset`` with
   ``thread_root`` (no network before it), answers ``Ok``, and runs the
   thread's recent load in the background: ``/relations/{root}/m.thread``
   pages from the newest reply, under the thread's own operation slot, with
   its own durable gaps (``FillGap`` takes a thread gap's id like any other;
   ``PaginateBackwards`` with ``thread_root`` scrolls the thread back).

A thread stays open until its room closes; opening it again answers ``Ok``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gapline.history._cache_store import CacheStore
from gapline.history._commits import Commits
from gapline.history._crypto import EngineCrypto
from gapline.history._operations import Room
from gapline.history._timeline import Timeline
from gapline.history._types import Answer, EngineConfig, Event, EventNotFound, Ok
from gapline.history._walks import Walks
from gapline.matrix import ClientEvent, MatrixClient, MatrixError, NotFound

__all__ = ["Threads"]


class Threads:
    """Opens thread views of the engine's open rooms."""

    def __init__(
        self,
        *,
        store: CacheStore,
        client: MatrixClient | None,
        config: EngineConfig,
        publish: Callable[[Event], Awaitable[None]],
        commits: Commits,
        walks: Walks,
        on_quotes: Callable[[str], Callable[[set[str]], None]],
        crypto: EngineCrypto | None = None,
    ) -> None:
        self.crypto = crypto
        self._store = store
        self._client = client
        self._config = config
        self._publish = publish
        self._commits = commits
        self._walks = walks
        self._on_quotes = on_quotes

    async def _root(self, room_id: str, root: str) -> ClientEvent | EventNotFound | None:
        stored = await self._store.event(room_id, root)
        if stored is not None:
            return stored.event
        if self._client is None:
            return None
        try:
            event = await self._client.get_event(room_id, root)
        except NotFound:
            return EventNotFound()
        except MatrixError:
            return None  # shown without its root until a later open finds it
        crypto = self.crypto
        if crypto is not None and await crypto.ensure() is not None:  # open before any sync
            [event] = await crypto.decrypt(room_id, [event])
        return event

    async def open(self, room: Room, root: str) -> Answer:
        if root in room.threads:
            return Ok()
        found = await self._root(room.room_id, root)
        if isinstance(found, EventNotFound):
            return found
        if root in room.threads:
            return Ok()
        timeline = Timeline(
            room.room_id,
            self._publish,
            thread_root=root,
            max_rows=self._config.timeline_window,
            on_quotes=self._on_quotes(room.room_id),
        )
        thread = Room(room.room_id, timeline, opening=True, thread_root=root, root_event=found)
        room.threads[root] = thread
        # The thread's own timeline exists in the cache from now on.
        await self._commits.room_write(room.room_id, lambda s: None, thread_root=root)
        window = await self._store.load_window(
            room.room_id, self._config.open_window, thread_root=root
        )
        await timeline.publish_event(timeline.reset(window, self._config.open_window))
        thread.opening = False
        await timeline.flush_history()
        timeline.note_quotes()
        await self._walks.start_recent(thread)
        return Ok()
