"""The conversation read service: bounded pages, strict or not.

A *non-strict* read never waits: it returns the projection as it is and
omits any message whose visible revision was redacted (the store never
returns a body-cleared row). A *strict* read waits for one shared point
refetch of each such message in the page and returns the server's revision,
or raises :class:`StaleConversation` when a repair fails (fail closed).

A cold conversation (no published coverage) is hydrated first when a
:class:`Hydrator` is available; concurrent first readers share one walk.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from gapline.journal._hydration import HydrationFailed, Hydrator
from gapline.journal._refetch import PointRefetcher
from gapline.journal._types import ConversationKey, ConversationPage, ConversationRow, Cursor
from gapline.journal._views import ConversationReadView

__all__ = ["BoundConversation", "ConversationReader", "StaleConversation"]

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
        strict: bool = False,
    ) -> ConversationPage:
        if limit < 1:
            raise ValueError("limit must be positive")
        if self.hydrator is not None:
            try:
                await self.hydrator.ensure(key)
            except HydrationFailed as exc:
                # Readiness failure: serve what is projected, loudly, rather than
                # reviving a room-wide repair scan.
                log.warning("hydration failed", extra={"room_id": key.room_id, "error": str(exc)})
        page = await self.view.read_conversation(key.room_id, key.thread_id, limit, before=before)
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
        page = await self.view.read_conversation(key.room_id, key.thread_id, limit, before=before)
        if page.owing_refresh:
            reason = str(failures[0]) if failures else "a newer redaction arrived"
            raise StaleConversation(key, [d.logical_event_id for d in page.owing_refresh], reason)
        return page

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
        page = await self.reader.read(self.key, limit=limit, before=before, strict=strict)
        return page.rows
