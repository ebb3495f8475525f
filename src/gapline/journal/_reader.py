"""The conversation read service: bounded pages, strict or not.

A *non-strict* read never waits: it returns the projection as it is and
omits any message whose visible revision was redacted (the store never
returns a body-cleared row). A *strict* read waits for one shared point
refetch of each such message in the page and returns the server's revision,
or raises :class:`StaleConversation` when a repair fails (fail closed).

A cold conversation (no published coverage) is hydrated first when a
:class:`Hydrator` is available; concurrent first readers share one walk. When that
hydration fails, a strict read fails closed with :class:`ConversationNotReady` (a
readiness failure, typed); a non-strict read serves what is projected and says so in
``page.not_ready``. Either way the next read tries the hydration again.

A thread's page carries the thread root over and above the limit; the newest page
a handler reads (no cursor) starts with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from gapline.journal._hydration import (
    HydrationBounds,
    HydrationFailed,
    Hydrator,
    RecursionNotHonoured,
)
from gapline.journal._refetch import PointRefetcher
from gapline.journal._types import ConversationKey, ConversationPage, ConversationRow, Cursor
from gapline.journal._views import ConversationReadView

__all__ = ["BoundConversation", "ConversationNotReady", "ConversationReader", "StaleConversation"]

log = logging.getLogger("gapline.journal.reader")


class StaleConversation(Exception):
    """A strict read could not repair every redacted revision in its page."""

    def __init__(self, key: ConversationKey, event_ids: Sequence[str], reason: str) -> None:
        self.key = key
        self.event_ids = tuple(event_ids)
        super().__init__(
            f"{len(self.event_ids)} message(s) of {key.room_id}"
            f"{'' if key.thread_id is None else ' thread ' + key.thread_id} "
            f"await a point refetch ({reason}): {', '.join(self.event_ids)}"
        )


class ConversationNotReady(Exception):
    """A strict read of a conversation whose hydration failed: what is projected may be
    missing history the server has, so it is not served (fail closed)."""

    def __init__(self, key: ConversationKey, reason: str) -> None:
        self.key = key
        self.reason = reason
        where = key.room_id if key.thread_id is None else f"{key.room_id} thread {key.thread_id}"
        super().__init__(f"{where} is not ready: hydration failed ({reason})")


@dataclass
class ConversationReader:
    """Reads one principal's conversations. ``refetcher`` and ``hydrator`` need a homeserver;
    without them strict reads of damaged pages fail closed and cold reads stay cold."""

    view: ConversationReadView
    refetcher: PointRefetcher | None = None
    hydrator: Hydrator | None = None

    async def read(
        self,
        key: ConversationKey,
        *,
        limit: int,
        before: Cursor | None = None,
        after: Cursor | None = None,
        strict: bool = False,
        bounds: HydrationBounds | None = None,
    ) -> ConversationPage:
        """One bounded page: the newest ``limit`` before ``before``, or the oldest after
        ``after``. ``bounds`` are the hydration bounds a cold conversation is walked with
        (an export passes its own); None is the prompt's."""
        if limit < 1:
            raise ValueError("limit must be positive")
        not_ready: str | None = None
        if self.hydrator is not None:
            try:
                await self.hydrator.ensure(key, bounds)
            except (HydrationFailed, RecursionNotHonoured) as exc:
                # A readiness failure, never a room-wide repair scan: strict reads fail
                # closed, others serve what is projected and say so.
                if strict:
                    raise ConversationNotReady(key, str(exc)) from exc
                not_ready = str(exc)
                log.warning("hydration failed", extra={"room_id": key.room_id, "error": not_ready})
        page = await self._page(key, limit, before, after)
        if not_ready is not None:
            page = dataclasses.replace(page, not_ready=not_ready)
        if not strict or not page.owing_refresh:
            return page
        if self.refetcher is None:
            raise StaleConversation(
                key,
                [d.logical_event_id for d in page.owing_refresh],
                "no homeserver to refetch from",
            )
        refetcher = self.refetcher
        results = await asyncio.gather(
            *(refetcher.refetch(debt) for debt in page.owing_refresh), return_exceptions=True
        )
        failures: list[Exception] = []
        for result in results:
            if isinstance(result, Exception):
                failures.append(result)  # RefetchFailed, or the store/server failing
            elif isinstance(result, BaseException):
                raise result  # cancellation and the like propagate
        page = await self._page(key, limit, before, after)
        if page.owing_refresh:
            reason = str(failures[0]) if failures else "a newer redaction arrived"
            raise StaleConversation(key, [d.logical_event_id for d in page.owing_refresh], reason)
        return page

    async def _page(
        self, key: ConversationKey, limit: int, before: Cursor | None, after: Cursor | None
    ) -> ConversationPage:
        return await self.view.read_conversation(
            key.room_id, key.thread_id, limit, before=before, after=after
        )

    def bind(self, key: ConversationKey) -> BoundConversation:
        return BoundConversation(self, key)


@dataclass(frozen=True)
class BoundConversation:
    """One conversation, as a handler sees it (`gapline.journal.Conversation`)."""

    reader: ConversationReader
    key: ConversationKey

    async def read(
        self, *, limit: int, before: Cursor | None = None, strict: bool = False
    ) -> Sequence[ConversationRow]:
        """The rows of one page, oldest first; the newest page of a thread (no cursor)
        starts with the thread's root, over and above ``limit``."""
        page = await self.reader.read(self.key, limit=limit, before=before, strict=strict)
        if page.root is not None and before is None:
            return (page.root, *page.rows)
        return page.rows
