"""The point refetch: the one deliberate history repair.

When the visible revision of a message is redacted, admission clears its body
and leaves a durable refresh token. A strict read then asks the server for the
message as every Matrix client now sees it: the original (``GET /event``) and
its relation tree, walked by hydration's own traversal, reduced to the latest
valid same-sender edit by ``(origin_server_ts, event_id)``.

The install is conditional: the membership epoch *and* the exact refresh
token must still match, so a newer edit or redaction admitted meanwhile wins
over an older in-flight refetch. Success clears the token; failure or
cancellation leaves it, and strict reads fail closed until the next strict
read retries. Concurrent strict readers of one message share one refetch.
There is no background refresh worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from gapline.journal._hydration import (
    HydrationBounds,
    HydrationSource,
    fetch_relation_tree,
    replaces_event_id,
)
from gapline.journal._ingress import MediaDownloader, is_own_progress, resolve_text
from gapline.journal._sidecar import sidecar_ref
from gapline.journal._types import RefreshDebt, Revision
from gapline.journal._views import HydrationView
from gapline.matrix import ClientEvent, NotFound

__all__ = ["PointRefetcher", "RefetchFailed", "RefetchSource", "visible_revision"]

log = logging.getLogger("gapline.journal.refetch")


class RefetchSource(HydrationSource, MediaDownloader, Protocol):
    """Hydration's reads plus media download (sidecars)."""


class RefetchFailed(Exception):
    """The server could not be asked, or its revision could not be resolved."""


def _is_redacted(event: ClientEvent) -> bool:
    return event.redacted_because is not None or not event.content


def visible_revision(original: ClientEvent, related: Iterable[ClientEvent]) -> ClientEvent | None:
    """The event whose content is visible now: the latest valid edit, else the original.

    A valid edit is an ``m.replace`` of ``original`` by its own sender that is
    not itself redacted and carries ``m.new_content``. None when the original
    itself is redacted (the message is gone).
    """
    if _is_redacted(original):
        return None
    best: ClientEvent | None = None
    for event in related:
        if (
            replaces_event_id(event) != original.event_id
            or event.sender != original.sender
            or _is_redacted(event)
            or not isinstance(event.content.get("m.new_content"), Mapping)
        ):
            continue
        if best is None or (event.origin_server_ts, event.event_id) > (
            best.origin_server_ts,
            best.event_id,
        ):
            best = event
    return best or original


def _visible_content(event: ClientEvent, original: ClientEvent) -> Mapping[str, Any]:
    if event is original:
        return event.content
    new = event.content.get("m.new_content")
    return new if isinstance(new, Mapping) else {}


@dataclass
class PointRefetcher:
    """Runs point refetches, one shared task per message; owns those tasks."""

    view: HydrationView
    source: RefetchSource
    principal_id: str
    bounds: HydrationBounds = field(default_factory=lambda: HydrationBounds(window_messages=200))
    _inflight: dict[tuple[str, str], asyncio.Task[bool]] = field(default_factory=dict)

    async def refetch(self, debt: RefreshDebt) -> bool:
        """Repair one debt; True when the server's revision is installed (or the debt is
        already gone). Raises `RefetchFailed` when the server could not be asked."""
        key = (debt.room_id, debt.logical_event_id)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._run(debt.room_id, debt.logical_event_id))
            self._inflight[key] = task
            task.add_done_callback(lambda _t, k=key: self._inflight.pop(k, None))
        # Shielded: one reader giving up must not cancel the refetch others wait on.
        return await asyncio.shield(task)

    async def aclose(self) -> None:
        """Cancel running refetches; their tokens stay durable (fail closed)."""
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, room_id: str, logical_event_id: str) -> bool:
        epoch = await self.view.epoch(room_id)
        debt = await self.view.refresh_debt(room_id, logical_event_id)
        if debt is None:
            return True  # repaired meanwhile (or the message is gone)
        try:
            revision = await self._server_revision(room_id, logical_event_id)
        except RefetchFailed:
            raise
        except Exception as exc:
            raise RefetchFailed(f"refetch of {logical_event_id} failed: {exc}") from exc
        installed = await self.view.install_refetched(
            room_id,
            logical_event_id,
            revision,
            expected_epoch=epoch,
            expected_refresh_token=debt.refresh_token,
        )
        log.info(
            "point refetch",
            extra={
                "room_id": room_id,
                "event_id": logical_event_id,
                "installed": installed,
                "revision": None if revision is None else revision.event_id,
            },
        )
        if not installed:
            # Epoch or token moved: a newer fact won. If it left a new debt, a later
            # strict read refetches again; report whether the message is now clean.
            return await self.view.refresh_debt(room_id, logical_event_id) is None
        return True

    async def _server_revision(self, room_id: str, logical_event_id: str) -> Revision | None:
        try:
            original = await self.source.get_event(room_id, logical_event_id)
        except NotFound:
            return None
        if _is_redacted(original):
            return None
        related, _stop, _requests = await fetch_relation_tree(
            self.source,
            room_id,
            logical_event_id,
            self.bounds,
            is_progress=lambda e: is_own_progress(e, self.principal_id),
        )
        visible = visible_revision(original, related)
        if visible is None:
            return None
        content = _visible_content(visible, original)
        resolved: str | None = None
        if sidecar_ref(content) is not None:
            resolved = await resolve_text(visible, self.source)
            if resolved is None:
                raise RefetchFailed(f"sidecar of {visible.event_id} is unresolved")
        return Revision(
            event_id=visible.event_id,
            origin_server_ts=visible.origin_server_ts,
            content=msgspec.json.encode(dict(content)).decode(),
            resolved_text=resolved,
        )
