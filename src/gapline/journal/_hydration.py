"""Hydration: filling a cold conversation from the homeserver, bounded by the
prompt window.

Two walks, both bounded and both counting *logical messages* (an edit is not
a message):

- a thread: fetch the root, then walk ``/relations`` of the root recursively,
  ``dir=b`` asked for explicitly (never inherited) and no relation-type
  filter. Under MSC3981 the server returns relations in the topological order
  ``/messages`` would, and an edit is sent after the message it revises, so
  every edit arrives *before* its original: the window may stop only right
  after a logical message was taken, with its whole edit tail collected. The
  raw-event ceiling can stop mid-message; that drops an original and keeps
  edits nothing will claim — the harmless direction. The root is kept over
  and above the window: a thread without the message it is about is useless.
- a room: one serialized ``/messages`` traversal backwards from the newest event.

``recursion_depth`` (Synapse reports the constant 3, Tuwunel the depth it
really returned): a non-empty page must carry the field at all — a server
that ignored ``recurse`` omits it — an empty page need not, and no depth
above zero is ever required.

Self-authored progress edits (transport, never content) are dropped here, before anything
reaches the store, because the relation tree holds every one of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from gapline.journal._ingress import MediaDownloader, inbound_event, is_own_progress, resolve_text
from gapline.journal._types import (
    ChunkOutcome,
    ConversationKey,
    Coverage,
    EventKind,
    InboundEvent,
    Provenance,
)
from gapline.journal._views import HydrationView
from gapline.matrix import (
    ClientEvent,
    Direction,
    MatrixError,
    MessagesResponse,
    RelationsResponse,
)

__all__ = [
    "HydrationBounds",
    "HydrationFailed",
    "HydrationSource",
    "Hydrator",
    "RecursionNotHonoured",
    "RoomFetch",
    "StopReason",
    "ThreadFetch",
    "TransportProgressPredicate",
    "fetch_relation_tree",
    "fetch_room",
    "fetch_thread",
    "is_logical_message",
    "replaces_event_id",
]

log = logging.getLogger("gapline.journal.hydration")

MESSAGE_TYPES = frozenset({"m.room.message", "m.room.encrypted", "m.sticker"})


class HydrationSource(Protocol):
    """The slice of `gapline.matrix.MatrixClient` hydration uses."""

    async def get_event(self, room_id: str, event_id: str) -> ClientEvent: ...

    async def relations(
        self,
        room_id: str,
        event_id: str,
        *,
        rel_type: str | None = None,
        event_type: str | None = None,
        dir: Direction | str = Direction.BACKWARD,
        from_: str | None = None,
        to: str | None = None,
        limit: int | None = None,
        recurse: bool | None = None,
    ) -> RelationsResponse: ...

    async def messages(
        self,
        room_id: str,
        *,
        from_: str | None = None,
        to: str | None = None,
        dir: Direction | str = Direction.BACKWARD,
        limit: int | None = None,
        filter: str | Mapping[str, Any] | None = None,
    ) -> MessagesResponse: ...


# (event_type, sender, content) -> True for a self-authored transport-progress edit.
TransportProgressPredicate = Callable[[ClientEvent], bool]


class RecursionNotHonoured(Exception):
    """A non-empty ``/relations?recurse=true`` page came back without ``recursion_depth``:
    the server ignored ``recurse`` and returned only direct children."""


class StopReason(enum.StrEnum):
    COMPLETE = "complete"  # the server had nothing more
    WINDOW = "window"  # the logical-message window was filled
    EVENT_CEILING = "event_ceiling"  # the raw-event ceiling was reached
    REQUEST_BUDGET = "request_budget"  # the request budget was spent


@dataclass(frozen=True, slots=True)
class HydrationBounds:
    """Bounds of one walk. The prompt and an export use different instances."""

    window_messages: int = 50
    max_fetched_events: int = 1_000
    max_requests: int = 20
    page_size: int = 100

    def __post_init__(self) -> None:
        if min(self.window_messages, self.max_fetched_events, self.max_requests) < 1:
            raise ValueError("hydration bounds must be positive")


def replaces_event_id(event: ClientEvent) -> str | None:
    """The event an ``m.replace`` revises, or None for anything else."""
    relates = event.content.get("m.relates_to")
    if isinstance(relates, Mapping) and relates.get("rel_type") == "m.replace":
        target = relates.get("event_id")
        return target if isinstance(target, str) else None
    return None


def is_logical_message(event: ClientEvent) -> bool:
    """A message that occupies a row of its own (not an edit, reaction or state)."""
    return (
        event.type in MESSAGE_TYPES and event.state_key is None and replaces_event_id(event) is None
    )


@dataclass(frozen=True, slots=True)
class ThreadFetch:
    """A thread walk: the root plus its relation tree, newest first as served."""

    root: ClientEvent
    events: tuple[ClientEvent, ...]
    stop: StopReason
    requests: int


@dataclass(frozen=True, slots=True)
class RoomFetch:
    """A room walk, newest first as served. ``end`` is where a later walk resumes."""

    events: tuple[ClientEvent, ...]
    stop: StopReason
    requests: int
    end: str | None


async def fetch_relation_tree(
    source: HydrationSource,
    room_id: str,
    event_id: str,
    bounds: HydrationBounds,
    *,
    is_progress: TransportProgressPredicate,
    requests_used: int = 0,
) -> tuple[tuple[ClientEvent, ...], StopReason, int]:
    """Walk ``event_id``'s relations recursively, ``dir=b``, no type filter, under ``bounds``.

    Shared by thread hydration and the point refetch (one traversal, one set
    of rules). Returns the kept events (progress edits dropped), why the walk
    stopped, and the requests made.
    """
    kept: list[ClientEvent] = []
    raw = logical = 0
    requests = requests_used
    from_: str | None = None
    while True:
        if requests >= bounds.max_requests:
            return tuple(kept), StopReason.REQUEST_BUDGET, requests
        page = await source.relations(
            room_id,
            event_id,
            dir=Direction.BACKWARD,
            from_=from_,
            limit=bounds.page_size,
            recurse=True,
        )
        requests += 1
        if page.chunk and page.recursion_depth is None:
            raise RecursionNotHonoured(
                f"/relations for {event_id} in {room_id} returned {len(page.chunk)} events "
                "without recursion_depth"
            )
        for event in page.chunk:
            raw += 1
            if not is_progress(event):
                kept.append(event)
                if is_logical_message(event):
                    logical += 1
                    if logical >= bounds.window_messages:
                        return tuple(kept), StopReason.WINDOW, requests
            if raw >= bounds.max_fetched_events:
                return tuple(kept), StopReason.EVENT_CEILING, requests
        if not page.next_batch or not page.chunk:
            return tuple(kept), StopReason.COMPLETE, requests
        from_ = page.next_batch


async def fetch_thread(
    source: HydrationSource,
    room_id: str,
    root_id: str,
    bounds: HydrationBounds,
    *,
    is_progress: TransportProgressPredicate,
) -> ThreadFetch:
    """The thread root (kept over and above the window) and its bounded relation tree."""
    root = await source.get_event(room_id, root_id)
    events, stop, requests = await fetch_relation_tree(
        source, room_id, root_id, bounds, is_progress=is_progress, requests_used=1
    )
    return ThreadFetch(root=root, events=events, stop=stop, requests=requests)


async def fetch_room(
    source: HydrationSource,
    room_id: str,
    bounds: HydrationBounds,
    *,
    is_progress: TransportProgressPredicate,
    on_page: Callable[[tuple[ClientEvent, ...]], Any] | None = None,
) -> RoomFetch:
    """One backwards ``/messages`` traversal from the newest event, under ``bounds``.

    ``on_page`` (sync or async) receives each page's kept events as it
    arrives, so the caller can project bounded chunks while the walk goes on.
    Going backwards, an edit (sent later) arrives before its original, so the
    walk stops right after the logical message that fills the window, with
    that message's edit tail already collected — the same rule as a thread.
    """
    kept: list[ClientEvent] = []
    raw = logical = requests = 0
    from_: str | None = None
    end: str | None = None
    while True:
        if requests >= bounds.max_requests:
            return RoomFetch(tuple(kept), StopReason.REQUEST_BUDGET, requests, end)
        page = await source.messages(
            room_id, from_=from_, dir=Direction.BACKWARD, limit=bounds.page_size
        )
        requests += 1
        page_kept: list[ClientEvent] = []
        stop: StopReason | None = None
        for event in page.chunk:
            raw += 1
            if not is_progress(event):
                page_kept.append(event)
                if is_logical_message(event):
                    logical += 1
                    if logical >= bounds.window_messages:
                        stop = StopReason.WINDOW
                        break
            if raw >= bounds.max_fetched_events:
                stop = StopReason.EVENT_CEILING
                break
        kept.extend(page_kept)
        end = page.end
        if on_page is not None and page_kept:
            result = on_page(tuple(page_kept))
            if hasattr(result, "__await__"):
                await result
        if stop is not None:
            return RoomFetch(tuple(kept), stop, requests, end)
        if not page.end or not page.chunk:
            return RoomFetch(tuple(kept), StopReason.COMPLETE, requests, None)
        from_ = page.end


# -- the driver: walks projected in bounded, epoch-checked chunks ------------------------


class HydrationFailed(Exception):
    """A walk could not finish; coverage stays unpublished (a visible readiness failure)."""


def _as_inbound(room_id: str, event: ClientEvent) -> list[InboundEvent]:
    """The projection inputs for one fetched event.

    A redacted event comes back with ``content: {}`` and its redaction under
    ``unsigned.redacted_because``: project the redaction (a tombstone), never
    an empty original.
    """
    because = event.redacted_because
    if because is not None:
        try:
            redaction = msgspec.convert(because, ClientEvent)
        except msgspec.ValidationError:
            return []
        return [
            inbound_event(
                room_id,
                redaction,
                kind=EventKind.REDACTION,
                provenance=Provenance.HISTORY,
            )
        ]
    return [
        inbound_event(room_id, event, kind=EventKind.CONTEXT_ONLY, provenance=Provenance.HISTORY)
    ]


class HydrationDriverSource(HydrationSource, MediaDownloader, Protocol):
    """Hydration's reads plus media download (sidecars)."""


@dataclass
class Hydrator:
    """Hydrates cold conversations; concurrent first readers share one task per key.

    A room has at most one initial ``/messages`` traversal at a time (one lock
    per room). Chunks are projected in bounded transactions, each checked
    against the membership epoch the walk started under; rows from committed
    chunks are additive facts and may be read before the walk ends, but
    coverage is published only by a final transaction after every chunk
    succeeded.
    """

    view: HydrationView
    source: HydrationDriverSource
    principal_id: str
    thread_bounds: HydrationBounds = field(default_factory=HydrationBounds)
    room_bounds: HydrationBounds = field(default_factory=HydrationBounds)
    chunk_size: int = 100
    _inflight: dict[ConversationKey, asyncio.Task[Coverage]] = field(default_factory=dict)
    _room_locks: dict[str, asyncio.Lock] = field(default_factory=dict)

    def _is_progress(self, event: ClientEvent) -> bool:
        return is_own_progress(event, self.principal_id)

    async def ensure(self, key: ConversationKey) -> Coverage:
        """Coverage of ``key``, hydrating it first when it has none."""
        existing = await self.view.coverage(key)
        if existing is not None:
            return existing
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.create_task(self._hydrate(key))
            self._inflight[key] = task
            task.add_done_callback(lambda _t, k=key: self._inflight.pop(k, None))
        return await asyncio.shield(task)

    async def aclose(self) -> None:
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _hydrate(self, key: ConversationKey) -> Coverage:
        lock = self._room_locks.setdefault(key.room_id, asyncio.Lock())
        async with lock:
            existing = await self.view.coverage(key)
            if existing is not None:
                return existing
            epoch = await self.view.epoch(key.room_id)
            try:
                if key.thread_id is None:
                    messages, reached_start = await self._walk_room(key.room_id, epoch)
                else:
                    messages, reached_start = await self._walk_thread(
                        key.room_id, key.thread_id, epoch
                    )
            except (HydrationFailed, RecursionNotHonoured):
                raise
            except MatrixError as exc:
                raise HydrationFailed(f"hydrating {key}: {exc}") from exc
            published = await self.view.publish_coverage(
                key, reached_start=reached_start, messages=messages, expected_epoch=epoch
            )
            if not published:
                raise HydrationFailed(f"membership of {key.room_id} moved during hydration")
            log.info(
                "hydrated",
                extra={
                    "room_id": key.room_id,
                    "thread_id": key.thread_id,
                    "messages": messages,
                    "reached_start": reached_start,
                },
            )
            return Coverage(epoch=epoch, reached_start=reached_start, messages=messages)

    async def _project(self, room_id: str, events: Sequence[ClientEvent], epoch: int) -> None:
        inbound: list[InboundEvent] = []
        # Oldest first inside a chunk: originals before the edits that revise them.
        for event in reversed(events):
            items = _as_inbound(room_id, event)
            if event.redacted_because is None and items:
                resolved = await resolve_text(event, self.source)
                if resolved is not None:
                    items = [dataclasses.replace(items[0], resolved_text=resolved)]
            inbound.extend(items)
        for start in range(0, len(inbound), self.chunk_size):
            outcome = await self.view.project_chunk(
                room_id, inbound[start : start + self.chunk_size], expected_epoch=epoch
            )
            if outcome is ChunkOutcome.STALE_EPOCH:
                raise HydrationFailed(f"membership of {room_id} moved during hydration")

    async def _walk_thread(self, room_id: str, root_id: str, epoch: int) -> tuple[int, bool]:
        fetch = await fetch_thread(
            self.source, room_id, root_id, self.thread_bounds, is_progress=self._is_progress
        )
        # The root is kept over and above the window; the store files it under the room.
        await self._project(room_id, (*fetch.events, fetch.root), epoch)
        messages = sum(1 for e in fetch.events if is_logical_message(e))
        return messages, fetch.stop is StopReason.COMPLETE

    async def _walk_room(self, room_id: str, epoch: int) -> tuple[int, bool]:
        async def project_page(events: tuple[ClientEvent, ...]) -> None:
            await self._project(room_id, events, epoch)

        fetch = await fetch_room(
            self.source,
            room_id,
            self.room_bounds,
            is_progress=self._is_progress,
            on_page=project_page,
        )
        messages = sum(1 for e in fetch.events if is_logical_message(e))
        return messages, fetch.stop is StopReason.COMPLETE
