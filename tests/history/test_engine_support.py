"""Helpers shared by the engine tests (no tests here): an engine on a fake or real server,
with a mirror and a queue attached, readers of its timeline, and a transport that holds a
chosen request in flight until the test releases it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gapline.history import (
    Engine,
    EngineConfig,
    Event,
    EventItem,
    EventQueue,
    HistoryGapItem,
    HistoryRepairChanged,
    HistoryRepairReport,
    Mirror,
    Publisher,
    RecentHistoryChanged,
    RecentHistoryKind,
)
from gapline.matrix import MatrixClient, RetryPolicy
from gapline.storage import Backend, KdfParams

PASSPHRASE = "correct horse battery staple"
NO_RETRY = RetryPolicy(attempts=1, rate_limit_attempts=1)


async def no_sleep(_seconds: float) -> None:
    return None


@dataclass
class Recorder:
    """An EventSink that keeps every event, and calls ``hook`` on each (before keeping it)."""

    events: list[Event] = field(default_factory=list)
    hook: Callable[[Event], None] | None = None

    async def publish(self, event: Event) -> None:
        if self.hook is not None:
            self.hook(event)
        self.events.append(event)

    def reports(self) -> list[HistoryRepairReport]:
        return [e.report for e in self.events if isinstance(e, HistoryRepairChanged)]

    def recent(self, room_id: str) -> list[RecentHistoryKind]:
        return [
            e.state.kind
            for e in self.events
            if isinstance(e, RecentHistoryChanged) and e.room_id == room_id
        ]


@dataclass(eq=False)
class Hold:
    """One request held in flight: ``arrived`` is set when it reaches the transport, and it
    goes on to the server only once :meth:`release` is called (never, if it is cancelled)."""

    path_suffix: str
    on_call: int
    seen: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)

    def release(self) -> None:
        self.released.set()


class HoldingTransport(httpx.AsyncBaseTransport):
    """A transport in front of another (the fake's, or a real one) that can hold requests.

    Instead of stalling a request for a while and sleeping a guess, a test installs a
    :meth:`hold`, waits on its ``arrived`` event, checks what must hold while the request
    is in flight (the operation runs, the room is busy), then releases it or cancels the
    operation. Every request passes through untouched otherwise.
    """

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self._holds: list[Hold] = []

    def hold(self, path_suffix: str = "/messages", *, on_call: int = 1) -> Hold:
        """Hold the ``on_call``-th request whose path ends with ``path_suffix``, counted
        from now."""
        hold = Hold(path_suffix, on_call)
        self._holds.append(hold)
        return hold

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        for hold in self._holds:
            if hold.arrived.is_set() or not request.url.path.endswith(hold.path_suffix):
                continue
            hold.seen += 1
            if hold.seen == hold.on_call:
                hold.arrived.set()
                await hold.released.wait()
                break
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class Harness:
    engine: Engine
    mirror: Mirror
    recorder: Recorder
    queue: EventQueue


@contextlib.asynccontextmanager
async def open_engine(
    store: Path | Backend,
    client: MatrixClient | None,
    *,
    config: EngineConfig | None = None,
    sync_timeline_limit: int | None = 10,
    **kwargs: Any,
) -> AsyncGenerator[Harness]:
    mirror, recorder, queue = Mirror(), Recorder(), EventQueue()
    publisher = Publisher([mirror, recorder, queue])
    kwargs.setdefault("sync", False)
    kwargs.setdefault("send", client is not None)
    async with Engine.open(
        store,
        client,
        passphrase=kwargs.pop("passphrase", PASSPHRASE),
        sink=publisher,
        config=config,
        kdf_cost=KdfParams.cheap(),
        sync_timeline_limit=sync_timeline_limit,
        **kwargs,
    ) as engine:
        yield Harness(engine, mirror, recorder, queue)


def event_ids(items: Any) -> list[str]:
    return [item.event_id for item in items if isinstance(item, EventItem)]


def gap_rows(items: Any) -> list[HistoryGapItem]:
    return [item for item in items if isinstance(item, HistoryGapItem)]


def assert_mirror_matches(h: Harness, room_id: str) -> None:
    """The mirror (built only from published events) equals the engine's timeline."""
    assert tuple(h.mirror.state.timelines[room_id]) == h.engine.timeline(room_id).state.items
