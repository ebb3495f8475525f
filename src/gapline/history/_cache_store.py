"""The durable event cache: a room's sections of events and the gaps between them.

Layout (schema ``history``, migrations below, every column commented there):

- ``history_event``: one row per retained event, keyed ``(room, ord, pos)``
  (see ``_updates.py`` for the key). SQLite stores it ``WITHOUT ROWID`` so the
  primary key *is* the table: opening a room reads the newest window with one
  backwards range scan, ``LIMIT``'d, touching only the rows it returns;
  nothing counts or scans the room, so it costs the same at 1,000 and at
  1,000,000 retained events.
- ``history_gap``: one row per gap, keyed by the section it precedes
  (``newer_ord``); a section has at most one gap before it.
- ``history_room``, ``history_meta``, ``history_sync``: rooms seen, receipts
  and the read marker, and the sync token.

At rest: event bodies, cursors, boundaries, failures and the sync token are
sealed with the store's AEAD cipher (associated data binds each value to its
row, so rows cannot be swapped); room and event ids, which are looked up, are
stored only as keyed hashes.

Operations here are plain functions of a transaction (``gapline.storage``'s
contract). Nothing in this module decides *what* changes: that is
``_sections.Sections``; this module only reads, and applies the updates it is
handed (:meth:`CacheStore.write_update`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b as _blake2b
from typing import Any, NamedTuple, Protocol

import msgspec

from gapline.history._types import GapLifecycle
from gapline.history._updates import (
    EventsAdded,
    GapAdded,
    GapChanged,
    GapRecord,
    GapRemoved,
    Key,
    ReceiptsChanged,
    StoredEvent,
    Update,
)
from gapline.matrix import ClientEvent
from gapline.storage import Backend, CorruptStore, Migration, Tx

__all__ = ["HISTORY_MIGRATIONS", "CacheStore", "Cipher", "Window"]


class Cipher(Protocol):
    """What the cache needs of ``gapline.storage.StoreCipher``."""

    def encrypt(self, plaintext: bytes, aad: bytes = b"") -> bytes: ...

    def decrypt(self, sealed: bytes, aad: bytes = b"") -> bytes: ...

    def lookup_key(self, identifier: str) -> bytes: ...


_SQLITE_V1 = """
-- Rooms this store has seen (sync, open). The id is sealed; lookups use the hash.
CREATE TABLE history_room (
    room BLOB PRIMARY KEY,          -- keyed hash of the room id
    rid INTEGER NOT NULL UNIQUE,    -- short local number keying the other tables (small index entries)
    room_id BLOB NOT NULL           -- the room id, sealed
);
-- One row per retained event. Ordered by (ord, pos): ord numbers sections
-- (newer sections higher), pos orders a section and goes negative as it grows
-- backwards. Rows are never renumbered.
CREATE TABLE history_event (
    room INTEGER NOT NULL,          -- history_room.rid
    ord INTEGER NOT NULL,           -- section order
    pos INTEGER NOT NULL,           -- position inside the section
    event BLOB NOT NULL,            -- keyed hash of the event id, 16 bytes (dedup, lookup)
    body BLOB NOT NULL,             -- the event's JSON, sealed (aad: room hash || event hash)
    PRIMARY KEY (room, ord, pos)
) WITHOUT ROWID;
CREATE UNIQUE INDEX history_event_by_id ON history_event (room, event);
-- One row per gap, before the section it precedes. older_ord NULL is the top
-- of the room: kept so its cursor is never dropped, never shown as a row.
CREATE TABLE history_gap (
    room INTEGER NOT NULL,          -- history_room.rid
    newer_ord INTEGER NOT NULL,     -- the section after the gap
    gap_id TEXT NOT NULL,           -- opaque random id (FillGap takes it); not secret
    older_ord INTEGER,              -- the section before the gap; NULL: top of the room
    older_boundary BLOB,            -- newest event id of the older section, sealed
    newer_boundary BLOB NOT NULL,   -- oldest event id of the newer section, sealed
    cursor BLOB,                    -- token paginating back from newer_boundary, sealed; NULL: none
    lifecycle TEXT NOT NULL,        -- Idle | Paused | Failed | Unavailable
    failure BLOB,                   -- failure text, sealed; set with Failed
    PRIMARY KEY (room, newer_ord)
) WITHOUT ROWID;
CREATE UNIQUE INDEX history_gap_by_id ON history_gap (room, gap_id);
-- Small per-room values: read receipts and the fully-read marker.
CREATE TABLE history_meta (
    room INTEGER NOT NULL,          -- history_room.rid
    kind TEXT NOT NULL,             -- 'receipts' | 'fully_read'
    value BLOB NOT NULL,            -- sealed JSON
    PRIMARY KEY (room, kind)
);
-- The sync position; written in the same transaction as the events it delivered.
CREATE TABLE history_sync (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    token BLOB NOT NULL             -- next_batch, sealed
);
"""

# PostgreSQL runs the same schema with BYTEA for BLOB and ordinary tables for the
# WITHOUT ROWID ones; every statement below is one text for both. The cache's
# contract (tests/history/cache_contract.py) runs on each backend.
HISTORY_MIGRATIONS = [
    Migration(
        1,
        "sections of events, gaps, receipts and the sync token",
        sqlite=_SQLITE_V1,
        postgres=_SQLITE_V1.replace(") WITHOUT ROWID;", ");").replace("BLOB", "BYTEA"),
    )
]

_CHUNK = 400  # IN (...) lists stay under every driver's parameter limit


class Room(NamedTuple):
    """A room as the tables see it: its local number and its keyed hash (for AAD)."""

    rid: int
    key: bytes


@dataclass(frozen=True, slots=True)
class Window:
    """What opening a room reads: the newest events, the gaps between them, receipts."""

    events: list[StoredEvent]
    gaps: list[GapRecord]
    receipts: dict[str, str] = field(default_factory=dict)
    fully_read: str | None = None
    known: bool = True


class CacheStore:
    """Reads of the event cache and the writer that applies :data:`Update`\\ s.

    Every method taking ``tx`` is meant to run inside an operation on the
    database thread; the ``async`` ones schedule such an operation.
    """

    def __init__(self, backend: Backend, cipher: Cipher) -> None:
        self.backend = backend
        self.cipher = cipher
        self._encode = msgspec.json.Encoder().encode
        self._event_subkey = cipher.lookup_key("gapline/history/event-id-subkey/v1")
        self._decode = msgspec.json.Decoder(ClientEvent).decode

    @classmethod
    async def open(cls, backend: Backend, cipher: Cipher) -> CacheStore:
        await backend.migrate("history", HISTORY_MIGRATIONS)
        return cls(backend, cipher)

    # -- codec ---------------------------------------------------------------------------

    def room_key(self, room_id: str) -> bytes:
        return self.cipher.lookup_key("room:" + room_id)

    def event_key(self, event_id: str) -> bytes:
        # Keyed BLAKE2b (a MAC, RFC 7693) under a subkey the store cipher derives: one C
        # call per id, since event hashes are on the ingestion hot path. 128 bits are
        # collision-safe for dedup and keep the index small.
        return _blake2b(event_id.encode(), key=self._event_subkey, digest_size=16).digest()

    def event_keys(self, event_ids: Iterable[str]) -> list[bytes]:
        """:meth:`event_key` of many ids (one comprehension: the per-event hot path)."""
        subkey = self._event_subkey
        return [_blake2b(i.encode(), key=subkey, digest_size=16).digest() for i in event_ids]

    def find_room(self, tx: Tx, room_id: str) -> Room | None:
        key = self.room_key(room_id)
        row = tx.one("SELECT rid FROM history_room WHERE room = ?", (key,))
        return None if row is None else Room(int(row[0]), key)

    def _open_event(self, room: Room, event: bytes, body: bytes) -> ClientEvent:
        plain = self.cipher.decrypt(bytes(body), room.key + bytes(event))
        try:
            return self._decode(plain)
        except msgspec.DecodeError as exc:  # sealed by us, so this is damage
            raise CorruptStore(f"a retained event does not decode: {exc}") from exc

    def _seal_text(self, text: str | None, aad: bytes) -> bytes | None:
        return None if text is None else self.cipher.encrypt(text.encode(), aad)

    def _open_text(self, sealed: Any, aad: bytes) -> str | None:
        return None if sealed is None else self.cipher.decrypt(bytes(sealed), aad).decode()

    # -- reads inside a transaction -------------------------------------------------------

    def locate(self, tx: Tx, room: Room, keys: Sequence[bytes]) -> dict[bytes, Key]:
        """Where each of ``keys`` (event hashes) is retained, if it is."""
        found: dict[bytes, Key] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), _CHUNK):
            chunk = unique[start : start + _CHUNK]
            marks = ",".join("?" * len(chunk))
            for event, ord_, pos in tx.all(
                f"SELECT event, ord, pos FROM history_event WHERE room = ? AND event IN ({marks})",
                (room.rid, *chunk),
            ):
                found[bytes(event)] = (int(ord_), int(pos))
        return found

    def tail(self, tx: Tx, room: Room) -> Key | None:
        row = tx.one(
            "SELECT ord, pos FROM history_event WHERE room = ? ORDER BY ord DESC, pos DESC LIMIT 1",
            (room.rid,),
        )
        return None if row is None else (int(row[0]), int(row[1]))

    def section_head(self, tx: Tx, room: Room, ord_: int) -> int | None:
        row = tx.one(
            "SELECT pos FROM history_event WHERE room = ? AND ord = ? ORDER BY pos LIMIT 1",
            (room.rid, ord_),
        )
        return None if row is None else int(row[0])

    def section_tail(self, tx: Tx, room: Room, ord_: int) -> int | None:
        row = tx.one(
            "SELECT pos FROM history_event WHERE room = ? AND ord = ? ORDER BY pos DESC LIMIT 1",
            (room.rid, ord_),
        )
        return None if row is None else int(row[0])

    def min_ord(self, tx: Tx, room: Room) -> int | None:
        row = tx.one(
            "SELECT ord FROM history_event WHERE room = ? ORDER BY ord, pos LIMIT 1", (room.rid,)
        )
        return None if row is None else int(row[0])

    def event_at(self, tx: Tx, room: Room, key: Key) -> ClientEvent | None:
        row = tx.one(
            "SELECT event, body FROM history_event WHERE room = ? AND ord = ? AND pos = ?",
            (room.rid, key[0], key[1]),
        )
        return None if row is None else self._open_event(room, row[0], row[1])

    _GAP_COLS = (
        "gap_id, newer_ord, older_ord, older_boundary, newer_boundary, cursor, lifecycle, failure"
    )

    def _gap(self, room: Room, row: tuple[Any, ...]) -> GapRecord:
        gap_id = str(row[0])
        aad = room.key + gap_id.encode()
        failure = self._open_text(row[7], aad + b"/failure")
        lifecycle = GapLifecycle(row[6])
        return GapRecord(
            gap_id=gap_id,
            newer_ord=int(row[1]),
            older_ord=None if row[2] is None else int(row[2]),
            older_boundary=self._open_text(row[3], aad + b"/older"),
            newer_boundary=self._open_text(row[4], aad + b"/newer") or "",
            cursor=self._open_text(row[5], aad + b"/cursor"),
            lifecycle=lifecycle,
            failure=failure if lifecycle is GapLifecycle.Failed else None,
        )

    def gap_before(self, tx: Tx, room: Room, ord_: int) -> GapRecord | None:
        row = tx.one(
            f"SELECT {self._GAP_COLS} FROM history_gap WHERE room = ? AND newer_ord = ?",
            (room.rid, ord_),
        )
        return None if row is None else self._gap(room, row)

    def nearest_gap(self, tx: Tx, room: Room, ord_: int) -> GapRecord | None:
        """The gap before section ``ord_`` or, failing that, the closest one below it."""
        row = tx.one(
            f"SELECT {self._GAP_COLS} FROM history_gap WHERE room = ? AND newer_ord <= ?"
            " ORDER BY newer_ord DESC LIMIT 1",
            (room.rid, ord_),
        )
        return None if row is None else self._gap(room, row)

    def gap_by_id(self, tx: Tx, room: Room, gap_id: str) -> GapRecord | None:
        row = tx.one(
            f"SELECT {self._GAP_COLS} FROM history_gap WHERE room = ? AND gap_id = ?",
            (room.rid, gap_id),
        )
        return None if row is None else self._gap(room, row)

    def gaps_between(self, tx: Tx, room: Room, lo_ord: int, hi_ord: int) -> list[GapRecord]:
        """Gaps shown between rows whose sections span ``lo_ord..hi_ord``: those whose
        newer section is above ``lo_ord`` (a gap at ``lo_ord`` would be the top row)."""
        rows = tx.all(
            f"SELECT {self._GAP_COLS} FROM history_gap WHERE room = ? AND newer_ord > ?"
            " AND newer_ord <= ? ORDER BY newer_ord LIMIT ?",
            (room.rid, lo_ord, hi_ord, hi_ord - lo_ord + 1),
        )
        return [self._gap(room, row) for row in rows]

    def _meta(self, tx: Tx, room: Room, kind: str) -> Any:
        row = tx.one("SELECT value FROM history_meta WHERE room = ? AND kind = ?", (room.rid, kind))
        if row is None:
            return None
        return json.loads(self.cipher.decrypt(bytes(row[0]), room.key + kind.encode()))

    def receipts(self, tx: Tx, room: Room) -> tuple[dict[str, str], str | None]:
        receipts = self._meta(tx, room, "receipts") or {}
        return dict(receipts), self._meta(tx, room, "fully_read")

    def _rows(self, room: Room, rows: Iterable[tuple[Any, ...]]) -> list[StoredEvent]:
        return [
            StoredEvent(int(o), int(p), self._open_event(room, ev, body)) for o, p, ev, body in rows
        ]

    # -- the writer: the only code that changes history rows ------------------------------

    def note_room(self, tx: Tx, room_id: str) -> Room:
        """The room's local number, registering the room on first sight."""
        found = self.find_room(tx, room_id)
        if found is not None:
            return found
        key = self.room_key(room_id)
        row = tx.one("SELECT COALESCE(MAX(rid), 0) + 1 FROM history_room")
        assert row is not None
        rid = int(row[0])
        tx.execute(
            "INSERT INTO history_room (room, rid, room_id) VALUES (?, ?, ?)",
            (key, rid, self.cipher.encrypt(room_id.encode(), key)),
        )
        return Room(rid, key)

    def write_update(
        self,
        tx: Tx,
        room: Room,
        update: Update,
        event_key: Callable[[str], bytes] | None = None,
    ) -> None:
        """Apply one update to the transaction (called only from ``Sections._emit``).

        ``event_key`` may supply event hashes the caller already computed.
        """
        match update:
            case EventsAdded(ord=ord_, pos=pos, events=events):
                # The per-event hot path of ingestion: one comprehension, locals only.
                encode, encrypt, (rid, rkey) = self._encode, self.cipher.encrypt, room
                keys = (
                    self.event_keys([e.event_id for e in events])
                    if event_key is None
                    else [event_key(e.event_id) for e in events]
                )
                rows = [
                    (rid, ord_, p, ek, encrypt(encode(event), rkey + ek))
                    for p, event, ek in zip(
                        range(pos, pos + len(events)), events, keys, strict=True
                    )
                ]
                tx.executemany(
                    "INSERT INTO history_event (room, ord, pos, event, body) VALUES (?, ?, ?, ?, ?)",
                    rows,
                )
            case GapAdded(gap=gap):
                tx.execute(
                    "INSERT INTO history_gap (room, newer_ord, gap_id, older_ord, older_boundary,"
                    " newer_boundary, cursor, lifecycle, failure) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        room.rid,
                        gap.newer_ord,
                        gap.gap_id,
                        gap.older_ord,
                        *self._gap_values(room, gap),
                    ),
                )
            case GapChanged(gap=gap):
                tx.execute(
                    "UPDATE history_gap SET older_boundary = ?, newer_boundary = ?, cursor = ?,"
                    " lifecycle = ?, failure = ? WHERE room = ? AND gap_id = ?",
                    (*self._gap_values(room, gap), room.rid, gap.gap_id),
                )
            case GapRemoved(gap=gap):
                tx.execute(
                    "DELETE FROM history_gap WHERE room = ? AND gap_id = ?", (room.rid, gap.gap_id)
                )
            case ReceiptsChanged(receipts=receipts, fully_read=fully_read):
                self._put_meta(tx, room, "receipts", dict(receipts))
                if fully_read is not None:
                    self._put_meta(tx, room, "fully_read", fully_read)

    def _gap_values(self, room: Room, gap: GapRecord) -> tuple[Any, ...]:
        aad = room.key + gap.gap_id.encode()
        return (
            self._seal_text(gap.older_boundary, aad + b"/older"),
            self._seal_text(gap.newer_boundary, aad + b"/newer"),
            self._seal_text(gap.cursor, aad + b"/cursor"),
            gap.lifecycle.value,
            self._seal_text(gap.failure, aad + b"/failure"),
        )

    def _put_meta(self, tx: Tx, room: Room, kind: str, value: Any) -> None:
        sealed = self.cipher.encrypt(json.dumps(value).encode(), room.key + kind.encode())
        tx.execute(
            "INSERT INTO history_meta (room, kind, value) VALUES (?, ?, ?)"
            " ON CONFLICT (room, kind) DO UPDATE SET value = excluded.value",
            (room.rid, kind, sealed),
        )

    def put_sync_token(self, tx: Tx, token: str) -> None:
        sealed = self.cipher.encrypt(token.encode(), b"history/sync")
        tx.execute(
            "INSERT INTO history_sync (id, token) VALUES (1, ?)"
            " ON CONFLICT (id) DO UPDATE SET token = excluded.token",
            (sealed,),
        )

    # -- read operations ------------------------------------------------------------------

    async def sync_token(self) -> str | None:
        def op(tx: Tx) -> str | None:
            row = tx.one("SELECT token FROM history_sync WHERE id = 1")
            return None if row is None else self._open_text(row[0], b"history/sync")

        return await self.backend.read(op)

    async def load_window(self, room_id: str, limit: int) -> Window:
        """The newest ``limit`` events of a room, the gaps between them, its receipts.

        One index range scan backwards over ``(room, ord, pos)``; cost is
        independent of how much the room retains.
        """

        def op(tx: Tx) -> Window:
            room = self.find_room(tx, room_id)
            if room is None:
                return Window([], [], known=False)
            rows = tx.all(
                "SELECT ord, pos, event, body FROM history_event WHERE room = ?"
                " ORDER BY ord DESC, pos DESC LIMIT ?",
                (room.rid, limit),
            )
            events = self._rows(room, reversed(rows))
            gaps = self.gaps_between(tx, room, events[0].ord, events[-1].ord) if events else []
            receipts, fully_read = self.receipts(tx, room)
            return Window(events, gaps, receipts, fully_read)

        return await self.backend.read(op)

    async def load_older(self, room_id: str, before: Key, limit: int) -> Window:
        """Up to ``limit`` events older than ``before`` and the gaps that then sit
        between loaded rows (including the one right above ``before``' section head)."""

        def op(tx: Tx) -> Window:
            room = self.find_room(tx, room_id)
            if room is None:
                return Window([], [])
            rows = tx.all(
                "SELECT ord, pos, event, body FROM history_event WHERE room = ?"
                " AND (ord, pos) < (?, ?) ORDER BY ord DESC, pos DESC LIMIT ?",
                (room.rid, before[0], before[1], limit),
            )
            events = self._rows(room, reversed(rows))
            gaps = self.gaps_between(tx, room, events[0].ord, before[0]) if events else []
            return Window(events, gaps)

        return await self.backend.read(op)

    async def room_is_known(self, room_id: str) -> bool:
        return await self.backend.read(lambda tx: self.find_room(tx, room_id) is not None)

    async def gap(self, room_id: str, gap_id: str) -> GapRecord | None:
        def op(tx: Tx) -> GapRecord | None:
            room = self.find_room(tx, room_id)
            return None if room is None else self.gap_by_id(tx, room, gap_id)

        return await self.backend.read(op)

    async def top_gap(self, room_id: str) -> GapRecord | None:
        def op(tx: Tx) -> GapRecord | None:
            room = self.find_room(tx, room_id)
            low = None if room is None else self.min_ord(tx, room)
            if room is None or low is None:
                return None
            return self.gap_before(tx, room, low)

        return await self.backend.read(op)

    async def all_events(self, room_id: str, limit: int = 1_000_000) -> list[StoredEvent]:
        """Every retained event of a room, oldest first (tests and tools; bounded)."""

        def op(tx: Tx) -> list[StoredEvent]:
            room = self.find_room(tx, room_id)
            if room is None:
                return []
            rows = tx.all(
                "SELECT ord, pos, event, body FROM history_event WHERE room = ?"
                " ORDER BY ord, pos LIMIT ?",
                (room.rid, limit),
            )
            return self._rows(room, rows)

        return await self.backend.read(op)

    async def all_gaps(self, room_id: str, limit: int = 10_000) -> list[GapRecord]:
        """Every gap of a room (the top one included), oldest first (tests and tools)."""

        def op(tx: Tx) -> list[GapRecord]:
            room = self.find_room(tx, room_id)
            if room is None:
                return []
            rows = tx.all(
                f"SELECT {self._GAP_COLS} FROM history_gap WHERE room = ?"
                " ORDER BY newer_ord LIMIT ?",
                (room.rid, limit),
            )
            return [self._gap(room, row) for row in rows]

        return await self.backend.read(op)
