"""The relay's tables: numbered, commented migrations for SQLite and PostgreSQL.

Every hot query has an index that covers it (see the comments next to each query in the
store modules beside this one; ``tests/relay/test_store_plans.py`` asks the planner about
the statements the stores really run).
"""

from __future__ import annotations

from gapline.storage import Migration

__all__ = ["MIGRATIONS", "SCHEMA"]

SCHEMA = "meshline_relay"

_V1 = """
-- Relay-wide settings that must survive restarts: the relay's own key.
CREATE TABLE relay_meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- The authoritative AccountDeviceState of each account this relay is home for.
-- canonical: the state's Canonical JSON, compared byte-for-byte on equal revisions.
CREATE TABLE device_states (
    account   TEXT PRIMARY KEY,
    revision  {BIG} NOT NULL,
    canonical TEXT NOT NULL
);

-- The devices of each account's current state, with their certificate validity window.
-- A device is valid at t when it has a row here and not_before <= t < expires_at.
CREATE TABLE account_devices (
    account    TEXT NOT NULL,
    device_id  TEXT NOT NULL,
    not_before {BIG} NOT NULL,
    expires_at {BIG} NOT NULL,
    PRIMARY KEY (account, device_id)
);

-- Every device certificate ever seen in accepted state (latest version per device), so a
-- sync page can carry the certificate of a sender device that has since been removed.
CREATE TABLE device_certificates (
    device_id   TEXT PRIMARY KEY,
    account     TEXT NOT NULL,
    certificate TEXT NOT NULL
);

-- Issued auth.challenge nonces; a verify attempt deletes the row (consumed whatever the outcome).
CREATE TABLE auth_challenges (
    nonce      TEXT PRIMARY KEY,
    account    TEXT NOT NULL,
    expires_at {BIG} NOT NULL
);

-- Sessions, keyed by SHA-256 of the bearer token (the token itself is never stored).
CREATE TABLE sessions (
    token_hash TEXT PRIMARY KEY,
    account    TEXT NOT NULL,
    mode       TEXT NOT NULL,
    device_id  TEXT,
    origin     TEXT NOT NULL,
    expires_at {BIG} NOT NULL
);
CREATE INDEX sessions_by_account ON sessions (account, device_id);

-- The highest sequence ever assigned per account (the timeline head). Never lowered:
-- cleanup deletes records, never this row.
CREATE TABLE account_heads (
    account TEXT PRIMARY KEY,
    head    {BIG} NOT NULL
);

-- One row per timeline record: the original envelope (as received) and its retention deadline
-- (accepted_at + the message_retention in force at acceptance, fixed then).
CREATE TABLE timeline_records (
    account        TEXT NOT NULL,
    sequence       {BIG} NOT NULL,
    accepted_at    {BIG} NOT NULL,
    expires_at     {BIG} NOT NULL,
    from_device_id TEXT NOT NULL,
    envelope       TEXT NOT NULL,
    PRIMARY KEY (account, sequence)
);
-- (No expiry index here: every record has at least one visibility row with the same
-- deadline, so cleanup finds expired records through timeline_visibility_by_expiry.)

-- Device visibility, fixed at acceptance: one row per (record, device valid then), with that
-- device's key box. The primary key orders a device's records by sequence (the sync scan).
CREATE TABLE timeline_visibility (
    account    TEXT NOT NULL,
    device_id  TEXT NOT NULL,
    sequence   {BIG} NOT NULL,
    expires_at {BIG} NOT NULL,
    key_box    TEXT NOT NULL,
    PRIMARY KEY (account, device_id, sequence)
);
-- The retention-gap probe for records expired but not yet cleaned up.
CREATE INDEX timeline_visibility_expired ON timeline_visibility (account, device_id, expires_at, sequence);
-- The cleanup scan.
CREATE INDEX timeline_visibility_by_expiry ON timeline_visibility (expires_at);

-- What cleanup leaves behind of expired visible records: per device, the highest sequence
-- that was visible to it and has expired. A sync after position p has a retention gap
-- exactly when expired_through > p (or an expired row is still waiting for cleanup).
CREATE TABLE retention_gaps (
    account         TEXT NOT NULL,
    device_id       TEXT NOT NULL,
    expired_through {BIG} NOT NULL,
    PRIMARY KEY (account, device_id)
);

-- message.send results for idempotent retries, keyed on (from, message_id); digest is the
-- SHA-256 of the Canonical JSON of the complete request parameters.
CREATE TABLE sends (
    from_account TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    digest       TEXT NOT NULL,
    status       TEXT NOT NULL,
    error        TEXT,
    accepted_at  {BIG} NOT NULL,
    expires_at   {BIG} NOT NULL,
    PRIMARY KEY (from_account, message_id)
);
CREATE INDEX sends_by_expiry ON sends (expires_at);
"""

_V2 = """
-- Each account's current AccountProfile and the certificate of the device that signed it
-- (checked at publication; profile.resolve returns both). revision counts acceptances (1 for
-- the first), so a publication replaces exactly the profile its checks were made against.
CREATE TABLE profiles (
    account            TEXT PRIMARY KEY,
    revision           {BIG} NOT NULL,
    updated_at         {BIG} NOT NULL,
    canonical          TEXT NOT NULL,
    signer_certificate TEXT NOT NULL
);

-- Route-version information, kept forever per DHT key (the key derives from the network
-- context and the account): the highest verified route revision, the content digest at it
-- ('' once two contents were seen there) and whether that same-revision conflict is unresolved.
CREATE TABLE route_history (
    dht_key  TEXT PRIMARY KEY,
    revision {BIG} NOT NULL,
    digest   TEXT NOT NULL,
    conflict INTEGER NOT NULL
);

-- This relay's replica of the account-route DHT keyspace: final co-signed AccountRoute
-- values (UTF-8 JSON, unchanged) by DHT key (hex), only at the key's highest revision.
CREATE TABLE route_records (
    dht_key    TEXT NOT NULL,
    revision   {BIG} NOT NULL,
    digest     TEXT NOT NULL,
    value      TEXT NOT NULL,
    expires_at {BIG} NOT NULL,
    PRIMARY KEY (dht_key, revision, digest)
);
-- The cleanup scan (expired values go; their version information stays in route_history).
CREATE INDEX route_records_by_expiry ON route_records (expires_at);
"""


_V3 = """
-- Cross-relay deliveries this relay owes (message.send accepted for an account homed on
-- another relay): the complete message.deliver params, resent unchanged until a terminal
-- state; deadline is fixed at acceptance. The row goes when the send's status is final.
CREATE TABLE deliveries (
    from_account TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    to_account   TEXT NOT NULL,
    params       TEXT NOT NULL,
    deadline     {BIG} NOT NULL,
    next_attempt {BIG} NOT NULL,
    attempts     INTEGER NOT NULL,
    PRIMARY KEY (from_account, message_id)
);
CREATE INDEX deliveries_due ON deliveries (next_attempt);
"""


def _both(version: int, name: str, text: str) -> Migration:
    return Migration(
        version=version,
        name=name,
        sqlite=text.replace("{BIG}", "INTEGER"),
        postgres=text.replace("{BIG}", "BIGINT"),
    )


MIGRATIONS = [
    _both(1, "timelines, device state, sessions, sends", _V1),
    _both(2, "profiles, account routes and their version information", _V2),
    _both(3, "cross-relay deliveries owed", _V3),
]
