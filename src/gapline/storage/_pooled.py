"""What both backends share: a group-commit writer, a reader pool, a
notification hub, and a close that happens once however many callers ask.

A backend subclasses :class:`PooledBackend`, builds its writer sessions and
reader factory, and adds only what is its own (``dialect``, ``subscribe``,
extra resources closed in ``_close_more``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from gapline.storage._backend import Migration
from gapline.storage._errors import BackendClosed
from gapline.storage._migrations import apply_migrations
from gapline.storage._notify import NotificationHub
from gapline.storage._writer import BatchFn, GroupCommitWriter, ReaderPool

__all__ = ["PooledBackend"]

T = TypeVar("T")
ItemT = TypeVar("ItemT")


class PooledBackend:
    def __init__(
        self, hub: NotificationHub, writer: GroupCommitWriter, readers: ReaderPool
    ) -> None:
        self._hub = hub
        self._writer = writer
        self._readers = readers
        self._closed = False
        self._closing: asyncio.Task[None] | None = None

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosed("the backend is closed")

    async def write(self, op: Callable[[Any], T]) -> T:
        self._check_open()
        return await self._writer.write(op)

    async def write_batched(self, fn: BatchFn[ItemT, T], item: ItemT) -> T:
        self._check_open()
        return await self._writer.write_batched(fn, item)

    async def read(self, op: Callable[[Any], T]) -> T:
        self._check_open()
        return await self._readers.read(op)

    async def migrate(self, schema: str, migrations: Sequence[Migration]) -> None:
        await self.write(lambda tx: apply_migrations(tx, schema, migrations))

    async def close(self) -> None:
        self._closed = True
        if self._closing is None:
            # Owned by every caller of close: each awaits it (shielded, so one caller's
            # cancellation does not stop a close another still waits for).
            self._closing = asyncio.create_task(self._close(), name="backend close")
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        await self._writer.close()
        await self._readers.close()
        await self._close_more()
        self._hub.close()

    async def _close_more(self) -> None:
        """Resources of the subclass, closed after the writer and readers, before the hub."""
