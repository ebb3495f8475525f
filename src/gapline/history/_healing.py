"""Undecryptable events, retained and indexed by Megolm session, and healed in place.

An event that could not be decrypted is a row like any other (its ciphertext
body sealed at rest like every body) plus an entry in ``history_utd``
(schema ``history_e2ee``): (room, keyed hash of the session id, keyed hash of
the event id). So is a quoted event fetched on its own (``/context``), kept
detached, and an event stored as ciphertext before the store had a crypto
machine (:func:`index_unmarked` indexes those once). When a session's key
arrives, :func:`pending_heal` says where that session's events are, the
caller reads them in chunks (:func:`retained_chunk`), decrypts them on the
event loop, and :func:`heal` rewrites each one that decrypted: the stored
event becomes the plaintext event, it passes the relation rules as if it had
just arrived (an edit applies, a reaction counts), and its row changes by
one ``RowChanged`` (a ``Set`` diff, same row id, never a reset; for rows that
read as their plaintext alone, one ``RowsHealed`` for the chunk, rendered by each
open timeline for the rows it holds or quotes). A quote
heals by :func:`heal_detached` (its replies requote it). An event that
still does not decrypt keeps its entry; an entry whose event is gone or no
longer waits for a key is dropped.

The schema is its own (``history_e2ee``) so it migrates independently of the
cache's numbered migrations.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gapline.history._cache_schema import IN_LIST
from gapline.history._cache_store import CacheStore, rows_by_event_sql, split_timeline_key
from gapline.history._decryption import MARK, awaits_key
from gapline.history._sections import Sections
from gapline.history._updates import Key, Room, StoredEvent, Update
from gapline.matrix import ClientEvent
from gapline.storage import Migration, Tx

__all__ = [
    "UTD_MIGRATIONS",
    "UTD_SCHEMA",
    "PendingHeal",
    "detached_pending",
    "drop_entries",
    "heal",
    "heal_detached",
    "index_undecrypted",
    "index_unmarked",
    "pending_heal",
    "retained_chunk",
    "undecrypted_sessions",
]

log = logging.getLogger("gapline.history")

SCAN_CHUNK = 2000

UTD_SCHEMA = "history_e2ee"

_SQLITE_V1 = """
CREATE TABLE history_utd (
    room INTEGER NOT NULL,          -- history_room.rid of the room
    session BLOB NOT NULL,          -- keyed hash of the Megolm session id
    session_id BLOB NOT NULL,       -- the session id, sealed (aad: room hash || session hash)
    event BLOB NOT NULL,            -- keyed hash of the event id (history_event.event)
    PRIMARY KEY (room, session, event)
) WITHOUT ROWID;
"""

_SQLITE_V2 = """
-- Work left for the engine once: index the events retained as ciphertext before this
-- store had a crypto machine (stored unmarked, never tried); the row goes when done.
CREATE TABLE history_utd_scan (
    step TEXT PRIMARY KEY           -- 'unmarked'
);
INSERT INTO history_utd_scan (step) VALUES ('unmarked');
"""

UTD_MIGRATIONS = [
    Migration(
        1,
        "undecryptable events by Megolm session",
        sqlite=_SQLITE_V1,
        postgres=_SQLITE_V1.replace(") WITHOUT ROWID;", ");").replace("BLOB", "BYTEA"),
    ),
    Migration(2, "index the events stored before the crypto machine", sqlite=_SQLITE_V2),
]


def _session_key(store: CacheStore, session_id: str) -> bytes:
    return store.cipher.lookup_key("megolm-session:" + session_id)[:16]


def _session_of(event: ClientEvent) -> str:
    """The Megolm session an event names (its mark's, else its ciphertext's)."""
    mark = event.unsigned.get(MARK)
    if isinstance(mark, dict) and isinstance(mark.get("session_id"), str):
        return mark["session_id"]
    session = event.content.get("session_id")
    return session if isinstance(session, str) else ""


def index_undecrypted(
    store: CacheStore, tx: Tx, room_id: str, events: Iterable[ClientEvent]
) -> None:
    """Remember the events among ``events`` that wait for a key, under their sessions."""
    waiting = [e for e in events if awaits_key(e)]
    if not waiting:
        return
    room = store.note_room(tx, room_id)
    rows = []
    sessions: dict[str, tuple[bytes, bytes]] = {}
    for event in waiting:
        session_id = _session_of(event)
        known = sessions.get(session_id)
        if known is None:
            skey = _session_key(store, session_id)
            known = sessions[session_id] = (
                skey,
                store.cipher.encrypt(session_id.encode(), room.key + skey),
            )
        rows.append((room.rid, known[0], known[1], store.event_key(event.event_id)))
    tx.executemany(
        "INSERT INTO history_utd (room, session, session_id, event) VALUES (?, ?, ?, ?)"
        " ON CONFLICT DO NOTHING",
        rows,
    )


def undecrypted_sessions(store: CacheStore, tx: Tx) -> list[tuple[str, str]]:
    """Every (room id, session id) with retained undecryptable events (a sweep at start)."""
    out: list[tuple[str, str]] = []
    rooms = {int(rid): bytes(key) for rid, key in tx.all("SELECT rid, room FROM history_room")}
    for rid, skey, sealed in tx.all(
        "SELECT room, session, MIN(session_id) FROM history_utd GROUP BY room, session"
    ):
        key = rooms.get(int(rid))
        if key is None:
            continue
        row = tx.one("SELECT room_id FROM history_room WHERE rid = ?", (int(rid),))
        assert row is not None
        room_id = store.cipher.decrypt(bytes(row[0]), key).decode()
        session_id = store.cipher.decrypt(bytes(sealed), key + bytes(skey)).decode()
        out.append((room_id, session_id))
    return out


@dataclass(frozen=True, slots=True)
class PendingHeal:
    """A room's index entries of the sessions a key arrived for, by where the event is:
    a row (oldest first, healed in chunks), a detached event (a quote), or gone."""

    room: Room
    rows: list[tuple[int, int, bytes, bytes]]  # (ord, pos, event hash, session hash)
    detached: list[tuple[bytes, bytes]]  # (event hash, session hash)
    gone: list[tuple[bytes, bytes]]


def pending_heal(
    store: CacheStore, tx: Tx, room_id: str, session_ids: Iterable[str]
) -> PendingHeal | None:
    """Where the retained events of these sessions are (no body read yet)."""
    room = store.find_room(tx, room_id)
    if room is None:
        return None
    rows: list[tuple[int, int, bytes, bytes]] = []
    detached: list[tuple[bytes, bytes]] = []
    gone: list[tuple[bytes, bytes]] = []
    for session_id in dict.fromkeys(session_ids):
        skey = _session_key(store, session_id)
        for event, ord_, pos, quoted in tx.all(
            "SELECT u.event, e.ord, e.pos, d.event IS NOT NULL FROM history_utd u"
            " LEFT JOIN history_event e ON e.room = u.room AND e.event = u.event"
            " LEFT JOIN history_detached d ON d.room = u.room AND d.event = u.event"
            " WHERE u.room = ? AND u.session = ?",
            (room.rid, skey),
        ):
            if ord_ is not None:
                rows.append((int(ord_), int(pos), bytes(event), skey))
            elif quoted:
                detached.append((bytes(event), skey))
            else:
                gone.append((bytes(event), skey))
    if not (rows or detached or gone):
        return None
    rows.sort()
    return PendingHeal(room, rows, detached, gone)


def retained_chunk(
    store: CacheStore, tx: Tx, room: Room, rows: Sequence[tuple[int, int, bytes, bytes]]
) -> tuple[list[tuple[StoredEvent, bytes, bytes]], list[tuple[bytes, bytes]]]:
    """The events of these entries that still wait for a key, oldest first, each with
    its entry (event hash, session hash), and the entries whose event no longer waits
    (decrypted since, or gone)."""
    by_key = {event: skey for _, _, event, skey in rows}
    found: list[tuple[StoredEvent, bytes, bytes]] = []
    for ord_, pos, event, body in _chunk_rows(tx, room, rows):
        event = bytes(event)
        skey = by_key.get(event)
        if skey is None:
            continue  # a row between the entries' own (a range read)
        stored, name = store.open_body(room.key + event, body)
        if awaits_key(stored):
            del by_key[event]
            found.append((StoredEvent(int(ord_), int(pos), stored, name), event, skey))
    found.sort(key=lambda f: f[0].key)
    return found, list(by_key.items())


def _chunk_rows(
    tx: Tx, room: Room, rows: Sequence[tuple[int, int, bytes, bytes]]
) -> Iterable[tuple[int, int, bytes, bytes]]:
    """The rows (ord, pos, event hash, sealed body) of these entries, and maybe some
    between them: a section's entries whose positions are dense are read as the range of
    the primary key they span (a heal's chunk is usually one run of a conversation: 500
    rows read in order cost a third of 500 lookups through the event index and back);
    the others by their event hashes."""
    by_ord: dict[int, list[tuple[int, int, bytes, bytes]]] = {}
    for row in rows:
        by_ord.setdefault(row[0], []).append(row)
    scattered: list[bytes] = []
    out: list[tuple[int, int, bytes, bytes]] = []
    for ord_, part in by_ord.items():
        low = min(r[1] for r in part)
        high = max(r[1] for r in part)
        if len(part) > 1 and high - low < 2 * len(part):
            out.extend(
                tx.all(
                    "SELECT ord, pos, event, body FROM history_event"
                    " WHERE room = ? AND ord = ? AND pos >= ? AND pos <= ?",
                    (room.rid, ord_, low, high),
                )
            )
        else:
            scattered.extend(r[2] for r in part)
    for start in range(0, len(scattered), IN_LIST):
        part = scattered[start : start + IN_LIST]
        out.extend(tx.all(rows_by_event_sql(tx.dialect, len(part)), (room.rid, *part)))
    return out


def detached_pending(
    store: CacheStore, tx: Tx, room: Room, entries: Sequence[tuple[bytes, bytes]]
) -> tuple[list[ClientEvent], list[tuple[bytes, bytes]]]:
    """The detached events (quotes) of these entries that wait for a key, and the
    entries that no longer do."""
    by_key = dict(entries)
    found: list[ClientEvent] = []
    seen: set[bytes] = set()
    marks = ",".join("?" * len(by_key))
    for event, body in tx.all(
        f"SELECT event, body FROM history_detached WHERE room = ? AND event IN ({marks})"
        " AND body IS NOT NULL",
        (room.rid, *by_key),
    ):
        event = bytes(event)
        stored = store.open_body(room.key + b"det" + event, body)[0]
        if awaits_key(stored):
            seen.add(event)
            found.append(stored)
    return found, [(e, s) for e, s in by_key.items() if e not in seen]


def drop_entries(tx: Tx, room: Room, entries: Iterable[tuple[bytes, bytes]]) -> None:
    """Forget index entries (event hash, session hash) of the room: one statement per
    session and :data:`IN_LIST` events (a chunk of a heal is one session's; one statement
    per entry took 1.6 times as long)."""
    by_session: dict[bytes, list[bytes]] = {}
    for event, skey in entries:
        by_session.setdefault(skey, []).append(event)
    for skey, events in by_session.items():
        for start in range(0, len(events), IN_LIST):
            part = events[start : start + IN_LIST]
            tx.execute(
                "DELETE FROM history_utd WHERE room = ? AND session = ? AND event IN ("
                + ",".join("?" * len(part))
                + ")",
                (room.rid, skey, *part),
            )


def heal(
    store: CacheStore,
    tx: Tx,
    room_id: str,
    healed: Sequence[StoredEvent],
    entries: Sequence[tuple[bytes, bytes]],
) -> dict[str, list[Update]]:
    """Rewrite retained events that decrypted now (each: where it was read, under the
    crypto lock, holding its plaintext event as the cache keeps it) and show them; drop
    their index ``entries`` (event hash, session hash; one per event, in its order: the
    hashes read with the rows serve the write, which need not compute them again).

    Only healing rewrites an undecryptable event's body, and every heal runs under the
    engine's crypto lock, so what was read is what is stored (keys never move; a
    redaction that landed meanwhile is applied again by the relation rules)."""
    if not healed:
        return {}
    sections = Sections(store, tx, room_id)
    sections.known_keys.update(
        zip((s.event_id for s in healed), (event for event, _ in entries), strict=True)
    )
    sections.heal(healed)
    drop_entries(tx, sections.room, entries)
    return {room_id: sections.updates}


def heal_detached(
    store: CacheStore, tx: Tx, room_id: str, healed: Sequence[tuple[ClientEvent, ClientEvent]]
) -> dict[str, list[Update]]:
    """Store quoted events (fetched on their own) that decrypted now, so the replies
    quoting them show the message; drop their index entries."""
    if not healed:
        return {}
    sections = Sections(store, tx, room_id)
    for _, event in healed:
        sections.detach(event.event_id, event)
    entries = [
        (store.event_key(before.event_id), _session_key(store, _session_of(before)))
        for before, _ in healed
    ]
    drop_entries(tx, sections.agg_room, entries)
    return {room_id: sections.updates}


def _unmarked_chunk(
    store: CacheStore, tx: Tx, room_id: str, after: Key | None, limit: int
) -> tuple[Key | None, int]:
    """Index the events of one chunk of a room (after ``after``, oldest first) that were
    stored as ciphertext before this device's crypto machine existed; the chunk's last
    key (``None``: the room is done) and how many were indexed."""
    room = store.find_room(tx, room_id)
    if room is None:
        return None, 0
    chunk = store.events_after(tx, room, after, limit)
    waiting = [s.event for s in chunk if awaits_key(s.event)]
    index_undecrypted(store, tx, room_id, waiting)
    return (chunk[-1].key if len(chunk) == limit else None), len(waiting)


async def index_unmarked(store: CacheStore) -> int:
    """Once per store, when its crypto machine first opens: index the events retained as
    ciphertext before (stored unmarked, with no machine to try them), so the start-up
    sweep and later keys heal them like any undecryptable event. Chunked, each chunk its
    own write; an interrupted run starts again (indexing twice is harmless)."""
    backend = store.backend
    pending = await backend.read(
        lambda tx: tx.one("SELECT step FROM history_utd_scan WHERE step = 'unmarked'")
    )
    if pending is None:
        return 0
    total = 0
    for name in await backend.read(store.room_ids):
        room_id, root = split_timeline_key(name)
        if root is not None:
            continue  # a thread's own copies heal with their room's rows
        after: Key | None = None
        while True:
            after, count = await backend.write(
                lambda tx, a=after, r=room_id: _unmarked_chunk(store, tx, r, a, SCAN_CHUNK)
            )
            total += count
            if after is None:
                break
    await backend.write(
        lambda tx: tx.execute("DELETE FROM history_utd_scan WHERE step = 'unmarked'")
    )
    if total:
        log.info("indexed %d events stored encrypted before this device's crypto", total)
    return total
