"""The ``e2ee`` schema: numbered migrations, SQLite and PostgreSQL texts side by side.

Secret columns hold sealed values only: vodozemac pickles (encrypted and
authenticated under the machine's pickle key) and values sealed by the machine's
value cipher. Public keys, IDs and counters are stored as they are; looked-up
event IDs are stored as keyed hashes. Timestamps are milliseconds (BIGINT on
PostgreSQL, where INTEGER is 32-bit).
"""

from __future__ import annotations

from gapline.storage import Migration

__all__ = ["E2EE_MIGRATIONS", "E2EE_SCHEMA"]

E2EE_SCHEMA = "e2ee"

_V1 = """
-- This device's Olm account: one row.
CREATE TABLE e2ee_account (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    key_check {blob} NOT NULL,           -- HMAC of a constant under the store key: wrong key at open
    pickle TEXT NOT NULL,                -- vodozemac Account pickle (identity and one-time keys)
    device_keys_uploaded INTEGER NOT NULL, -- 1 once /keys/upload accepted the device keys
    server_otk_count {bigint},           -- one-time keys the server holds (last report), NULL unknown
    created_ms {bigint} NOT NULL
);
-- Olm sessions with other devices, by the other device's Curve25519 key.
CREATE TABLE e2ee_olm_sessions (
    sender_key TEXT NOT NULL,
    session_id TEXT NOT NULL,
    pickle TEXT NOT NULL,                -- vodozemac Session pickle (the ratchet)
    created_ms {bigint} NOT NULL,
    last_used_ms {bigint} NOT NULL,      -- the newest session is the one used to send
    PRIMARY KEY (sender_key, session_id)
);
-- Users whose device lists are followed; outdated = 1 until the next /keys/query answer.
CREATE TABLE e2ee_tracked_users (
    user_id TEXT PRIMARY KEY,
    outdated INTEGER NOT NULL
);
-- Accepted devices. A (user, device) pair keeps its keys for good: a device ID that
-- comes back with other keys is refused, so rows are never deleted, only marked.
CREATE TABLE e2ee_devices (
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    curve25519 TEXT NOT NULL,
    ed25519 TEXT NOT NULL,
    keys_json TEXT NOT NULL,             -- the self-signed device keys object as received
    deleted INTEGER NOT NULL,            -- 1 when it left its owner's device list
    PRIMARY KEY (user_id, device_id)
);
CREATE INDEX e2ee_devices_by_curve ON e2ee_devices (curve25519);
-- Cross-signing keys of a user (master, self-signing, user-signing) as received.
CREATE TABLE e2ee_cross_signing (
    user_id TEXT PRIMARY KEY,
    keys_json TEXT NOT NULL
);
-- Encrypted rooms: their m.room.encryption content (a room never becomes unencrypted).
CREATE TABLE e2ee_rooms (
    room_id TEXT PRIMARY KEY,
    settings_json TEXT NOT NULL
);
-- Megolm sessions others share with us (and ours, so we read our own messages).
CREATE TABLE e2ee_inbound_sessions (
    room_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    sender_key TEXT NOT NULL,            -- Curve25519 key of the Olm channel that delivered it
    signing_key TEXT NOT NULL,           -- the sending device's claimed Ed25519 key
    sender_user TEXT,                    -- owner of the sending device, when known
    sender_device TEXT,
    forwarded INTEGER NOT NULL,          -- 1: came as m.forwarded_room_key
    forwarding_chain_json TEXT NOT NULL, -- Curve25519 keys it was forwarded through
    first_known_index {bigint} NOT NULL,
    pickle TEXT NOT NULL,                -- vodozemac InboundGroupSession pickle
    PRIMARY KEY (room_id, session_id)
);
-- m.room_key.withheld notices for sessions we have no key for.
CREATE TABLE e2ee_withheld (
    room_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    sender_key TEXT NOT NULL,
    code TEXT NOT NULL,
    reason TEXT NOT NULL,
    PRIMARY KEY (room_id, session_id)
);
-- Which event used each Megolm message index: another event at the same index is a replay.
CREATE TABLE e2ee_megolm_seen (
    session_id TEXT NOT NULL,
    message_index {bigint} NOT NULL,
    event_digest {blob} NOT NULL,        -- keyed hash of the event ID
    PRIMARY KEY (session_id, message_index)
);
-- Our outbound Megolm session per encrypted room.
CREATE TABLE e2ee_outbound_sessions (
    room_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    pickle TEXT NOT NULL,                -- vodozemac GroupSession pickle
    created_ms {bigint} NOT NULL,
    message_count {bigint} NOT NULL,     -- messages encrypted with it, for rotation_period_msgs
    settings_json TEXT NOT NULL          -- the settings it was created under
);
-- Which devices an outbound session was given to (or withheld from), and from which index.
CREATE TABLE e2ee_outbound_shares (
    room_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    status TEXT NOT NULL,                -- 'shared' or 'withheld'
    message_index {bigint} NOT NULL,
    PRIMARY KEY (room_id, session_id, user_id, device_id)
);
-- Decrypted to-device payloads waiting for their sender's device keys (sealed: room keys).
CREATE TABLE e2ee_pending_to_device (
    pending_id TEXT PRIMARY KEY,
    sender TEXT NOT NULL,
    sealed {blob} NOT NULL
);
-- sendToDevice requests built but not yet acknowledged; resent with the same txn ID.
CREATE TABLE e2ee_outgoing (
    request_id TEXT PRIMARY KEY,
    event_type TEXT NOT NULL,
    messages_json TEXT NOT NULL,
    seq {bigint} NOT NULL                -- send order
);
"""

_V2 = """
-- Private keys this device holds, each sealed by the value cipher (row-bound): the backup
-- decryption key and the cross-signing seeds, by their secret-storage names.
CREATE TABLE e2ee_secrets (
    name TEXT PRIMARY KEY,
    sealed {blob} NOT NULL
);
-- The server-side key backup version this device uploads to (one row, or none).
CREATE TABLE e2ee_backup_version (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    auth_data_json TEXT NOT NULL         -- as the server listed it (public key, signatures)
);
-- Which inbound sessions that version holds, and how good a copy: a session is uploaded
-- again only when we come to hold it from an earlier index.
CREATE TABLE e2ee_backed_up (
    room_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    version TEXT NOT NULL,
    first_known_index {bigint} NOT NULL,
    restored INTEGER NOT NULL,           -- 1: the copy we hold came from this backup
    PRIMARY KEY (room_id, session_id)
);
"""

E2EE_MIGRATIONS = [
    Migration(
        1,
        "account, devices, Olm and Megolm sessions, shares, pending and outgoing to-device",
        sqlite=_V1.format(blob="BLOB", bigint="INTEGER"),
        postgres=_V1.format(blob="BYTEA", bigint="BIGINT"),
    ),
    Migration(
        2,
        "held private keys, the key backup version and which sessions it holds",
        sqlite=_V2.format(blob="BLOB", bigint="INTEGER"),
        postgres=_V2.format(blob="BYTEA", bigint="BIGINT"),
    ),
]
