"""In-process fan-out of committed notifications to ``Backend.subscribe`` iterators.

Both backends end here: SQLite publishes straight from its writer thread after
COMMIT; PostgreSQL publishes what its LISTEN connection receives (so a payload
sent by another process arrives the same way as one sent by this process).
Publishing happens on a database thread, delivery on each subscriber's event
loop, so the hub only ever hands payloads over with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Callable, Iterable

__all__ = ["NotificationHub", "Subscription"]

_CLOSED = object()


class Subscription:
    """An async iterator of the payloads published on one channel after it was created.

    Payloads are buffered without bound until read: a subscriber that stops
    reading should ``aclose()`` (or leave an ``async for``), which unregisters it.
    Iteration ends when the backend closes.
    """

    __slots__ = ("_buffer", "_closed", "_hub", "_loop", "_waiter", "channel")

    def __init__(self, hub: NotificationHub, channel: str, loop: asyncio.AbstractEventLoop) -> None:
        self._hub = hub
        self.channel = channel
        self._loop = loop
        self._buffer: collections.deque[object] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> str:
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._buffer.popleft()
        if item is _CLOSED:
            self._closed = True
            raise StopAsyncIteration
        assert isinstance(item, str)
        return item

    async def aclose(self) -> None:
        self._hub.unregister(self)
        self._closed = True
        self._buffer.clear()
        self._wake()

    # Runs on the subscriber's loop (scheduled with call_soon_threadsafe).
    def _deliver(self, payloads: list[object]) -> None:
        if self._closed:
            return
        self._buffer.extend(payloads)
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class NotificationHub:
    """Channel -> subscriptions, safe to publish into from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[str, set[Subscription]] = {}
        self._closed = False

    def subscribe(self, channel: str) -> Subscription:
        sub = Subscription(self, channel, asyncio.get_running_loop())
        with self._lock:
            if self._closed:
                sub._closed = True
            else:
                self._subs.setdefault(channel, set()).add(sub)
        return sub

    def has_channel(self, channel: str) -> bool:
        with self._lock:
            return bool(self._subs.get(channel))

    def unregister(self, sub: Subscription) -> None:
        with self._lock:
            subs = self._subs.get(sub.channel)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subs[sub.channel]

    def publish(self, notes: Iterable[tuple[str, str]]) -> None:
        """Hand committed ``(channel, payload)`` pairs to their subscribers, in order."""
        per_sub: dict[Subscription, list[object]] = {}
        with self._lock:
            for channel, payload in notes:
                for sub in self._subs.get(channel, ()):
                    per_sub.setdefault(sub, []).append(payload)
        for sub, payloads in per_sub.items():
            _call_soon(sub._loop, sub._deliver, payloads)

    def close(self) -> None:
        """End every subscription (their iterators stop after the buffered payloads)."""
        with self._lock:
            self._closed = True
            subs = [s for group in self._subs.values() for s in group]
            self._subs.clear()
        for sub in subs:
            _call_soon(sub._loop, sub._deliver, [_CLOSED])


def _call_soon(
    loop: asyncio.AbstractEventLoop, fn: Callable[[list[object]], None], arg: list[object]
) -> None:
    with contextlib.suppress(RuntimeError):  # the subscriber's loop is closed: nobody reads it
        loop.call_soon_threadsafe(fn, arg)
