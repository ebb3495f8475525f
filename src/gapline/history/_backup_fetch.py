"""Keys fetched from the server-side key backup for what a room shows, as it shows it.

A device that holds the key of the backup version in use (one that recovered,
or the one that made it) does not restore the whole backup up front. It asks
the backup for the sessions of what it is about to show:

- **visible rows**: after a room opens and after each sync step, the open
  timelines' undecryptable rows (``MissingRoomKey``, ``UnknownMessageIndex``)
  name their sessions, fetched one ``GET /room_keys/keys/{roomId}/{sessionId}``
  each, and every row whose key came heals in place (``Set`` diffs);
- **a page of a walk** (recent load, fill, back-pagination): the sessions it names
  that this device lacks are fetched before it is decrypted (and, after, those
  known only from a later index), all *before it commits*, so the page lands
  decrypted; the other retained rows of those sessions heal in the background
  task, so the page's fetch adds no write of its own;
- **the rest of the room**, in the background: one task (owned by the engine's
  ``TaskGroup``, cancelled when it closes) takes each opened room in turn,
  ``GET /room_keys/keys/{roomId}``, imports what it lacks, heals, and records
  the room as done for that backup version (``history_backup_done``), so a
  restart does not fetch it again. Rooms go one at a time, each after a pause
  (``pause_s``), and visible rows always go first.

Every session is asked once at a time: a request for a session already in
flight waits for that one. A session the backup does not hold (or holds no
better than we do, or holds an entry that fails its MAC) goes into a negative
cache for the process, so the next page does not ask again; its rows stay
undecryptable with the reason they had. A failed request is logged and asked
again later.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from gapline.e2ee import (
    KeyUpdates,
    RoomKeyId,
    UtdReason,
    fetch_backup_room,
    fetch_backup_sessions,
)
from gapline.history._cache_store import CacheStore
from gapline.history._crypto import EngineCrypto
from gapline.history._decryption import ENCRYPTED, decryption_of
from gapline.history._items import EventItem
from gapline.history._operations import Room
from gapline.matrix import ClientEvent, KeyBackupData, MatrixError
from gapline.storage import Migration, StorageError, Tx

__all__ = ["BACKUP_FETCH_MIGRATIONS", "BACKUP_FETCH_SCHEMA", "BackupFetcher"]

log = logging.getLogger("gapline.history")

BACKUP_FETCH_SCHEMA = "history_backup_fetch"

_SQLITE_V1 = """
CREATE TABLE history_backup_done (
    room BLOB NOT NULL,             -- keyed hash of the room id
    version TEXT NOT NULL,          -- the backup version the room was fetched from
    PRIMARY KEY (room, version)
);
"""

BACKUP_FETCH_MIGRATIONS = [
    Migration(
        1,
        "rooms whose backed-up keys were all fetched",
        sqlite=_SQLITE_V1,
        postgres=_SQLITE_V1.replace("BLOB", "BYTEA"),
    )
]

FETCHABLE = frozenset({UtdReason.MISSING_ROOM_KEY, UtdReason.UNKNOWN_MESSAGE_INDEX})
PAUSE_S = 0.5  # before each room of the background fetch
RESTORE_BATCH = 64  # entries decrypted between two yields to the event loop

Heal = Callable[[KeyUpdates], Awaitable[None]]


class BackupFetcher:
    """On-demand key fetching from the backup for one engine (see the module doc)."""

    def __init__(
        self,
        crypto: EngineCrypto,
        store: CacheStore,
        rooms: Mapping[str, Room],
        heal: Heal,
        *,
        pause_s: float = PAUSE_S,
    ) -> None:
        self._crypto = crypto
        self._store = store
        self._rooms = rooms
        self._heal = heal
        self.pause_s = pause_s
        """Seconds before each room of the background fetch (its rate limit)."""
        self._absent: set[RoomKeyId] = set()
        self._in_flight: dict[RoomKeyId, asyncio.Future[None]] = {}
        self._to_heal: set[RoomKeyId] = set()  # imported for a page, retained rows not healed
        self._queue: collections.deque[str] = collections.deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._migrated = False
        self.asked = 0
        """Sessions asked of the backup one by one in this process (tests, benches)."""

    @property
    def version(self) -> str | None:
        """The backup version keys are fetched from (``None``: fetching is off)."""
        driver = self._crypto.driver
        return None if driver is None else driver.machine.backup.fetchable_version

    # -- what asks -------------------------------------------------------------------------

    def wake(self) -> None:
        """Something may show new undecryptable rows: look at the open rooms again."""
        self._wake.set()

    def opened(self, room_id: str) -> None:
        """A room opened: fetch for its visible rows now, and for the rest of it later."""
        if room_id not in self._queue:
            self._queue.append(room_id)
        self._wake.set()

    def closed(self, room_id: str) -> None:
        with_room = [r for r in self._queue if r != room_id]
        self._queue.clear()
        self._queue.extend(with_room)

    async def before_page(self, room_id: str, events: Iterable[ClientEvent]) -> None:
        """Fetch the sessions of a page's encrypted events that this device lacks, before
        the page is decrypted (so it is decrypted once)."""
        driver = self._crypto.driver
        if driver is None or self.version is None:
            return
        inbound = driver.machine.inbound
        sessions = [
            session_id
            for e in events
            if e.type == ENCRYPTED and e.state_key is None and e.redacted_because is None
            and isinstance(session_id := e.content.get("session_id"), str)
            and inbound.first_known_index(room_id, session_id) is None
        ]  # fmt: skip
        if sessions:
            await self.fetch(room_id, sessions, heal=False)

    async def complete_page(self, room_id: str, events: list[ClientEvent]) -> list[ClientEvent]:
        """A decrypted page, with the events whose keys the backup held decrypted too
        (fetched now, before the page commits: a session known from a later index)."""
        if self.version is None:
            return events
        missing = _missing_sessions(events)
        if not missing:
            return events
        await self.fetch(room_id, missing, heal=False)
        again = [
            i
            for i, e in enumerate(events)
            if (u := decryption_of(e)[1]) is not None
            and u.reason in FETCHABLE
            and RoomKeyId(room_id, u.session_id) not in self._absent
        ]
        if not again:
            return events
        redone = await self._crypto.decrypt(room_id, [events[i] for i in again])
        out = list(events)
        for i, event in zip(again, redone, strict=True):
            out[i] = event
        return out

    async def fetch(
        self, room_id: str, session_ids: Iterable[str], *, heal: bool = True
    ) -> tuple[RoomKeyId, ...]:
        """Fetch these sessions from the backup (each once at a time; the negative cache
        skips what it lacked), import them and heal their retained rows (``heal=False``:
        by the background task, so a page's fetch adds no write of its own; the page's
        commit saves the sessions); the imported."""
        version = self.version
        if version is None:
            return ()
        mine: list[RoomKeyId] = []
        theirs: list[asyncio.Future[None]] = []
        loop = asyncio.get_running_loop()
        for session_id in dict.fromkeys(session_ids):
            key = RoomKeyId(room_id, session_id)
            if not session_id or key in self._absent:
                continue
            running = self._in_flight.get(key)
            if running is not None:
                theirs.append(running)
                continue
            self._in_flight[key] = loop.create_future()
            mine.append(key)
        imported: tuple[RoomKeyId, ...] = ()
        try:
            if mine:
                imported = await self._fetch_now(version, mine, heal=heal)
        finally:
            for key in mine:
                done = self._in_flight.pop(key)
                if not done.done():
                    done.set_result(None)
        if theirs:
            await asyncio.wait(theirs)  # not cancelled with us: their owner settles them
        return imported

    async def _fetch_now(
        self, version: str, keys: Sequence[RoomKeyId], *, heal: bool
    ) -> tuple[RoomKeyId, ...]:
        driver = self._crypto.driver
        assert driver is not None
        self.asked += len(keys)
        try:
            got = await fetch_backup_sessions(driver, keys, version=version)
        except MatrixError as exc:
            log.warning("key backup: fetching %d sessions failed: %s", len(keys), exc)
            return ()
        imported = await self._import(version, got.entries, heal=heal)
        found = set(imported)
        self._absent.update(k for k in keys if k not in found)
        if got.missing:
            log.info("key backup %s lacks %d of %d sessions asked", version,
                     len(got.missing), len(keys))  # fmt: skip
        return imported

    async def _import(
        self, version: str, entries: Sequence[tuple[str, str, KeyBackupData]], *, heal: bool
    ) -> tuple[RoomKeyId, ...]:
        """Import the entries (in batches, under the crypto lock), then heal their rows
        (the heal's write saves the imported sessions too), now or in the background."""
        driver = self._crypto.driver
        assert driver is not None
        inbound = driver.machine.inbound
        todo = [
            (room_id, session_id, entry)
            for room_id, session_id, entry in entries
            if (index := inbound.first_known_index(room_id, session_id)) is None
            or index > entry.first_message_index
        ]
        imported: list[RoomKeyId] = []
        for start in range(0, len(todo), RESTORE_BATCH):
            async with self._crypto.lock:
                report = driver.machine.backup.restore_entries(
                    version, todo[start : start + RESTORE_BATCH]
                )
            imported.extend(report.imported)
            await asyncio.sleep(0)
        if imported and heal:
            await self._heal(KeyUpdates(room_keys=tuple(imported)))
        elif imported:
            self._to_heal.update(imported)
            self._wake.set()
        return tuple(imported)

    # -- the background task ---------------------------------------------------------------

    async def run(self) -> None:
        """The engine's background fetch: visible rows first, then whole rooms, one at a
        time after a pause each (woken meanwhile, visible rows go first again). Runs
        until cancelled; a failure is logged and the room asked again when woken."""
        while True:
            self._idle.set()
            await self._wake.wait()
            self._idle.clear()
            self._wake.clear()
            version = self.version
            if version is None:
                continue
            try:
                if self._to_heal:
                    keys, self._to_heal = tuple(self._to_heal), set()
                    await self._heal(KeyUpdates(room_keys=keys))
                await self._visible_pass()
                while self._queue and not self._wake.is_set():
                    if self.pause_s > 0:
                        self._idle.set()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._wake.wait(), self.pause_s)
                        self._idle.clear()
                        if self._wake.is_set():
                            break
                    room_id = self._queue[0]
                    await self._sweep(room_id, version)
                    if self._queue and self._queue[0] == room_id:
                        self._queue.popleft()
            except (MatrixError, StorageError) as exc:
                log.warning("key backup: background fetch failed (tried again later): %s", exc)

    async def wait_idle(self, *, rooms: bool = True) -> None:
        """Wait until the background task has nothing left to do (tests, benches);
        ``rooms=False``: only until the visible rows are done (whole rooms may wait)."""
        while True:
            await self._idle.wait()
            left = rooms and bool(self._queue) and self.version is not None
            if not self._wake.is_set() and not left:
                return
            await asyncio.sleep(0.01)

    async def _visible_pass(self) -> None:
        for room_id, room in list(self._rooms.items()):
            sessions = [
                item.decryption.session_id
                for item in room.timeline.state.items
                if isinstance(item, EventItem)
                and item.decryption is not None
                and item.decryption.reason in FETCHABLE
            ]
            if sessions:
                await self.fetch(room_id, sessions)

    async def _sweep(self, room_id: str, version: str) -> None:
        """Every backed-up session of the room this device lacks; then the room is done."""
        await self._ensure_schema()
        store = self._store
        room = store.cipher.lookup_key("backup-done:" + room_id)[:16]

        def is_done(tx: Tx) -> bool:
            row = tx.one(
                "SELECT 1 FROM history_backup_done WHERE room = ? AND version = ?",
                (room, version),
            )
            return row is not None

        if await store.backend.read(is_done):
            return
        driver = self._crypto.driver
        assert driver is not None
        got = await fetch_backup_room(driver, room_id, version=version)
        imported = await self._import(version, got.entries, heal=True)
        log.info("key backup %s: %d sessions fetched for a room (%d held already)",
                 version, len(imported), len(got.entries) - len(imported))  # fmt: skip

        def mark(tx: Tx) -> None:
            tx.execute(
                "INSERT INTO history_backup_done (room, version) VALUES (?, ?)"
                " ON CONFLICT DO NOTHING",
                (room, version),
            )

        await store.backend.write(mark)

    async def _ensure_schema(self) -> None:
        if not self._migrated:
            await self._store.backend.migrate(BACKUP_FETCH_SCHEMA, BACKUP_FETCH_MIGRATIONS)
            self._migrated = True


def _missing_sessions(events: Iterable[ClientEvent]) -> list[str]:
    out = []
    for event in events:
        undecrypted = decryption_of(event)[1]
        if undecrypted is not None and undecrypted.reason in FETCHABLE:
            out.append(undecrypted.session_id)
    return list(dict.fromkeys(out))
