"""The journal's tables, as numbered migrations for both dialects.

Every table leads with ``principal_id``: one database holds many principals and every
key, index and query is scoped by the bound principal. ``thread_id`` is ``TEXT NOT
NULL`` with '' for unthreaded (see ``encode_thread_id``). On PostgreSQL every ordered
text key is ``COLLATE "C"`` so ordering is byte order whatever the cluster's locale
(SQLite's default BINARY collation already is).
"""

from __future__ import annotations

from gapline.storage import Migration

__all__ = ["MIGRATIONS", "SCHEMA"]

SCHEMA = "journal"

_V1 = """
-- The journal: one row per admitted event id per principal. seq is durable receipt
-- order. source is the exact replay input, NULL once compacted (context-only) or
-- settled. settled: 0 pending, 1 settled, 2 force-settled by a membership fence.
CREATE TABLE journal_events (
    seq {SEQ_PK},
    principal_id TEXT {C} NOT NULL,
    event_id TEXT {C} NOT NULL,
    room_id TEXT {C} NOT NULL,
    thread_id TEXT {C} NOT NULL,
    sender TEXT NOT NULL,
    origin_server_ts BIGINT NOT NULL,
    type TEXT NOT NULL,
    kind TEXT NOT NULL,
    provenance TEXT NOT NULL,
    epoch BIGINT NOT NULL,            -- membership epoch that admitted the event
    redacts TEXT,
    resolved_text TEXT,
    source {BLOB},
    consumer TEXT,                    -- semantic consumer that claimed the event
    settled SMALLINT NOT NULL DEFAULT 0,
    UNIQUE (principal_id, event_id)
);
-- Hot: pending() pages unsettled rows in receipt order; only those are indexed.
CREATE INDEX journal_events_pending ON journal_events (principal_id, seq) WHERE settled = 0;
-- No per-room index: the fence sweep filters the (small) pending index by room, and
-- every index here is one more page each admission commit must write and fsync.

-- The projection: one row per logical message, latest visible body. The primary key
-- is the read order, so a conversation walk is one range scan of the key.
-- (rev_ts, rev_event_id) is the identity of the visible replacement; (0, empty) when unedited.
-- body is NULL exactly when refresh_token is set (redacted revision, unresolved preview).
CREATE TABLE journal_messages (
    principal_id TEXT {C} NOT NULL,
    room_id TEXT {C} NOT NULL,
    thread_id TEXT {C} NOT NULL,
    created_ts BIGINT NOT NULL,
    logical_event_id TEXT {C} NOT NULL,
    sender TEXT NOT NULL,
    body TEXT,
    edited SMALLINT NOT NULL,
    rev_ts BIGINT NOT NULL,
    rev_event_id TEXT {C} NOT NULL,
    refresh_token TEXT,
    PRIMARY KEY (principal_id, room_id, thread_id, created_ts, logical_event_id)
){WITHOUT_ROWID};
CREATE UNIQUE INDEX journal_messages_logical
    ON journal_messages (principal_id, room_id, logical_event_id);
-- Only edited rows: an original's admission does not touch this index.
CREATE INDEX journal_messages_revision
    ON journal_messages (principal_id, room_id, rev_event_id) WHERE edited = 1;

-- Edits that arrived before their original: one latest per (target, sender), so an
-- attacker edit can never evict the edit of the author.
CREATE TABLE journal_held_edits (
    principal_id TEXT {C} NOT NULL,
    room_id TEXT {C} NOT NULL,
    target_event_id TEXT {C} NOT NULL,
    sender TEXT {C} NOT NULL,
    edit_ts BIGINT NOT NULL,
    edit_event_id TEXT {C} NOT NULL,
    body TEXT,
    refresh_token TEXT,
    PRIMARY KEY (principal_id, room_id, target_event_id, sender)
);
CREATE INDEX journal_held_edits_event
    ON journal_held_edits (principal_id, room_id, edit_event_id);

-- Every redaction target, recorded before projection: nothing may resurrect it.
CREATE TABLE journal_tombstones (
    principal_id TEXT {C} NOT NULL,
    room_id TEXT {C} NOT NULL,
    event_id TEXT {C} NOT NULL,
    redaction_event_id TEXT NOT NULL,
    PRIMARY KEY (principal_id, room_id, event_id)
);

-- Membership epochs (a missing row is epoch 0) and the durable owed-report set.
CREATE TABLE journal_membership (
    principal_id TEXT {C} NOT NULL,
    room_id TEXT {C} NOT NULL,
    epoch BIGINT NOT NULL,
    PRIMARY KEY (principal_id, room_id)
);
CREATE TABLE journal_owed_departures (
    principal_id TEXT {C} NOT NULL,
    room_id TEXT {C} NOT NULL,
    epoch BIGINT NOT NULL,            -- the epoch the LOCAL leave advanced to
    PRIMARY KEY (principal_id, room_id, epoch)
);

-- Hydration coverage, published by the final transaction of a hydration.
CREATE TABLE journal_coverage (
    principal_id TEXT {C} NOT NULL,
    room_id TEXT {C} NOT NULL,
    thread_id TEXT {C} NOT NULL,
    epoch BIGINT NOT NULL,
    reached_start SMALLINT NOT NULL,
    messages BIGINT NOT NULL,
    PRIMARY KEY (principal_id, room_id, thread_id)
);

-- Turns: the handler result is durable before the final enqueue.
CREATE TABLE journal_turns (
    principal_id TEXT {C} NOT NULL,
    turn_id TEXT {C} NOT NULL,
    room_id TEXT {C} NOT NULL,
    thread_id TEXT {C} NOT NULL,
    source_event_id TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    state TEXT NOT NULL,
    result {BLOB},
    initial_event_id TEXT,
    final_event_id TEXT,
    PRIMARY KEY (principal_id, turn_id)
);

-- The outbox. attempted is committed before any network I/O; acked_event_id is set
-- once, by the winning acknowledger.
CREATE TABLE journal_outbox (
    seq {SEQ_PK},
    principal_id TEXT {C} NOT NULL,
    delivery_id TEXT {C} NOT NULL,
    stage TEXT {C} NOT NULL,
    turn_id TEXT NOT NULL,
    room_id TEXT {C} NOT NULL,
    thread_id TEXT NOT NULL,
    event_type TEXT NOT NULL,
    content {BLOB} NOT NULL,
    txn_id TEXT NOT NULL,
    attempted SMALLINT NOT NULL DEFAULT 0,
    acked_event_id TEXT,
    UNIQUE (principal_id, delivery_id, stage)
);
CREATE INDEX journal_outbox_unacked
    ON journal_outbox (principal_id, seq) WHERE acked_event_id IS NULL;
CREATE INDEX journal_outbox_room_unacked
    ON journal_outbox (principal_id, room_id) WHERE acked_event_id IS NULL;
"""


_V2 = """
-- What an outbox row carries: 'answer' (a turn's placeholder and final edit) or
-- 'approval_card' (a card and its resolution edit). The Matrix transport state of both
-- (payload, txn id, attempted, acknowledgement) stays here; an approval card's exact
-- call lives in approval_cards, keyed by the row's delivery_id (= approval_id).
ALTER TABLE journal_outbox ADD COLUMN purpose TEXT NOT NULL DEFAULT 'answer';

-- A turn suspended on one exact call until a decision. decision is NULL while waiting;
-- the first decision recorded is final. epoch: the membership epoch of the turn.
CREATE TABLE approval_continuations (
    principal_id TEXT {C} NOT NULL,   -- the turn's principal
    approval_id TEXT {C} NOT NULL,
    turn_id TEXT NOT NULL,
    room_id TEXT {C} NOT NULL,
    epoch BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,       -- wall-clock ms
    decision TEXT,
    decided_by TEXT,
    reason TEXT,
    PRIMARY KEY (principal_id, approval_id)
);
CREATE INDEX approval_continuations_waiting
    ON approval_continuations (principal_id, room_id) WHERE decision IS NULL;

-- The card asking a human to approve one exact call: the call's name, its canonical
-- arguments and their digest, the turn and delivery it belongs to, who may decide, and
-- the card's event id once known. principal_id holds the card (its outbox sends it);
-- the continuation may belong to another principal. tombstoned: a membership fence
-- retired the card, and no answer to its event id decides anything again.
CREATE TABLE approval_cards (
    principal_id TEXT {C} NOT NULL,
    approval_id TEXT {C} NOT NULL,
    continuation_principal_id TEXT {C} NOT NULL,
    turn_id TEXT NOT NULL,
    room_id TEXT {C} NOT NULL,
    thread_id TEXT NOT NULL,
    tool_name TEXT NOT NULL,
    arguments TEXT NOT NULL,
    call_digest TEXT NOT NULL,
    approvers TEXT NOT NULL,          -- JSON list of user ids
    epoch BIGINT NOT NULL,            -- the card principal's epoch when it was opened
    card_event_id TEXT {C},
    tombstoned SMALLINT NOT NULL DEFAULT 0,
    PRIMARY KEY (principal_id, approval_id)
);
CREATE UNIQUE INDEX approval_cards_event
    ON approval_cards (principal_id, room_id, card_event_id);
CREATE INDEX approval_cards_room ON approval_cards (principal_id, room_id);
-- From a continuation to its card, wherever the card is held.
CREATE INDEX approval_cards_continuation
    ON approval_cards (continuation_principal_id, approval_id);

-- Reported departures by the event that reported them (a leave or ban of ours): a sync
-- that redelivers the event fences nothing again. Written in the fence's own
-- transaction, so no crash or cancellation falls between the advance and its record.
CREATE TABLE journal_reported_departures (
    principal_id TEXT {C} NOT NULL,
    room_id TEXT {C} NOT NULL,
    event_id TEXT {C} NOT NULL,
    PRIMARY KEY (principal_id, room_id, event_id)
);

-- Messages of ours a turn asked reactions on (INTERACTIVE_REACTION): a reaction with
-- one of keys becomes a turn of its own. Derived under a membership: an epoch
-- advance drops the room's rows.
CREATE TABLE journal_interactive (
    principal_id TEXT {C} NOT NULL,
    room_id TEXT {C} NOT NULL,
    target_event_id TEXT {C} NOT NULL,
    turn_id TEXT NOT NULL,
    keys TEXT NOT NULL,               -- JSON list of reaction keys
    PRIMARY KEY (principal_id, room_id, target_event_id)
);
"""


def _render(template: str, *, postgres: bool) -> str:
    if postgres:
        subs = {
            "SEQ_PK": "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
            "C": 'COLLATE "C"',
            "BLOB": "BYTEA",
            "WITHOUT_ROWID": "",
        }
    else:
        # INTEGER PRIMARY KEY is the rowid: receipt order with no second index. Rows of
        # these tables are never deleted from the top, so rowids are never reused.
        subs = {
            "SEQ_PK": "INTEGER PRIMARY KEY",
            "C": "",
            "BLOB": "BLOB",
            "WITHOUT_ROWID": " WITHOUT ROWID",
        }
    return template.format(**subs)


_V3 = """
-- An encrypted event that could not be decrypted is journaled with kind
-- 'decryption_failure' and settled = 3: retained (its ciphertext is the source) but not
-- pending, since it enqueues no answer. When its room key arrives the same row is
-- upgraded in place to what the event is (its kind, type and decrypted source; settled
-- 0 if it owes an answer, 1 if context) and upgraded_from records the class it left, so
-- the upgrade happens once whatever redelivers the event or its key.
ALTER TABLE journal_events ADD COLUMN upgraded_from TEXT;
CREATE INDEX journal_events_undecrypted
    ON journal_events (principal_id, room_id, seq) WHERE settled = 3;
"""


_V4 = """
-- A decryption failure from before our join (the joining sync's timeline up to our
-- join) is retained with settled = 4 instead of 3: when its key comes its upgrade is
-- context only, so a late key never makes the bot answer what was said before it came.
CREATE INDEX journal_events_undecrypted_before_join
    ON journal_events (principal_id, room_id, seq) WHERE settled = 4;
"""

_V5 = """
-- Who reads what the bot sends into an encrypted room: the joined and invited members
-- (a member who left has no row) and the room's history visibility, kept from sync in
-- the commit of its sync token. An audience row marks the room's audience known (from
-- a sync that carried the whole state, or from one /state answer); a room without one
-- asks the homeserver before its first encrypted send.
CREATE TABLE journal_room_members (
    principal_id TEXT {C} NOT NULL,
    room_id TEXT {C} NOT NULL,
    user_id TEXT {C} NOT NULL,
    membership TEXT NOT NULL,         -- 'join' | 'invite'
    PRIMARY KEY (principal_id, room_id, user_id)
){WITHOUT_ROWID};
CREATE TABLE journal_room_audience (
    principal_id TEXT {C} NOT NULL,
    room_id TEXT {C} NOT NULL,
    history_visibility TEXT NOT NULL,
    PRIMARY KEY (principal_id, room_id)
){WITHOUT_ROWID};
"""

MIGRATIONS = (
    Migration(
        version=1,
        name="journal, projection, membership, outbox, turns",
        sqlite=_render(_V1, postgres=False),
        postgres=_render(_V1, postgres=True),
    ),
    Migration(
        version=2,
        name="approval cards and continuations, interactive reactions",
        sqlite=_render(_V2, postgres=False),
        postgres=_render(_V2, postgres=True),
    ),
    Migration(
        version=3,
        name="decryption failures retained until their key arrives, upgraded in place",
        sqlite=_render(_V3, postgres=False),
        postgres=_render(_V3, postgres=True),
    ),
    Migration(
        version=4,
        name="decryption failures from before the join upgraded as context",
        sqlite=_render(_V4, postgres=False),
        postgres=_render(_V4, postgres=True),
    ),
    Migration(
        version=5,
        name="encrypted rooms' audience: members and history visibility",
        sqlite=_render(_V5, postgres=False),
        postgres=_render(_V5, postgres=True),
    ),
)
