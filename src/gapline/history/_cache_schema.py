"""The event cache's schema: numbered, commented migrations (schema ``history``), and how
many ids one statement's ``IN (...)`` list names (:data:`IN_LIST`).

Every column is commented where it is created. PostgreSQL runs the same text
with ``BYTEA`` for ``BLOB`` and ordinary tables for the ``WITHOUT ROWID``
ones; the cache's contract (tests/history/cache_contract.py) runs on each
backend.
"""

from __future__ import annotations

from gapline.storage import Migration

__all__ = ["HISTORY_MIGRATIONS", "IN_LIST"]

IN_LIST = 400
"""Ids per ``IN (...)`` list in the cache's statements: under every driver's parameter limit."""

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

_SQLITE_V2 = """
-- 1: the event is a row of its timeline; 0: an edit, reaction, redaction or (in a
-- room's timeline) a thread reply, kept so continuity can be proven by it.
ALTER TABLE history_event ADD COLUMN shown INTEGER NOT NULL DEFAULT 1;
-- The event's aggregate as history_aggregate holds it (same sealed value), kept with
-- the event in the room's timeline so opening a room reads it with the row: no
-- lookup in a table keyed by hashes. NULL: nothing relates to the event.
ALTER TABLE history_event ADD COLUMN agg BLOB;
-- What relations made of an event (edits, reactions, thread, a redaction), kept
-- whether the event is retained yet or not (a relation may arrive first).
CREATE TABLE history_aggregate (
    room INTEGER NOT NULL,          -- history_room.rid of the room (never a thread's)
    target BLOB NOT NULL,           -- keyed hash of the event id
    value BLOB NOT NULL,            -- the aggregate's JSON, sealed (aad: room hash || target)
    PRIMARY KEY (room, target)
) WITHOUT ROWID;
-- Every relation event seen once (its effect is applied once, wherever it arrives).
CREATE TABLE history_relation (
    room INTEGER NOT NULL,          -- history_room.rid of the room
    event BLOB NOT NULL,            -- keyed hash of the relation event's id
    target BLOB NOT NULL,           -- keyed hash of the event it relates to
    target_id BLOB NOT NULL,        -- the event it relates to, sealed (aad: room hash || event)
    kind TEXT NOT NULL,             -- replace | annotation | thread | redaction
    PRIMARY KEY (room, event)
) WITHOUT ROWID;
CREATE INDEX history_relation_by_target ON history_relation (room, target);
-- The room's current member state (names as of an event are stored with the event).
CREATE TABLE history_member (
    room INTEGER NOT NULL,          -- history_room.rid of the room
    member BLOB NOT NULL,           -- keyed hash of the user id
    name BLOB,                      -- keyed hash of the display name; NULL: none
    present INTEGER NOT NULL,       -- 1: joined or invited (counts for name clashes)
    value BLOB NOT NULL,            -- {user_id, display_name, membership}, sealed
    PRIMARY KEY (room, member)
) WITHOUT ROWID;
CREATE INDEX history_member_by_name ON history_member (room, name);
-- Work a migration leaves for the engine to do at open ('relations': classify and
-- aggregate the events retained before the relation rules existed).
CREATE TABLE history_upgrade (
    step TEXT PRIMARY KEY
);
INSERT INTO history_upgrade (step) SELECT 'relations' WHERE EXISTS (SELECT 1 FROM history_event);
-- Events fetched on their own (a replied-to event not in any section).
CREATE TABLE history_detached (
    room INTEGER NOT NULL,          -- history_room.rid of the room
    event BLOB NOT NULL,            -- keyed hash of the event id
    body BLOB,                      -- the event's JSON, sealed; NULL: the server would not return it
    PRIMARY KEY (room, event)
) WITHOUT ROWID;
"""

_SQLITE_V3 = """
-- The durable send queue: a message is written here before any request is made, and
-- deleted in the transaction that retains the server's event (or when cancelled).
CREATE TABLE history_send (
    seq INTEGER PRIMARY KEY,        -- queue order, max + 1 at enqueue (per room: send order)
    txn_id TEXT NOT NULL UNIQUE,    -- transaction id every attempt uses (random; not secret)
    room BLOB NOT NULL,             -- keyed hash of the room id
    state TEXT NOT NULL,            -- pending | sent | failed
    event BLOB,                     -- keyed hash of the server's event id once it answered
    event_id BLOB,                  -- the server's event id, sealed; set with event
    failure BLOB,                   -- why the server refused it, sealed; set with failed
    value BLOB NOT NULL             -- {room_id, thread_root, event_type, content, created_ts}, sealed
);
CREATE INDEX history_send_by_room ON history_send (room, seq);
"""

# No read asks for a target's relations (its aggregate, kept by target in
# history_aggregate, answers that), so the index only cost every relation insert a
# second b-tree write.
_V4 = """
DROP INDEX history_relation_by_target;
"""


def _postgres(text: str) -> str:
    return text.replace(") WITHOUT ROWID;", ");").replace("BLOB", "BYTEA")


HISTORY_MIGRATIONS = [
    Migration(
        1,
        "sections of events, gaps, receipts and the sync token",
        sqlite=_SQLITE_V1,
        postgres=_postgres(_SQLITE_V1),
    ),
    Migration(
        2,
        "relations: shown rows, aggregates, relation index, members, detached events",
        sqlite=_SQLITE_V2,
        postgres=_postgres(_SQLITE_V2),
    ),
    Migration(
        3,
        "the durable send queue",
        sqlite=_SQLITE_V3,
        postgres=_postgres(_SQLITE_V3),
    ),
    Migration(4, "drop the relation index by target, which no read uses", sqlite=_V4),
]
