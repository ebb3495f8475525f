"""Waiting on what a component under test does, instead of sleeping.

A test wires the seams of the component it runs to the running loop's
:class:`Activity`: its HTTP transport (:meth:`Activity.transport`), its storage backend
(:meth:`Activity.backend`), a child process's log stream (:meth:`Activity.pump`). Every
answered request, committed write and log line raises the signal, and
:meth:`Activity.until` re-checks its condition on each one. Nothing is assumed to have
happened after a delay: the only clock is the guard that turns a hang into a failure.

A :class:`Gate` holds one request to a homeserver endpoint until the test lets it
through, so "while that request is in flight" is a state the test reaches on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import IO, Any, TypeVar

import httpx

from gapline.storage import Backend, Dialect, Migration, Tx

T = TypeVar("T")

_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Activity] = (
    weakref.WeakKeyDictionary()
)


class Activity:
    """One loop's "something happened" signal (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._changed = asyncio.Event()

    @classmethod
    def current(cls) -> Activity:
        """The running loop's activity (one per test: each test runs its own loop)."""
        loop = asyncio.get_running_loop()
        activity = _BY_LOOP.get(loop)
        if activity is None:
            activity = _BY_LOOP[loop] = cls(loop)
        return activity

    def bump(self) -> None:
        self._changed.set()

    def bump_threadsafe(self) -> None:
        """:meth:`bump` from another thread (a pump). After the test's loop closed there
        is nobody left to wake, and the call is dropped."""
        with contextlib.suppress(RuntimeError):  # "Event loop is closed"
            self._loop.call_soon_threadsafe(self._changed.set)

    async def until(
        self, probe: Callable[[], Awaitable[T | None]], *, what: str, within: float
    ) -> T:
        """The first value of ``probe`` that is neither None nor False, probed once now
        and again after each signal. ``within`` only guards against a hang."""
        try:
            async with asyncio.timeout(within):
                while True:
                    # Cleared before probing: a change during the probe is not lost.
                    self._changed.clear()
                    value = await probe()
                    if value is not None and value is not False:
                        return value
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}") from None

    def transport(self, inner: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
        """``inner``, signalling once each request has been answered."""
        return _ObservedTransport(inner, self)

    def backend(self, inner: Backend) -> Backend:
        """``inner``, signalling once each write has committed."""
        return _ObservedBackend(inner, self)

    def pump(self, source: IO[bytes], sink: IO[bytes]) -> threading.Thread:
        """Copy a child's output line by line into ``sink`` (flushed), signalling after
        each line. The thread owns both files and ends with the stream, when the child
        exits."""

        def copy() -> None:
            with source, sink:
                for line in source:
                    sink.write(line)
                    sink.flush()
                    self.bump_threadsafe()

        thread = threading.Thread(target=copy, name="activity-pump", daemon=True)
        thread.start()
        return thread


class _ObservedTransport(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport, activity: Activity) -> None:
        self._inner = inner
        self._activity = activity

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self._inner.handle_async_request(request)
        finally:
            self._activity.bump()

    async def aclose(self) -> None:
        await self._inner.aclose()


class _ObservedBackend:
    def __init__(self, inner: Backend, activity: Activity) -> None:
        self._inner = inner
        self._activity = activity

    @property
    def dialect(self) -> Dialect:
        return self._inner.dialect

    async def write(self, op: Callable[[Tx], T]) -> T:
        try:
            return await self._inner.write(op)
        finally:
            self._activity.bump()

    async def write_batched(
        self, fn: Callable[[Tx, list[Any]], Sequence[T | BaseException]], item: Any
    ) -> T:
        try:
            return await self._inner.write_batched(fn, item)
        finally:
            self._activity.bump()

    async def read(self, op: Callable[[Tx], T]) -> T:
        return await self._inner.read(op)

    async def migrate(self, schema: str, migrations: Sequence[Migration]) -> None:
        await self._inner.migrate(schema, migrations)

    def subscribe(self, channel: str) -> AsyncIterator[str]:
        return self._inner.subscribe(channel)

    async def close(self) -> None:
        await self._inner.close()


def endpoint_of(request: httpx.Request) -> str:
    """The room endpoint a client-server request names (``messages``, ``event``,
    ``relations``, ...), else its last path segment."""
    segments = request.url.raw_path.decode("ascii").split("?", 1)[0].split("/")
    if "rooms" in segments:
        tail = segments[segments.index("rooms") + 2 :]
        if tail:
            return tail[0]
    return segments[-1]


class Gate(httpx.AsyncBaseTransport):
    """``inner``, holding the ``call``-th request to ``endpoint`` until :meth:`release`.

    ``arrived`` is set once that request reached the gate (it is in flight: sent by the
    client, not yet answered); every other request passes straight through.
    """

    def __init__(self, inner: httpx.AsyncBaseTransport, endpoint: str, *, call: int = 1) -> None:
        self._inner = inner
        self._endpoint = endpoint
        self._call = call
        self._seen = 0
        self.arrived = asyncio.Event()
        self._released = asyncio.Event()

    def release(self) -> None:
        self._released.set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if endpoint_of(request) == self._endpoint:
            self._seen += 1
            if self._seen == self._call:
                self.arrived.set()
                await self._released.wait()
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()
