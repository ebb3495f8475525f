"""Healing in chunks: the retained events of sessions whose keys arrived, read, decrypted
and rewritten :data:`CHUNK` at a time.

The keys are committed before any heal starts (with the sync or the answer that
brought them), and each chunk's write carries its rows, their index entries
dropped and the machine's replay-index rows, so a crash between chunks leaves
only healed rows and rows still indexed; the start-up sweep heals the rest.

This process's steps do not overlap one another. Every one of them holds the GIL
nearly all the time (the Python binding of vodozemac does, and so do the relation
rules, sealing and the rows' objects), and SQLite gives it back at every row it
steps. A read or a write on the store's thread beside the decrypting event loop
then waits for the GIL at every row, and each wait costs more than the row's work:
measured at load 2-4, a heal whose next chunk was read and whose last chunk was
written while the loop decrypted took 3.1-3.3x the bare decrypt calls, and its reads
three times the CPU time they take alone; one step after the other, 2.0-2.1x. Two
things do run beside them, since neither holds the GIL: a chunk's ``COMMIT`` (the
write's statements have run; the next chunk's steps start as soon as they have, and
its rows are shown before the next write), and the decrypt worker.
A heal of :data:`OFFLOAD_MIN` rows or more hands its vodozemac calls to the crypto's
worker process (`gapline.e2ee.DecryptWorkers`), which runs on another core: it holds
:data:`AHEAD` chunks, so while it decrypts the next one this process checks, writes
and shows the oldest, and reads the one after (with one chunk in it, the worker idled
while this process read the next, about 9 ms a chunk). Every check stays in the
machine, so the rows are the same either way; until the worker is ready, or if it
fails, chunks decrypt here. Its first and last chunks are :data:`FIRST` rows: nothing
here starts before the worker answers the first, and the last is checked and written
after the worker is done, so both ends of the pipeline are short. The chunks between
are larger, since every commit rewrites most pages of the session's index (its entries
are in hash order, a chunk's rows in conversation order) and the checkpoint later
copies every page the WAL received: this process's CPU fell about 10% from chunks of
500 to 1,000, and 10% again to 2,000 (alternating runs, load 1.6-2.4); 3,000 did no
better.
Python's cyclic collector is paused for the pass: thousands of events
and their results are alive at once and would make it walk the heap several
times for nothing (none of these objects form cycles).

Runs under the engine's crypto lock, like every heal (see ``_healing``).
"""

from __future__ import annotations

import asyncio
import gc
from collections import deque
from collections.abc import Awaitable, Callable, Generator, Iterable
from contextlib import contextmanager

from gapline.e2ee import DecryptedEvent, DecryptWorker, RoomKeyId, save_changes
from gapline.history._cache_store import CacheStore
from gapline.history._commits import Commits, StatementsRan
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

__all__ = ["CHUNK", "OFFLOAD_MIN", "heal_sessions"]


CHUNK = 2000
# A heal in the worker starts and ends with a smaller chunk (see the module doc).
FIRST = 500
# A heal of this many rows or more decrypts in a worker process beside this one (the
# crypto's `gapline.e2ee.DecryptWorkers`, kept between heals); fewer cost tens of
# milliseconds in-process, less than handing them over.
OFFLOAD_MIN = 1000
# How many chunks the worker holds at once during a heal (the one it decrypts and the
# next, waiting in its pipe).
AHEAD = 2

_Row = tuple[int, int, bytes, bytes]  # a pending entry's (ord, pos, event hash, session hash)
_Chunk = tuple[list[tuple[StoredEvent, bytes, bytes]], list[tuple[bytes, bytes]]]


@contextmanager
def collector_paused() -> Generator[None]:
    """Python's cyclic garbage collector off for the block (as it was, after).

    What the block allocated and kept joins the oldest generation without being
    traversed (``freeze`` then ``unfreeze`` move every generation's list there and
    reset the young count; no object is visited): re-enabled as it was, the collector
    walked all of it in one young collection at the next allocation, finding nothing,
    27-58 ms after a 10,000-row heal. Not when the process froze objects itself
    (``unfreeze`` would hand them back to the collector)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
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
        plans: list[tuple[str, PendingHeal]] = []
        for room_id, sessions in by_room.items():
            plan = await store.backend.read(
                lambda tx, r=room_id, s=sessions: pending_heal(store, tx, r, s)
            )
            if plan is not None:
                plans.append((room_id, plan))
        large = sum(len(plan.rows) for _, plan in plans) >= OFFLOAD_MIN
        worker = await crypto.decrypt_workers.get() if large else None
        try:
            for room_id, plan in plans:
                if await _heal_room(store, crypto, commits, plan, room_id, flush, worker):
                    changed.append(room_id)
        finally:
            if worker is not None:
                await worker.forget()  # the worker keeps no key between heals
    return changed


async def _heal_room(
    store: CacheStore,
    crypto: EngineCrypto,
    commits: Commits,
    plan: PendingHeal,
    room_id: str,
    flush: Callable[[str], Awaitable[None]],
    worker: DecryptWorker | None,
) -> bool:
    driver = crypto.driver
    assert driver is not None
    room = plan.room
    healed_any = False
    chunks = _chunks(plan.rows, FIRST if worker is not None else CHUNK, CHUNK)

    async def read(rows: list[_Row]) -> _Chunk:
        return await store.backend.read(lambda tx: retained_chunk(store, tx, room, rows))

    async def send(chunk: _Chunk) -> bool:
        """The chunk to the worker, if there is one and it is ready."""
        events = [s.event for s, _, _ in chunk[0]]
        return worker is not None and await worker.send(driver.machine, room_id, events)

    ahead: deque[tuple[_Chunk, bool]] = deque()  # read, each with: handed to the worker
    unread = iter(chunks)

    async def top_up(depth: int) -> None:
        """Read (and hand to the worker) the next chunks until ``depth`` are ahead."""
        while len(ahead) < depth and (rows := next(unread, None)) is not None:
            chunk = await read(rows)
            ahead.append((chunk, await send(chunk)))

    writing: asyncio.Task[bool] | None = None  # the last chunk's write, not yet shown
    try:
        for _ in chunks:
            # With the worker, AHEAD chunks are in it while this process checks, writes
            # and shows the oldest, so it finds the next one waiting when it is done
            # (with one, it idled while this process read the next: about 9 ms a chunk).
            # The rows differ and a write touches only its own chunk's, so a read sees
            # what it would after the writes before it; this process's steps stay one
            # after the other (but for a COMMIT, below). In-process there is nothing to
            # overlap: read, then write.
            await top_up(AHEAD if worker is not None and worker.usable else 1)
            (retained, stale), sent = ahead.popleft()
            raw = await worker.receive() if sent and worker is not None else None
            results = await driver.decrypt_room_events(
                room_id, [s.event for s, _, _ in retained], batch=BATCH, raw=raw
            )
            healed, entries = [], []
            for (s, event, skey), r in zip(retained, results, strict=True):
                if isinstance(r, DecryptedEvent):
                    healed.append(StoredEvent(s.ord, s.pos, as_cached(s.event, r), s.sender_name))
                    entries.append((event, skey))
            if writing is not None:
                done, writing = writing, None
                healed_any |= await _shown(done, flush, room_id)
            changes = crypto.take_changes()
            ran = StatementsRan()

            def op(
                tx: Tx, healed=healed, entries=entries, stale=stale, changes=changes, ran=ran
            ) -> tuple[bool, dict[str, list[Update]]]:
                if changes is not None:
                    save_changes(tx, changes)
                drop_entries(tx, room, stale)
                updates = heal(store, tx, room_id, healed, entries)
                ran()
                return bool(healed), updates

            writing = commits.start(op)
            # The next chunk's steps start once this write's statements have run: its
            # COMMIT (the chunk's pages to the WAL and an fsync, 4-8 ms, without the GIL)
            # then runs beside them instead of before them; the next write waits for
            # it, and its rows are shown before that write.
            await ran.wait(writing)
        if writing is not None:
            done, writing = writing, None
            healed_any |= await _shown(done, flush, room_id)
    finally:
        if writing is not None:  # a step after it failed: the write still lands
            await asyncio.shield(writing)
    if plan.detached or plan.gone:
        healed_any |= await _heal_detached(store, crypto, commits, plan, room_id)
        await flush(room_id)
    return healed_any


def _chunks(rows: list[_Row], ends: int, size: int) -> list[list[_Row]]:
    """``rows`` cut into chunks of ``size`` between a first and a last of ``ends``."""
    head = rows[:ends]
    tail = rows[max(len(head), len(rows) - ends) :]
    middle = rows[len(head) : len(rows) - len(tail)]
    chunks = [head, *(middle[i : i + size] for i in range(0, len(middle), size)), tail]
    return [c for c in chunks if c]


async def _shown(
    writing: asyncio.Task[bool], flush: Callable[[str], Awaitable[None]], room_id: str
) -> bool:
    """A chunk's write committed, and its rows shown if any healed. Shielded, as
    `Commits.run` is: a heal cancelled here stops waiting, and its write still lands and
    still queues its updates."""
    healed = await asyncio.shield(writing)
    if healed:
        await flush(room_id)
    return healed


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
