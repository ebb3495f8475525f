"""Saving `Changes` and loading the stored state: synchronous operations on a `Tx`.

``save_changes(tx, changes)`` runs inside the caller's own write operation, so
the machine's rows commit or roll back with whatever caused them::

    changes = machine.take_changes()
    await backend.write(lambda tx: (save_changes(tx, changes), save_sync_token(tx, token)))

``load_state(tx)`` reads every row once at open (inside ``Backend.read``); the
machine is then built from it in memory (`CryptoMachine.from_state`).
Writes are upserts keyed by each table's primary key, so saving the same
`Changes` twice leaves the same rows.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gapline.storage import Tx

from ._changes import (
    AccountRecord,
    BackedUpRecord,
    BackupVersionRecord,
    Changes,
    CrossSigningRecord,
    DeviceRecord,
    InboundSessionRecord,
    OlmSessionRecord,
    OutboundSessionRecord,
    OutgoingRecord,
    PendingToDeviceRecord,
    RoomRecord,
    SecretRecord,
    SeenRecord,
    ShareRecord,
    WithheldRecord,
)
from ._store_keys import load_key_rows, save_key_rows

__all__ = ["StoredState", "load_state", "save_changes"]

_PAGE = 5000


def _upsert(table: str, columns: Sequence[str], key: Sequence[str]) -> str:
    marks = ", ".join("?" for _ in columns)
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
    conflict = f"DO UPDATE SET {updates}" if updates else "DO NOTHING"
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks}) "
        f"ON CONFLICT ({', '.join(key)}) {conflict}"
    )


_ACCOUNT = _upsert(
    "e2ee_account",
    [
        "id",
        "user_id",
        "device_id",
        "key_check",
        "pickle",
        "device_keys_uploaded",
        "server_otk_count",
        "created_ms",
    ],
    ["id"],
)
_OLM = _upsert(
    "e2ee_olm_sessions",
    ["sender_key", "session_id", "pickle", "created_ms", "last_used_ms"],
    ["sender_key", "session_id"],
)
_DEVICE = _upsert(
    "e2ee_devices",
    ["user_id", "device_id", "curve25519", "ed25519", "keys_json", "deleted"],
    ["user_id", "device_id"],
)
_CROSS = _upsert("e2ee_cross_signing", ["user_id", "keys_json"], ["user_id"])
_TRACKED = _upsert("e2ee_tracked_users", ["user_id", "outdated"], ["user_id"])
_ROOM = _upsert("e2ee_rooms", ["room_id", "settings_json"], ["room_id"])
_INBOUND = _upsert(
    "e2ee_inbound_sessions",
    [
        "room_id",
        "session_id",
        "sender_key",
        "signing_key",
        "sender_user",
        "sender_device",
        "forwarded",
        "forwarding_chain_json",
        "first_known_index",
        "pickle",
    ],
    ["room_id", "session_id"],
)
_WITHHELD = _upsert(
    "e2ee_withheld",
    ["room_id", "session_id", "sender_key", "code", "reason"],
    ["room_id", "session_id"],
)
# A seen index keeps its first event: the machine refuses a second one before it gets here,
# and a row already stored (another process's) stays as it is.
_SEEN_ROWS = 400  # rows per statement: 1,200 parameters, under every driver's limit


@functools.lru_cache(maxsize=8)
def _seen_sql(rows: int) -> str:
    """The seen-index rows in one multi-row statement: a heal adds one per event, 10,000
    at once, and one statement per row cost twice the time (each row bound, stepped and
    reset on its own)."""
    return (
        "INSERT INTO e2ee_megolm_seen (session_id, message_index, event_digest) VALUES "
        + ", ".join(["(?, ?, ?)"] * rows)
        + " ON CONFLICT (session_id, message_index) DO NOTHING"
    )


_OUTBOUND = _upsert(
    "e2ee_outbound_sessions",
    ["room_id", "session_id", "pickle", "created_ms", "message_count", "settings_json"],
    ["room_id"],
)
_SHARE = _upsert(
    "e2ee_outbound_shares",
    ["room_id", "session_id", "user_id", "device_id", "status", "message_index"],
    ["room_id", "session_id", "user_id", "device_id"],
)
_PENDING = _upsert("e2ee_pending_to_device", ["pending_id", "sender", "sealed"], ["pending_id"])
_OUTGOING = _upsert(
    "e2ee_outgoing", ["request_id", "event_type", "messages_json", "seq"], ["request_id"]
)


def save_changes(tx: Tx, changes: Changes) -> None:
    """Write every row of ``changes`` in the caller's transaction (all or nothing with it)."""
    if changes.account is not None:
        a = changes.account
        tx.execute(
            _ACCOUNT,
            (
                1,
                a.user_id,
                a.device_id,
                a.key_check,
                a.pickle,
                int(a.device_keys_uploaded),
                a.server_otk_count,
                a.created_ms,
            ),
        )
    if changes.olm_sessions:
        tx.executemany(
            _OLM,
            [
                (r.sender_key, r.session_id, r.pickle, r.created_ms, r.last_used_ms)
                for r in changes.olm_sessions
            ],
        )
    if changes.devices:
        tx.executemany(
            _DEVICE,
            [
                (r.user_id, r.device_id, r.curve25519, r.ed25519, r.keys_json, int(r.deleted))
                for r in changes.devices
            ],
        )
    if changes.cross_signing:
        tx.executemany(_CROSS, [(r.user_id, r.keys_json) for r in changes.cross_signing])
    if changes.tracked_users:
        tx.executemany(_TRACKED, [(u, int(outdated)) for u, outdated in changes.tracked_users])
    if changes.untracked_users:
        tx.executemany(
            "DELETE FROM e2ee_tracked_users WHERE user_id = ?",
            [(u,) for u in changes.untracked_users],
        )
    if changes.rooms:
        tx.executemany(_ROOM, [(r.room_id, r.settings_json) for r in changes.rooms])
    if changes.inbound_sessions:
        tx.executemany(
            _INBOUND,
            [
                (
                    r.room_id,
                    r.session_id,
                    r.sender_key,
                    r.signing_key,
                    r.sender_user,
                    r.sender_device,
                    int(r.forwarded),
                    r.forwarding_chain_json,
                    r.first_known_index,
                    r.pickle,
                )
                for r in changes.inbound_sessions
            ],
        )
    if changes.withheld:
        tx.executemany(
            _WITHHELD,
            [(r.room_id, r.session_id, r.sender_key, r.code, r.reason) for r in changes.withheld],
        )
    if changes.withheld_removed:
        tx.executemany(
            "DELETE FROM e2ee_withheld WHERE room_id = ? AND session_id = ?",
            list(changes.withheld_removed),
        )
    seen = changes.seen
    for start in range(0, len(seen), _SEEN_ROWS):
        part = seen[start : start + _SEEN_ROWS]
        tx.execute(
            _seen_sql(len(part)),
            [v for r in part for v in (r.session_id, r.message_index, r.event_digest)],
        )
    if changes.outbound_removed:
        rooms = [(room,) for room in changes.outbound_removed]
        tx.executemany("DELETE FROM e2ee_outbound_shares WHERE room_id = ?", rooms)
        tx.executemany("DELETE FROM e2ee_outbound_sessions WHERE room_id = ?", rooms)
    if changes.outbound_sessions:
        tx.executemany(
            _OUTBOUND,
            [
                (r.room_id, r.session_id, r.pickle, r.created_ms, r.message_count, r.settings_json)
                for r in changes.outbound_sessions
            ],
        )
        # Shares of a replaced session are gone with it.
        tx.executemany(
            "DELETE FROM e2ee_outbound_shares WHERE room_id = ? AND session_id <> ?",
            [(r.room_id, r.session_id) for r in changes.outbound_sessions],
        )
    if changes.shares:
        tx.executemany(
            _SHARE,
            [
                (r.room_id, r.session_id, r.user_id, r.device_id, r.status, r.message_index)
                for r in changes.shares
            ],
        )
    if changes.pending_added:
        tx.executemany(
            _PENDING, [(r.pending_id, r.sender, r.sealed) for r in changes.pending_added]
        )
    if changes.pending_removed:
        tx.executemany(
            "DELETE FROM e2ee_pending_to_device WHERE pending_id = ?",
            [(p,) for p in changes.pending_removed],
        )
    if changes.outgoing_added:
        tx.executemany(
            _OUTGOING,
            [(r.request_id, r.event_type, r.messages_json, r.seq) for r in changes.outgoing_added],
        )
    if changes.outgoing_removed:
        tx.executemany(
            "DELETE FROM e2ee_outgoing WHERE request_id = ?",
            [(r,) for r in changes.outgoing_removed],
        )
    save_key_rows(tx, changes)


@dataclass(frozen=True, slots=True)
class StoredState:
    """Every stored row, as read at open. ``account`` is ``None`` in a new store."""

    account: AccountRecord | None
    olm_sessions: tuple[OlmSessionRecord, ...]
    devices: tuple[DeviceRecord, ...]
    cross_signing: tuple[CrossSigningRecord, ...]
    tracked_users: tuple[tuple[str, bool], ...]
    rooms: tuple[RoomRecord, ...]
    inbound_sessions: tuple[InboundSessionRecord, ...]
    withheld: tuple[WithheldRecord, ...]
    seen: tuple[SeenRecord, ...]
    outbound_sessions: tuple[OutboundSessionRecord, ...]
    shares: tuple[ShareRecord, ...]
    pending: tuple[PendingToDeviceRecord, ...]
    outgoing: tuple[OutgoingRecord, ...]
    secrets: tuple[SecretRecord, ...] = ()
    backup_version: BackupVersionRecord | None = None
    backed_up: tuple[BackedUpRecord, ...] = ()


def _all(tx: Tx, sql: str) -> list[tuple[Any, ...]]:
    """Every row of ``sql`` (which ends in a total ORDER BY), read in bounded pages."""
    rows: list[tuple[Any, ...]] = []
    while True:
        page = tx.all(f"{sql} LIMIT ? OFFSET ?", (_PAGE, len(rows)))
        rows.extend(page)
        if len(page) < _PAGE:
            return rows


def load_state(tx: Tx) -> StoredState:
    """Read the whole stored state in one read transaction (a consistent snapshot)."""
    row = tx.one(
        "SELECT user_id, device_id, key_check, pickle, device_keys_uploaded, server_otk_count,"
        " created_ms FROM e2ee_account WHERE id = 1"
    )
    account = None
    if row is not None:
        account = AccountRecord(
            row[0],
            row[1],
            bytes(row[2]),
            row[3],
            bool(row[4]),
            None if row[5] is None else int(row[5]),
            int(row[6]),
        )
    return StoredState(
        account=account,
        olm_sessions=tuple(
            OlmSessionRecord(r[0], r[1], r[2], int(r[3]), int(r[4]))
            for r in _all(
                tx,
                "SELECT sender_key, session_id, pickle, created_ms, last_used_ms"
                " FROM e2ee_olm_sessions ORDER BY sender_key, session_id",
            )
        ),
        devices=tuple(
            DeviceRecord(r[0], r[1], r[2], r[3], r[4], bool(r[5]))
            for r in _all(
                tx,
                "SELECT user_id, device_id, curve25519, ed25519, keys_json, deleted"
                " FROM e2ee_devices ORDER BY user_id, device_id",
            )
        ),
        cross_signing=tuple(
            CrossSigningRecord(r[0], r[1])
            for r in _all(tx, "SELECT user_id, keys_json FROM e2ee_cross_signing ORDER BY user_id")
        ),
        tracked_users=tuple(
            (r[0], bool(r[1]))
            for r in _all(tx, "SELECT user_id, outdated FROM e2ee_tracked_users ORDER BY user_id")
        ),
        rooms=tuple(
            RoomRecord(r[0], r[1])
            for r in _all(tx, "SELECT room_id, settings_json FROM e2ee_rooms ORDER BY room_id")
        ),
        inbound_sessions=tuple(
            InboundSessionRecord(
                r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), r[7], int(r[8]), r[9]
            )
            for r in _all(
                tx,
                "SELECT room_id, session_id, sender_key, signing_key, sender_user,"
                " sender_device, forwarded, forwarding_chain_json, first_known_index,"
                " pickle FROM e2ee_inbound_sessions ORDER BY room_id, session_id",
            )
        ),
        withheld=tuple(
            WithheldRecord(*r)
            for r in _all(
                tx,
                "SELECT room_id, session_id, sender_key, code, reason"
                " FROM e2ee_withheld ORDER BY room_id, session_id",
            )
        ),
        seen=tuple(
            SeenRecord(r[0], int(r[1]), bytes(r[2]))
            for r in _all(
                tx,
                "SELECT session_id, message_index, event_digest"
                " FROM e2ee_megolm_seen ORDER BY session_id, message_index",
            )
        ),
        outbound_sessions=tuple(
            OutboundSessionRecord(r[0], r[1], r[2], int(r[3]), int(r[4]), r[5])
            for r in _all(
                tx,
                "SELECT room_id, session_id, pickle, created_ms, message_count,"
                " settings_json FROM e2ee_outbound_sessions ORDER BY room_id",
            )
        ),
        shares=tuple(
            ShareRecord(r[0], r[1], r[2], r[3], r[4], int(r[5]))
            for r in _all(
                tx,
                "SELECT room_id, session_id, user_id, device_id, status, message_index"
                " FROM e2ee_outbound_shares"
                " ORDER BY room_id, session_id, user_id, device_id",
            )
        ),
        pending=tuple(
            PendingToDeviceRecord(r[0], r[1], bytes(r[2]))
            for r in _all(
                tx,
                "SELECT pending_id, sender, sealed FROM e2ee_pending_to_device ORDER BY pending_id",
            )
        ),
        outgoing=tuple(
            OutgoingRecord(r[0], r[1], r[2], int(r[3]))
            for r in _all(
                tx,
                "SELECT request_id, event_type, messages_json, seq FROM e2ee_outgoing"
                " ORDER BY seq, request_id",
            )
        ),
        **load_key_rows(tx, _all),
    )
