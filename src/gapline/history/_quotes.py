"""Fetching replied-to events the cache does not hold: once each, with ``/context``.

A loaded reply whose quoted event the cache does not hold quotes it as
``Pending``; its timeline tells :class:`Quotes`, which asks the homeserver for
that event (``/context/{event_id}?limit=0``, one request at a time per room)
and keeps the answer as a detached event of the room, or keeps that the
server would not return it (not found, not visible, another room's): the
quote then says ``Unavailable``. A fetched event that cannot be decrypted yet
is indexed like any retained one, and heals (its quotes with it) when its key
arrives. Either way an event is asked for once per
engine; a server that is unavailable leaves the quote pending.

Tasks: one fetcher per open room at most, in the engine's ``TaskGroup``;
closing the room cancels and awaits it (:meth:`Quotes.forget`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gapline.history._commits import Commits
from gapline.history._crypto import EngineCrypto
from gapline.history._healing import index_undecrypted
from gapline.history._sections import Sections
from gapline.matrix import (
    ClientEvent,
    Forbidden,
    MatrixClient,
    MatrixError,
    MatrixHTTPError,
    NotFound,
)

__all__ = ["Quotes"]

log = logging.getLogger("gapline.history")


def _keep(sections: Sections, event_id: str, event: ClientEvent | None, decrypted: bool) -> None:
    """Store the fetched event detached; one that the crypto machine could not decrypt
    is indexed, so the quote heals when the key arrives."""
    sections.detach(event_id, event)
    if event is not None and decrypted:
        index_undecrypted(sections.store, sections.tx, sections.room_id, [event])


class Quotes:
    """Fetches quoted events for the engine's open rooms."""

    def __init__(
        self,
        client: MatrixClient | None,
        commits: Commits,
        tg: asyncio.TaskGroup,
        flush: Callable[[str], Awaitable[None]],
        crypto: EngineCrypto | None = None,
    ) -> None:
        self._crypto = crypto
        self._client = client
        self._commits = commits
        self._tg = tg
        self._flush = flush
        self._asked: set[tuple[str, str]] = set()
        self._wanted: dict[str, list[str]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def want(self, room_id: str, event_ids: set[str]) -> None:
        """Quotes of ``event_ids`` in ``room_id`` are pending: fetch the ones not asked yet."""
        if self._client is None:
            return
        fresh = sorted(e for e in event_ids if (room_id, e) not in self._asked)
        if not fresh:
            return
        self._asked.update((room_id, e) for e in fresh)
        self._wanted.setdefault(room_id, []).extend(fresh)
        task = self._tasks.get(room_id)
        if task is None or task.done():
            self._tasks[room_id] = self._tg.create_task(
                self._run(room_id), name=f"history-quotes-{room_id}"
            )

    async def _run(self, room_id: str) -> None:
        client = self._client
        assert client is not None
        wanted = self._wanted.get(room_id, [])
        while wanted:
            event_id = wanted.pop(0)
            try:
                found = await client.context(room_id, event_id, limit=0)
                event = found.event
            except (NotFound, Forbidden):
                event = None
            except MatrixHTTPError as exc:
                if exc.status >= 500:
                    log.info("quoted event %s not fetched: %s", event_id, exc)
                    continue
                event = None  # refused for good (a bad id, another room's event)
            except MatrixError as exc:
                log.info("quoted event %s not fetched: %s", event_id, exc)
                continue
            if event is not None and event.event_id != event_id:
                event = None
            crypto = self._crypto
            tried = event is not None and crypto is not None and await crypto.ensure() is not None
            if tried:
                assert event is not None and crypto is not None
                [event] = await crypto.decrypt(room_id, [event])
            await self._commits.room_write(
                room_id, lambda s, e=event, i=event_id, t=tried: _keep(s, i, e, t)
            )
            await self._flush(room_id)
        self._wanted.pop(room_id, None)

    async def wait(self) -> None:
        """Return once no fetch runs (tests and tools)."""
        while running := [t for t in self._tasks.values() if not t.done()]:
            await asyncio.gather(*running, return_exceptions=True)

    async def forget(self, room_id: str) -> None:
        """The room closed: stop fetching for it."""
        self._wanted.pop(room_id, None)
        task = self._tasks.pop(room_id, None)
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
