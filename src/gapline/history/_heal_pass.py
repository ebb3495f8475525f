"""Healing in chunks: the retained events of sessions whose keys arrived, decrypted and
rewritten :data:`CHUNK` at a time, each chunk's write overlapping the next one's
decryption.

The keys are committed before any heal starts (with the sync or the answer that
brought them), and each chunk's write carries its rows, their index entries
dropped and the machine's replay-index rows, so a crash between chunks leaves
only healed rows and rows still indexed; the start-up sweep heals the rest.

While one chunk's write runs on the store's writer thread, the event loop reads
and decrypts the next one: SQLite's own work runs beside the decryption (the
Python binding of vodozemac holds the GIL, so the Python work of the two does
not). Python's cyclic collector is paused for the pass: thousands of events
and their results are alive at once and would make it walk the heap several
times for nothing (none of these objects form cycles).

Runs under the engine's crypto lock, like every heal (see ``_healing``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable, Generator, Iterable
from contextlib import contextmanager
from typing import Any

from gapline.e2ee import DecryptedEvent, RoomKeyId, save_changes
from gapline.history._cache_store import CacheStore
from gapline.history._commits import Commits
from gapline.history._crypto import BATCH, EngineCrypto
from gapline.history._decryption import as_cached
from gapline.history._healing import (
    PendingHeal,
    detached_pending,
    drop_entries,
    heal,
    heal_detached,
    pending_heal,
    retained_chunk,
)
from gapline.history._updates import StoredEvent, Update
from gapline.storage import Tx

__all__ = ["CHUNK", "heal_sessions"]

log = logging.getLogger("gapline.history")

CHUNK = 500

_Chunk = tuple[list[tuple[StoredEvent, bytes, bytes]], list[tuple[bytes, bytes]]]


@contextmanager
def collector_paused() -> Generator[None]:
    """Python's cyclic garbage collector off for the block (as it was, after)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


async def heal_sessions(
    store: CacheStore,
    crypto: EngineCrypto,
    commits: Commits,
    keys: Iterable[RoomKeyId],
    flush: Callable[[str], Awaitable[None]],
) -> list[str]:
    """Heal the retained events of these sessions, room by room; the rooms that changed."""
    by_room: dict[str, set[str]] = {}
    for key in keys:
        by_room.setdefault(key.room_id, set()).add(key.session_id)
    if not by_room or crypto.driver is None:
        return []
    changed: list[str] = []
    with collector_paused():
        for room_id, sessions in by_room.items():
            plan = await store.backend.read(
                lambda tx, r=room_id, s=sessions: pending_heal(store, tx, r, s)
            )
            if plan is not None and await _heal_room(store, crypto, commits, plan, room_id, flush):
                changed.append(room_id)
    return changed


async def _heal_room(
    store: CacheStore,
    crypto: EngineCrypto,
    commits: Commits,
    plan: PendingHeal,
    room_id: str,
    flush: Callable[[str], Awaitable[None]],
) -> bool:
    driver = crypto.driver
    assert driver is not None
    room = plan.room
    healed_any = False
    chunks = [plan.rows[i : i + CHUNK] for i in range(0, len(plan.rows), CHUNK)]
    pending: list[asyncio.Task[Any]] = []  # owned: awaited here, or in the finally

    def reading(rows: list[tuple[int, int, bytes, bytes]]) -> asyncio.Task[_Chunk]:
        task = asyncio.create_task(
            store.backend.read(lambda tx: retained_chunk(store, tx, room, rows)),
            name=f"history-heal-read-{room_id}",
        )
        pending.append(task)
        return task

    try:
        next_read = reading(chunks[0]) if chunks else None
        writing: asyncio.Task[bool] | None = None
        for i in range(len(chunks)):
            assert next_read is not None
            retained, stale = await next_read
            # The next chunk is read while this one decrypts (SQLite's work off the GIL).
            next_read = reading(chunks[i + 1]) if i + 1 < len(chunks) else None
            results = await driver.decrypt_room_events(
                room_id, [s.event for s, _, _ in retained], batch=BATCH
            )
            healed, entries = [], []
            for (s, event, skey), r in zip(retained, results, strict=True):
                if isinstance(r, DecryptedEvent):
                    healed.append(StoredEvent(s.ord, s.pos, as_cached(s.event, r), s.sender_name))
                    entries.append((event, skey))
            changes = crypto.take_changes()
            wrote = False
            if writing is not None:
                wrote = await writing

            def op(
                tx: Tx, healed=healed, entries=entries, stale=stale, changes=changes
            ) -> tuple[bool, dict[str, list[Update]]]:
                if changes is not None:
                    save_changes(tx, changes)
                drop_entries(tx, room, stale)
                return bool(healed), heal(store, tx, room_id, healed, entries)

            writing = asyncio.create_task(commits.run(op), name=f"history-heal-{room_id}")
            pending.append(writing)
            if wrote:  # the last chunk's rows shown while this one is written
                healed_any = True
                await flush(room_id)
        if writing is not None and await writing:
            healed_any = True
            await flush(room_id)
    finally:
        unfinished = [t for t in pending if not t.done()]
        if unfinished:  # the pass failed with a read or a write still running
            for outcome in await asyncio.gather(*unfinished, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    log.warning("a step of a failed heal failed too: %s", outcome)
    if plan.detached or plan.gone:
        healed_any |= await _heal_detached(store, crypto, commits, plan, room_id)
        await flush(room_id)
    return healed_any


async def _heal_detached(
    store: CacheStore, crypto: EngineCrypto, commits: Commits, plan: PendingHeal, room_id: str
) -> bool:
    """Quoted events fetched on their own (few): decrypted and stored in one write."""
    driver = crypto.driver
    assert driver is not None
    room = plan.room
    events, stale = [], list(plan.gone)
    if plan.detached:
        events, more = await store.backend.read(
            lambda tx: detached_pending(store, tx, room, plan.detached)
        )
        stale.extend(more)
    results = await driver.decrypt_room_events(room_id, events, batch=BATCH)
    healed = [
        (e, as_cached(e, r)) for e, r in zip(events, results, strict=True)
        if isinstance(r, DecryptedEvent)
    ]  # fmt: skip
    changes = crypto.take_changes()

    def op(tx: Tx) -> tuple[None, dict[str, list[Update]]]:
        if changes is not None:
            save_changes(tx, changes)
        drop_entries(tx, room, stale)
        return None, heal_detached(store, tx, room_id, healed)

    await commits.run(op)
    return bool(healed)
