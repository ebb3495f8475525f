"""Undecryptable events, retained and indexed by Megolm session, and healed in place.

An event that could not be decrypted is a row like any other (its ciphertext
body sealed at rest like every body) plus an entry in ``history_utd``
(schema ``history_e2ee``): (room, keyed hash of the session id, keyed hash of
the event id). When a session's key arrives, :func:`undecrypted_of` reads
that session's retained events, the caller decrypts them on the event loop,
and :func:`heal` rewrites each one that decrypted, in one write: the stored
event becomes the plaintext event, it passes the relation rules as if it had
just arrived (an edit applies, a reaction counts), and its row changes by one
``RowChanged`` (a ``Set`` diff, same row id, never a reset). An event that
still does not decrypt keeps its entry; an entry whose event is gone or
already decrypted is dropped.

The schema is its own (``history_e2ee``) so it migrates independently of the
cache's numbered migrations.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gapline.history._cache_store import CacheStore
from gapline.history._decryption import MARK, is_undecrypted
from gapline.history._sections import Sections
from gapline.history._updates import StoredEvent, Update
from gapline.matrix import ClientEvent
from gapline.storage import Migration, Tx

__all__ = [
    "UTD_MIGRATIONS",
    "UTD_SCHEMA",
    "heal",
    "index_undecrypted",
    "undecrypted_of",
    "undecrypted_sessions",
]

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

UTD_MIGRATIONS = [
    Migration(
        1,
        "undecryptable events by Megolm session",
        sqlite=_SQLITE_V1,
        postgres=_SQLITE_V1.replace(") WITHOUT ROWID;", ");").replace("BLOB", "BYTEA"),
    )
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
    """Remember the undecryptable events among ``events`` under their sessions."""
    marked = [e for e in events if is_undecrypted(e)]
    if not marked:
        return
    room = store.note_room(tx, room_id)
    rows = []
    for event in marked:
        session_id = _session_of(event)
        skey = _session_key(store, session_id)
        sealed = store.cipher.encrypt(session_id.encode(), room.key + skey)
        rows.append((room.rid, skey, sealed, store.event_key(event.event_id)))
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


def undecrypted_of(
    store: CacheStore, tx: Tx, room_id: str, session_ids: Iterable[str]
) -> list[StoredEvent]:
    """The retained undecryptable events of these sessions in the room, oldest first."""
    room = store.find_room(tx, room_id)
    if room is None:
        return []
    found: list[StoredEvent] = []
    for session_id in dict.fromkeys(session_ids):
        # One join in the index's order: no list of ids to pass back in chunks.
        for ord_, pos, event, body in tx.all(
            "SELECT e.ord, e.pos, e.event, e.body FROM history_utd u"
            " JOIN history_event e ON e.room = u.room AND e.event = u.event"
            " WHERE u.room = ? AND u.session = ?",
            (room.rid, _session_key(store, session_id)),
        ):
            stored, name = store.open_body(room.key + bytes(event), body)
            if is_undecrypted(stored):
                found.append(StoredEvent(int(ord_), int(pos), stored, name))
    found.sort(key=lambda f: f.key)
    return found


def heal(
    store: CacheStore, tx: Tx, room_id: str, healed: Sequence[tuple[StoredEvent, ClientEvent]]
) -> dict[str, list[Update]]:
    """Rewrite retained events that decrypted now (each: as it was read, under the crypto
    lock, and its plaintext event as the cache keeps it) and show them; drop their index
    entries.

    Only healing rewrites an undecryptable event's body, and every heal runs under the
    engine's crypto lock, so what was read is what is stored (keys never move; a
    redaction that landed meanwhile is applied again by the relation rules)."""
    if not healed:
        return {}
    sections = Sections(store, tx, room_id)
    sections.heal([StoredEvent(h.ord, h.pos, event, h.sender_name) for h, event in healed])
    rid, known = sections.room.rid, sections.known_keys  # hashed by the heal already
    sessions: dict[str, bytes] = {}  # a heal is one session's events, mostly: hash it once
    rows = []
    for h, _ in healed:
        session_id = _session_of(h.event)
        skey = sessions.get(session_id)
        if skey is None:
            skey = sessions[session_id] = _session_key(store, session_id)
        rows.append((rid, skey, known.get(h.event_id) or store.event_key(h.event_id)))
    tx.executemany("DELETE FROM history_utd WHERE room = ? AND session = ? AND event = ?", rows)
    return {room_id: sections.updates}
