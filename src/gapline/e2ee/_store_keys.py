"""Saving and loading the rows of the key-keeping machines (held secrets, key backup).

The same rules as `_store.py`: called from `save_changes` inside the caller's
transaction, upserts by primary key, and read once at open.
"""

from __future__ import annotations

from typing import Any

from gapline.storage import Tx

from ._changes import BackedUpRecord, BackupVersionRecord, Changes, SecretRecord

__all__ = ["load_key_rows", "save_key_rows"]

_SECRET = (
    "INSERT INTO e2ee_secrets (name, sealed) VALUES (?, ?) "
    "ON CONFLICT (name) DO UPDATE SET sealed = excluded.sealed"
)
_VERSION = (
    "INSERT INTO e2ee_backup_version (id, version, algorithm, auth_data_json) VALUES (1, ?, ?, ?) "
    "ON CONFLICT (id) DO UPDATE SET version = excluded.version, "
    "algorithm = excluded.algorithm, auth_data_json = excluded.auth_data_json"
)
_BACKED_UP = (
    "INSERT INTO e2ee_backed_up (room_id, session_id, version, first_known_index, restored) "
    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (room_id, session_id) DO UPDATE SET "
    "version = excluded.version, first_known_index = excluded.first_known_index, "
    "restored = excluded.restored"
)


def save_key_rows(tx: Tx, changes: Changes) -> None:
    if changes.secrets:
        tx.executemany(_SECRET, [(r.name, r.sealed) for r in changes.secrets])
    if changes.secrets_removed:
        tx.executemany(
            "DELETE FROM e2ee_secrets WHERE name = ?", [(n,) for n in changes.secrets_removed]
        )
    if changes.backup_version_removed:
        tx.execute("DELETE FROM e2ee_backup_version")
        tx.execute("DELETE FROM e2ee_backed_up")
    for v in changes.backup_version:
        tx.execute(_VERSION, (v.version, v.algorithm, v.auth_data_json))
        # What another version held says nothing about this one.
        tx.execute("DELETE FROM e2ee_backed_up WHERE version <> ?", (v.version,))
    if changes.backed_up:
        tx.executemany(
            _BACKED_UP,
            [
                (r.room_id, r.session_id, r.version, r.first_known_index, int(r.restored))
                for r in changes.backed_up
            ],
        )


def load_key_rows(tx: Tx, read_all: Any) -> dict[str, Any]:
    """The `StoredState` fields of these tables (``read_all`` pages a query)."""
    version = tx.one("SELECT version, algorithm, auth_data_json FROM e2ee_backup_version")
    return {
        "secrets": tuple(
            SecretRecord(r[0], bytes(r[1]))
            for r in read_all(tx, "SELECT name, sealed FROM e2ee_secrets ORDER BY name")
        ),
        "backup_version": None if version is None else BackupVersionRecord(*version),
        "backed_up": tuple(
            BackedUpRecord(r[0], r[1], r[2], int(r[3]), bool(r[4]))
            for r in read_all(
                tx,
                "SELECT room_id, session_id, version, first_known_index, restored"
                " FROM e2ee_backed_up ORDER BY room_id, session_id",
            )
        ),
    }
