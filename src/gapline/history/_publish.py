"""How the engine publishes events: an :class:`EventSink` protocol and a fan-out :class:`Publisher`.

The ordering rule: a command's answer comes after its outcome is published,
and after the mirror has applied it when one is attached. The
engine keeps it by awaiting ``publisher.publish(event)`` for every event of a
command's outcome before it resolves that command's answer. ``publish``
returns only when every sink has taken the event: the mirror has applied it,
the bridge has written and flushed its line, a queue has enqueued it.

Sinks are called one after another, in the order they were added, for one
event at a time (publishes are serialised by a lock), so every sink sees the
same order of events. A sink must be quick and must not call back into the
engine (that could deadlock a command waiting on its own publish). A sink that
raises is a bug; the error propagates to the engine's publish call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Protocol, runtime_checkable

from gapline.history._types import Event

__all__ = ["EventQueue", "EventSink", "Publisher"]


@runtime_checkable
class EventSink(Protocol):
    """Something that takes published events, in order."""

    async def publish(self, event: Event) -> None:
        """Take ``event``; return once it is applied / written (the engine waits for it)."""
        ...


class Publisher:
    """Fans each event out to its sinks, in order; itself an :class:`EventSink`.

    The engine holds one Publisher; the bridge, the TUI or a test add their
    sinks (a mirror, a line writer, an :class:`EventQueue`) before commands run.
    """

    def __init__(self, sinks: Iterable[EventSink] = ()) -> None:
        self._sinks: list[EventSink] = list(sinks)
        self._lock = asyncio.Lock()

    def add(self, sink: EventSink) -> None:
        self._sinks.append(sink)

    def remove(self, sink: EventSink) -> None:
        self._sinks.remove(sink)

    async def publish(self, event: Event) -> None:
        # The lock keeps two concurrent publishers (a sync batch and a fill,
        # say) from interleaving across sinks: sink A must not see e1, e2
        # while sink B sees e2, e1.
        async with self._lock:
            for sink in tuple(self._sinks):
                await sink.publish(event)


class EventQueue:
    """A sink that buffers events for a reader: ``async for event in queue``.

    Unbounded on purpose: a slow reader must not stall the engine's commands
    (the answer waits on publish). Call :meth:`close` to end the iteration
    once the events already queued are read.
    """

    def __init__(self) -> None:
        # None marks the close; it is put back when read so every reader ends.
        self._queue: asyncio.Queue[Event | None] = asyncio.Queue()

    async def publish(self, event: Event) -> None:
        self._queue.put_nowait(event)

    def close(self) -> None:
        self._queue.put_nowait(None)

    def pending(self) -> list[Event]:
        """Take every event queued now, without waiting."""
        out: list[Event] = []
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is None:
                self._queue.put_nowait(None)
                break
            out.append(item)
        return out

    async def get(self) -> Event | None:
        """The next event, or ``None`` once the queue is closed and drained."""
        item = await self._queue.get()
        if item is None:
            self._queue.put_nowait(None)
        return item

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Event]:
        while (item := await self.get()) is not None:
            yield item
