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
- ``history_aggregate``, ``history_relation``, ``history_member``,
  ``history_detached`` (migration 2, read and written by ``_relation_store``):
  what relations made of each event, which relation events were seen, the
  room's member state, and events fetched on their own (replied-to events).
  An event that is not a row (an edit, a reaction, a redaction, a thread
  reply in the room's timeline) is still an ``history_event`` row, with
  ``shown = 0``: continuity is proven by every event, shown or not.

A thread's timeline (``OpenThread``) is a timeline of its own in these tables:
a ``history_room`` entry keyed by the room id and the root's id, with its own
sections and gaps; its events' aggregates live with the room's.

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
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial
from hashlib import blake2b as _blake2b
from typing import Any, Protocol

import msgspec

from gapline.history._cache_reads import CacheReads, Window, split_timeline_key, thread_key
from gapline.history._cache_schema import HISTORY_MIGRATIONS, IN_LIST
from gapline.history._items import GapLifecycle
from gapline.history._relation_store import RelationTables
from gapline.history._send_store import SendTable
from gapline.history._updates import (
    AggregateChanged,
    DetachedStored,
    EventRewritten,
    EventsAdded,
    GapAdded,
    GapChanged,
    GapRecord,
    GapRemoved,
    Key,
    MembersUpdated,
    ReceiptsChanged,
    RelationIndexed,
    Room,
    RowChanged,
    RowsHealed,
    RowsHidden,
    StoredEvent,
    Update,
)
from gapline.matrix import ClientEvent
from gapline.storage import Backend, CorruptStore, Dialect, Tx

__all__ = [
    "HISTORY_MIGRATIONS",
    "CacheStore",
    "Cipher",
    "RowMeta",
    "Window",
    "rows_by_event_sql",
    "split_timeline_key",
    "thread_key",
]


class Cipher(Protocol):
    """What the cache needs of ``gapline.storage.StoreCipher``."""

    def encrypt(self, plaintext: bytes, aad: bytes = b"") -> bytes: ...

    def encrypt_many(self, items: Iterable[tuple[bytes, bytes]]) -> list[bytes]: ...

    def decrypt(self, sealed: bytes, aad: bytes = b"") -> bytes: ...

    def lookup_key(self, identifier: str) -> bytes: ...


class RowMeta(msgspec.Struct, frozen=True, array_like=True):
    """What the cache stores with an event beyond the event: its sender's name then."""

    sender_name: str | None = None


def rows_by_event_sql(dialect: Dialect, count: int) -> str:
    """The statement reading ``count`` retained rows (with their bodies) of a room by
    their event hashes.

    SQLite, with no statistics, answers an ``IN (...)`` list of two hashes or more by scanning
    the room's whole key range (the primary key's ``room = ?`` prefix) and testing each
    row against the list, so every such read cost as much as the room (400 rows
    of a room retaining 30,000 events: 89 ms, against 3 ms through the index); named,
    the index finds each row. PostgreSQL's planner has statistics, and no such clause.
    """
    by_id = " INDEXED BY history_event_by_id" if dialect is Dialect.SQLITE else ""
    marks = ",".join("?" * count)
    return (
        f"SELECT ord, pos, event, body FROM history_event{by_id}"
        f" WHERE room = ? AND event IN ({marks})"
    )


class CacheStore(CacheReads):
    """Reads of the event cache and the writer that applies :data:`Update`\\ s.

    Every method taking ``tx`` is meant to run inside an operation on the
    database thread; the ``async`` ones schedule such an operation.
    """

    def __init__(self, backend: Backend, cipher: Cipher) -> None:
        self.backend = backend
        self.cipher = cipher
        self._encode = msgspec.json.Encoder().encode
        # Keyed BLAKE2b, keyed once: each id's hash is a copy of this state (a copy
        # costs less than keying a new one, on every id of every page).
        self._event_hash = _blake2b(
            key=cipher.lookup_key("gapline/history/event-id-subkey/v1"), digest_size=16
        )
        # A body is [event, meta] when the cache knows more than the event (its
        # sender's name then), else the bare event (as before migration 2).
        self._decode = msgspec.json.Decoder(ClientEvent | tuple[ClientEvent, RowMeta]).decode
        self.me: str | None = None
        """The account's user id, when known (a thread's "participated" needs it)."""
        self.relations = RelationTables(self)
        self.sends = SendTable(self)
        self._gap_counts: dict[int, int] = {}  # gap_writes, by room number
        self._gap_lock = threading.Lock()
        self._last_gap: dict[int, tuple[int, GapRecord]] = {}
        """Per room number, the gap its last committed gap write left, with the room's
        gap-write count right after that write (see :meth:`known_gap`)."""
        self._rooms: dict[str, Room] = {}
        """Room (and thread) ids registered in a committed transaction, with their number:
        a ``history_room`` row is never removed nor renumbered once committed, so the
        lookup every transaction starts with is answered from here. Filled only by
        ``Tx.after_commit``: a registration that rolls back leaves no entry (its
        number may then go to another room)."""

    @classmethod
    async def open(cls, backend: Backend, cipher: Cipher) -> CacheStore:
        await backend.migrate("history", HISTORY_MIGRATIONS)
        return cls(backend, cipher)

    # -- codec ---------------------------------------------------------------------------

    def room_key(self, room_id: str) -> bytes:
        return self.cipher.lookup_key("room:" + room_id)

    def event_key(self, event_id: str) -> bytes:
        # Keyed BLAKE2b (a MAC, RFC 7693) under a subkey the store cipher derives, since
        # event hashes are on the ingestion hot path. 128 bits are collision-safe for
        # dedup and keep the index small. Stored rows are found by it: never change it.
        h = self._event_hash.copy()
        h.update(event_id.encode())
        return h.digest()

    def event_keys(self, event_ids: Iterable[str]) -> list[bytes]:
        """:meth:`event_key` of many ids (one loop: the per-event hot path)."""
        copy, out = self._event_hash.copy, []
        for event_id in event_ids:
            h = copy()
            h.update(event_id.encode())
            out.append(h.digest())
        return out

    def find_room(self, tx: Tx, room_id: str) -> Room | None:
        known = self._rooms.get(room_id)
        if known is not None:
            return known
        key = self.room_key(room_id)
        row = tx.one("SELECT rid FROM history_room WHERE room = ?", (key,))
        return None if row is None else Room(int(row[0]), key)

    def open_body(self, aad: bytes, body: bytes) -> tuple[ClientEvent, str | None]:
        """A sealed event body: the event and its sender's name as of it."""
        plain = self.cipher.decrypt(bytes(body), aad)
        try:
            decoded = self._decode(plain)
        except msgspec.DecodeError as exc:  # sealed by us, so this is damage
            raise CorruptStore(f"a retained event does not decode: {exc}") from exc
        if isinstance(decoded, tuple):
            return decoded[0], decoded[1].sender_name
        return decoded, None

    def seal_body(self, aad: bytes, event: ClientEvent, sender_name: str | None) -> bytes:
        return self.cipher.encrypt(self._body(event, sender_name), aad)

    def _body(self, event: ClientEvent, sender_name: str | None) -> bytes:
        """An event body as it is sealed: [event, meta] with a sender's name, else the
        bare event."""
        return self._encode(event if sender_name is None else (event, RowMeta(sender_name)))

    def _open_event(self, room: Room, event: bytes, body: bytes) -> ClientEvent:
        return self.open_body(room.key + bytes(event), body)[0]

    def _seal_text(self, text: str | None, aad: bytes) -> bytes | None:
        return None if text is None else self.cipher.encrypt(text.encode(), aad)

    def _open_text(self, sealed: Any, aad: bytes) -> str | None:
        return None if sealed is None else self.cipher.decrypt(bytes(sealed), aad).decode()

    # -- reads inside a transaction -------------------------------------------------------

    def locate(self, tx: Tx, room: Room, keys: Sequence[bytes]) -> dict[bytes, Key]:
        """Where each of ``keys`` (event hashes) is retained, if it is."""
        found: dict[bytes, Key] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), IN_LIST):
            chunk = unique[start : start + IN_LIST]
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

    def retained(
        self,
        tx: Tx,
        room: Room,
        event_ids: Sequence[str],
        known: dict[str, bytes] | None = None,
    ) -> dict[str, StoredEvent]:
        """The retained events among ``event_ids`` (shown or not), by id (``known``: a
        cache of hashes, read and filled)."""
        found: dict[str, StoredEvent] = {}
        unique = list(dict.fromkeys(event_ids))
        if known is not None:
            missing = [i for i in unique if i not in known]
            known.update(zip(missing, self.event_keys(missing), strict=True))
        for start in range(0, len(unique), IN_LIST):
            ids = unique[start : start + IN_LIST]
            chunk = [known[i] for i in ids] if known is not None else self.event_keys(ids)
            for o, p, ek, body in tx.all(
                rows_by_event_sql(tx.dialect, len(chunk)), (room.rid, *chunk)
            ):
                event, name = self.open_body(room.key + bytes(ek), body)
                found[event.event_id] = StoredEvent(int(o), int(p), event, name)
        return found

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
        out = []
        for o, p, ev, body in rows:
            event, name = self.open_body(room.key + bytes(ev), body)
            out.append(StoredEvent(int(o), int(p), event, name))
        return out

    # -- the writer: the only code that changes history rows ------------------------------

    def note_room(self, tx: Tx, room_id: str) -> Room:
        """The room's local number, registering the room on first sight."""
        found = self.find_room(tx, room_id)
        if found is not None:
            if room_id not in self._rooms:
                tx.after_commit(partial(self._rooms.__setitem__, room_id, found))
            return found
        key = self.room_key(room_id)
        row = tx.one("SELECT COALESCE(MAX(rid), 0) + 1 FROM history_room")
        assert row is not None
        rid = int(row[0])
        tx.execute(
            "INSERT INTO history_room (room, rid, room_id) VALUES (?, ?, ?)",
            (key, rid, self.cipher.encrypt(room_id.encode(), key)),
        )
        room = Room(rid, key)
        tx.after_commit(partial(self._rooms.__setitem__, room_id, room))
        return room

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
            case EventsAdded(
                ord=ord_, pos=pos, events=events, items=items, shown=shown, aggregates=held
            ):
                # The per-event hot path of ingestion: comprehensions, locals only.
                encode, (rid, rkey) = self._encode, room
                keys = (
                    self.event_keys([e.event_id for e in events])
                    if event_key is None
                    else [event_key(e.event_id) for e in events]
                )
                # An event with a sender's name is stored as [event, meta], one without
                # as the bare event (the body's first form, which still decodes).
                bodies = (
                    [
                        event if i.sender_name is None else (event, RowMeta(i.sender_name))
                        for event, i in zip(events, items, strict=True)
                    ]
                    if items
                    else events
                )
                flags = [int(f) for f in shown] if shown else [1] * len(events)
                sealed = self.cipher.encrypt_many(
                    [(encode(body), rkey + ek) for body, ek in zip(bodies, keys, strict=True)]
                )
                aggs: list[bytes | None] = [None] * len(events)
                if held and any(held):
                    # Each row with the copy of its event's aggregate, in the same insert (a
                    # room's own timeline only: a thread's timeline reads its room's).
                    with_agg = [(ek, a) for ek, a in zip(keys, held, strict=True) if a is not None]
                    copies = iter(self.relations.seal_many(room, with_agg))
                    aggs = [None if a is None else next(copies) for a in held]
                tx.executemany(
                    "INSERT INTO history_event (room, ord, pos, event, body, shown, agg)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [
                        (rid, ord_, p, ek, body, flag, agg)
                        for p, ek, body, flag, agg in zip(
                            range(pos, pos + len(events)), keys, sealed, flags, aggs, strict=True
                        )
                    ],
                )
            case GapAdded(gap=gap):
                count = self._note_gap_write(room)
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
                self._remember_gap(tx, room, gap, count)
            case GapChanged(gap=gap):
                count = self._note_gap_write(room)
                changed = tx.execute(
                    "UPDATE history_gap SET older_boundary = ?, newer_boundary = ?, cursor = ?,"
                    " lifecycle = ?, failure = ? WHERE room = ? AND gap_id = ?",
                    (*self._gap_values(room, gap), room.rid, gap.gap_id),
                )
                if changed != 1:  # the row is gone (or the count unknown): carry nothing
                    self._note_gap_write(room)
                else:
                    self._remember_gap(tx, room, gap, count)
            case GapRemoved(gap=gap):
                self._note_gap_write(room)
                tx.execute(
                    "DELETE FROM history_gap WHERE room = ? AND gap_id = ?", (room.rid, gap.gap_id)
                )
            case ReceiptsChanged(receipts=receipts, fully_read=fully_read):
                self._put_meta(tx, room, "receipts", dict(receipts))
                if fully_read is not None:
                    self._put_meta(tx, room, "fully_read", fully_read)
            case EventRewritten():
                self.rewrite_events(tx, room, (update,), event_key)
            case AggregateChanged() | RelationIndexed() | MembersUpdated() | DetachedStored():
                self.relations.write(tx, room, update, event_key)
            case RowsHidden(keys=keys):
                tx.executemany(
                    "UPDATE history_event SET shown = 0 WHERE room = ? AND ord = ? AND pos = ?",
                    [(room.rid, o, p) for o, p in keys],
                )
            case RowChanged() | RowsHealed():
                pass  # a row shows what the stored event and its aggregate say: nothing to store

    def rewrite_events(
        self,
        tx: Tx,
        room: Room,
        rewrites: Sequence[EventRewritten],
        event_key: Callable[[str], bytes] | None = None,
    ) -> None:
        """Store events again in place (same row), in one statement: a heal rewrites
        thousands at once, and a statement per row was a third of its write."""
        body, key_of = self._body, event_key or self.event_key
        rooms = [u.room or room for u in rewrites]
        bodies = self.cipher.encrypt_many(
            (body(u.event, u.sender_name), at.key + key_of(u.event.event_id))
            for u, at in zip(rewrites, rooms, strict=True)
        )  # as seal_body seals each, the nonces drawn at once
        tx.executemany(
            "UPDATE history_event SET body = ? WHERE room = ? AND ord = ? AND pos = ?",
            [
                (sealed, at.rid, *u.key)
                for sealed, u, at in zip(bodies, rewrites, rooms, strict=True)
            ],
        )

    def gap_writes(self, room: Room) -> int:
        """How many writes of ``room``'s gaps this store has made, in any transaction
        (committed, pending or rolled back).

        A walk keeps the gap its page wrote and the count after that write; while the
        count has not moved, the row is what that page left (this store being the only
        writer of its history tables), so the next page does not read it back. Counted
        when the write is made, not at commit: a write of another transaction, even one
        that rolls back, makes the next page read the row."""
        return self._gap_counts.get(room.rid, 0)

    def known_gap(self, room: Room, gap_id: str) -> GapRecord | None:
        """Gap ``gap_id`` as the database holds it, when no read is needed to know it:
        the room's last gap write was of this gap, it committed, and no gap write of the
        room has been made since (in any transaction, however it ended). ``None``: read.

        A fill starts from the gap a limited sync just wrote; this spares it reading the
        row back (a reader-thread round trip before its first request)."""
        known = self._last_gap.get(room.rid)
        if known is None or known[0] != self.gap_writes(room) or known[1].gap_id != gap_id:
            return None
        return known[1]

    def _remember_gap(self, tx: Tx, room: Room, gap: GapRecord, count: int) -> None:
        """After its commit, remember the row this transaction's gap write (the room's
        ``count``-th) left, as a read would return it (a failure only with a failed
        lifecycle)."""
        if gap.failure is not None and gap.lifecycle is not GapLifecycle.Failed:
            gap = replace(gap, failure=None)
        tx.after_commit(partial(self._install_gap, room.rid, count, gap))

    def _install_gap(self, rid: int, count: int, gap: GapRecord) -> None:
        with self._gap_lock:
            # A later write of the room's gaps (even one rolled back) moved the count: the
            # row may differ from ``gap``, so it is not remembered.
            if self._gap_counts.get(rid, 0) == count:
                self._last_gap[rid] = (count, gap)

    def _note_gap_write(self, room: Room) -> int:
        """Count a write of the room's gaps; the count it made (taken under the lock, so
        two writer threads of PostgreSQL never see the same one)."""
        with self._gap_lock:
            count = self._gap_counts[room.rid] = self._gap_counts.get(room.rid, 0) + 1
        return count

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
