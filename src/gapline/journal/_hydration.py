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
  It is filed under the thread by its id: the root keeps its one row in the
  room's timeline (where every client shows it), a thread's key *is* that id,
  and every read of the thread returns the row (``ConversationPage.root``).
- a room: one serialized ``/messages`` traversal backwards from the newest event.

The window is the caller's: a prompt hydrates with the default bounds, an export
with its own far larger ones (``EXPORT_BOUNDS``), and a conversation covered by a
shorter walk that did not reach its start is walked again, deeper, when a caller
asks for more than it holds.

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
from functools import partial
from typing import Any, Protocol

import msgspec

from gapline.journal._ingress import MediaDownloader, inbound_event, is_own_progress, resolve_text
from gapline.journal._timeline import TimelineSource
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
    RelationsResponse,
)

__all__ = [
    "EXPORT_BOUNDS",
    "EXPORT_MAX_FETCHED_EVENTS",
    "EXPORT_MAX_MESSAGES_REQUESTS",
    "EXPORT_WINDOW_MESSAGES",
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


class HydrationSource(TimelineSource, Protocol):
    """The slice of `gapline.matrix.MatrixClient` hydration uses (``messages`` is the
    timeline completion's own)."""

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


# An export's bounds: far above a prompt's (a model cannot use more than a window, an
# export wants the conversation), and still bounds, so one pathological conversation
# cannot walk forever; an export that stops at one says so rather than hanging.
EXPORT_WINDOW_MESSAGES = 500_000
EXPORT_MAX_FETCHED_EVENTS = 2_000_000
EXPORT_MAX_MESSAGES_REQUESTS = 10_000
EXPORT_BOUNDS = HydrationBounds(
    window_messages=EXPORT_WINDOW_MESSAGES,
    max_fetched_events=EXPORT_MAX_FETCHED_EVENTS,
    max_requests=EXPORT_MAX_MESSAGES_REQUESTS,
    page_size=500,
)


def covers(coverage: Coverage | None, bounds: HydrationBounds | None) -> bool:
    """Whether ``coverage`` serves a read asking for ``bounds`` (None: any coverage)."""
    if coverage is None:
        return False
    if bounds is None or coverage.reached_start:
        return True
    return coverage.messages >= bounds.window_messages


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
    """A thread walk: the root plus its relation tree, newest first as served (empty
    when the walk handed its pages to ``on_page`` instead of keeping them)."""

    root: ClientEvent
    events: tuple[ClientEvent, ...]
    stop: StopReason
    requests: int
    messages: int = 0  # logical messages walked (the root not counted)


@dataclass(frozen=True, slots=True)
class RoomFetch:
    """A room walk, newest first as served (empty with ``on_page``). ``end`` is where a
    later walk resumes."""

    events: tuple[ClientEvent, ...]
    stop: StopReason
    requests: int
    end: str | None
    messages: int = 0


# Receives each page's kept events as the walk goes on (sync or async): the caller
# projects bounded chunks, and the walk keeps nothing itself.
PageSink = Callable[[tuple[ClientEvent, ...]], Any]


class _Walk:
    """The counting both walks share: raw events against the ceiling, logical messages
    against the window, and where the kept events go."""

    def __init__(self, bounds: HydrationBounds, is_progress: TransportProgressPredicate) -> None:
        self.bounds = bounds
        self.is_progress = is_progress
        self.raw = 0
        self.logical = 0
        self.kept: list[ClientEvent] = []

    def take(self, chunk: Sequence[ClientEvent]) -> tuple[list[ClientEvent], StopReason | None]:
        """The page's kept events, and why the walk stops inside it (None: it goes on).
        The window stops only right after a logical message was taken."""
        page: list[ClientEvent] = []
        for event in chunk:
            self.raw += 1
            if not self.is_progress(event):
                page.append(event)
                if is_logical_message(event):
                    self.logical += 1
                    if self.logical >= self.bounds.window_messages:
                        return page, StopReason.WINDOW
            if self.raw >= self.bounds.max_fetched_events:
                return page, StopReason.EVENT_CEILING
        return page, None

    async def hand(self, page: list[ClientEvent], on_page: PageSink | None) -> None:
        if on_page is None:
            self.kept.extend(page)
        elif page:
            result = on_page(tuple(page))
            if hasattr(result, "__await__"):
                await result


async def fetch_relation_tree(
    source: HydrationSource,
    room_id: str,
    event_id: str,
    bounds: HydrationBounds,
    *,
    is_progress: TransportProgressPredicate,
    requests_used: int = 0,
    on_page: PageSink | None = None,
) -> tuple[tuple[ClientEvent, ...], StopReason, int]:
    """Walk ``event_id``'s relations recursively, ``dir=b``, no type filter, under ``bounds``.

    Shared by thread hydration and the point refetch (one traversal, one set
    of rules). Returns the kept events (progress edits dropped; none when
    ``on_page`` took them), why the walk stopped, and the requests made.
    """
    walk = _Walk(bounds, is_progress)
    stop, requests, _ = await _relation_walk(
        source, room_id, event_id, walk, requests_used, on_page
    )
    return tuple(walk.kept), stop, requests


async def _relation_walk(
    source: HydrationSource,
    room_id: str,
    event_id: str,
    walk: _Walk,
    requests: int,
    on_page: PageSink | None,
) -> tuple[StopReason, int, int]:
    from_: str | None = None
    while True:
        if requests >= walk.bounds.max_requests:
            return StopReason.REQUEST_BUDGET, requests, walk.logical
        page = await source.relations(
            room_id,
            event_id,
            dir=Direction.BACKWARD,
            from_=from_,
            limit=walk.bounds.page_size,
            recurse=True,
        )
        requests += 1
        if page.chunk and page.recursion_depth is None:
            raise RecursionNotHonoured(
                f"/relations for {event_id} in {room_id} returned {len(page.chunk)} events "
                "without recursion_depth"
            )
        kept, stop = walk.take(page.chunk)
        await walk.hand(kept, on_page)
        if stop is not None:
            return stop, requests, walk.logical
        if not page.next_batch or not page.chunk:
            return StopReason.COMPLETE, requests, walk.logical
        from_ = page.next_batch


async def fetch_thread(
    source: HydrationSource,
    room_id: str,
    root_id: str,
    bounds: HydrationBounds,
    *,
    is_progress: TransportProgressPredicate,
    on_page: PageSink | None = None,
) -> ThreadFetch:
    """The thread root (kept over and above the window) and its bounded relation tree.

    With ``on_page`` the root goes to it first, then each page of the tree."""
    root = await source.get_event(room_id, root_id)
    walk = _Walk(bounds, is_progress)
    if on_page is not None:
        await walk.hand([root], on_page)
    stop, requests, messages = await _relation_walk(source, room_id, root_id, walk, 1, on_page)
    return ThreadFetch(
        root=root, events=tuple(walk.kept), stop=stop, requests=requests, messages=messages
    )


async def fetch_room(
    source: HydrationSource,
    room_id: str,
    bounds: HydrationBounds,
    *,
    is_progress: TransportProgressPredicate,
    on_page: PageSink | None = None,
) -> RoomFetch:
    """One backwards ``/messages`` traversal from the newest event, under ``bounds``.

    ``on_page`` (sync or async) receives each page's kept events as it
    arrives, so the caller can project bounded chunks while the walk goes on.
    Going backwards, an edit (sent later) arrives before its original, so the
    walk stops right after the logical message that fills the window, with
    that message's edit tail already collected — the same rule as a thread.
    """
    walk = _Walk(bounds, is_progress)
    requests = 0
    from_: str | None = None
    end: str | None = None
    while True:
        if requests >= bounds.max_requests:
            return RoomFetch(
                tuple(walk.kept), StopReason.REQUEST_BUDGET, requests, end, walk.logical
            )
        page = await source.messages(
            room_id, from_=from_, dir=Direction.BACKWARD, limit=bounds.page_size
        )
        requests += 1
        kept, stop = walk.take(page.chunk)
        await walk.hand(kept, on_page)
        end = page.end
        if stop is not None:
            return RoomFetch(tuple(walk.kept), stop, requests, end, walk.logical)
        if not page.end or not page.chunk:
            return RoomFetch(tuple(walk.kept), StopReason.COMPLETE, requests, None, walk.logical)
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

    async def ensure(self, key: ConversationKey, bounds: HydrationBounds | None = None) -> Coverage:
        """Coverage of ``key``, hydrating it first when it has none, or when ``bounds``
        ask for more than a walk that stopped short of the start covered."""
        existing = await self.view.coverage(key)
        if covers(existing, bounds):
            assert existing is not None
            return existing
        task = self._inflight.get(key)
        if task is not None and not task.done():
            coverage = await asyncio.shield(task)
            if covers(coverage, bounds):
                return coverage
        task = self._inflight.get(key)
        if task is None or task.done():
            task = asyncio.create_task(self._hydrate(key, bounds))
            self._inflight[key] = task
            task.add_done_callback(partial(self._forget, key))
        return await asyncio.shield(task)

    def _forget(self, key: ConversationKey, task: asyncio.Task[Coverage]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]

    async def aclose(self) -> None:
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _hydrate(self, key: ConversationKey, bounds: HydrationBounds | None) -> Coverage:
        lock = self._room_locks.setdefault(key.room_id, asyncio.Lock())
        async with lock:
            existing = await self.view.coverage(key)
            if covers(existing, bounds):
                assert existing is not None
                return existing
            epoch = await self.view.epoch(key.room_id)
            try:
                if key.thread_id is None:
                    messages, reached_start = await self._walk_room(
                        key.room_id, epoch, bounds or self.room_bounds
                    )
                else:
                    messages, reached_start = await self._walk_thread(
                        key.room_id, key.thread_id, epoch, bounds or self.thread_bounds
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

    async def _walk_thread(
        self, room_id: str, root_id: str, epoch: int, bounds: HydrationBounds
    ) -> tuple[int, bool]:
        async def project_page(events: tuple[ClientEvent, ...]) -> None:
            await self._project(room_id, events, epoch)

        # The root comes first (the oldest), kept over and above the window, projected in
        # its own room row; the thread's reads return it by the thread's key, its id.
        # Every page is projected as it arrives, in bounded chunks: nothing is kept.
        fetch = await fetch_thread(
            self.source,
            room_id,
            root_id,
            bounds,
            is_progress=self._is_progress,
            on_page=project_page,
        )
        return fetch.messages, fetch.stop is StopReason.COMPLETE

    async def _walk_room(
        self, room_id: str, epoch: int, bounds: HydrationBounds
    ) -> tuple[int, bool]:
        async def project_page(events: tuple[ClientEvent, ...]) -> None:
            await self._project(room_id, events, epoch)

        fetch = await fetch_room(
            self.source,
            room_id,
            bounds,
            is_progress=self._is_progress,
            on_page=project_page,
        )
        return fetch.messages, fetch.stop is StopReason.COMPLETE
