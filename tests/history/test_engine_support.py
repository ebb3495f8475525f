"""Helpers shared by the engine tests (no tests here): an engine on a fake or real server,
with a mirror and a queue attached, and readers of its timeline."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
