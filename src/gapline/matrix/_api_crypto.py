"""Request builders and answers for server-side key backup and cross-signing (no I/O).

Key backup (``/room_keys``): a backup *version* holds the algorithm and its
public auth data; sessions are stored per (room, session) under a version.
Cross-signing: ``/keys/device_signing/upload`` publishes a user's master,
self-signing and user-signing keys (user-interactive auth: the account
password); ``/keys/signatures/upload`` publishes signatures of devices and
of other users' master keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from ._request import CLIENT_V3, Request, _path, _q

__all__ = [
    "BackupVersionCreated",
    "BackupVersionResponse",
    "KeyBackupData",
    "RoomKeysResponse",
    "RoomKeysRoomResponse",
    "RoomKeysUpdateResponse",
    "SignaturesUploadResponse",
    "device_signing_upload",
    "password_auth",
    "room_keys_get",
    "room_keys_put",
    "room_keys_version_create",
    "room_keys_version_delete",
    "room_keys_version_get",
    "signatures_upload",
]


class BackupVersionCreated(msgspec.Struct, frozen=True, kw_only=True):
    version: str


class BackupVersionResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /room_keys/version``: the current (or named) backup version."""

    algorithm: str
    auth_data: dict[str, Any]
    version: str
    count: int = 0
    etag: str = ""


class KeyBackupData(msgspec.Struct, frozen=True, kw_only=True):
    """One backed-up session; ``session_data`` is the algorithm's encrypted object."""

    first_message_index: int
    forwarded_count: int
    is_verified: bool
    session_data: dict[str, Any]


class RoomKeysRoomResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /room_keys/keys/{roomId}``: the room's sessions by ID."""

    sessions: dict[str, KeyBackupData] = {}


class RoomKeysResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /room_keys/keys``: ``rooms[room_id].sessions[session_id]``."""

    rooms: dict[str, RoomKeysRoomResponse] = {}


class RoomKeysUpdateResponse(msgspec.Struct, frozen=True, kw_only=True):
    """``PUT /room_keys/keys``: how many sessions the version now holds, and its etag."""

    count: int
    etag: str


class SignaturesUploadResponse(msgspec.Struct, frozen=True, kw_only=True):
    failures: dict[str, dict[str, dict[str, Any]]] = {}


def room_keys_version_create(algorithm: str, auth_data: Mapping[str, Any]) -> Request:
    """``POST /room_keys/version`` (not retried: a retry would create a second version)."""
    return Request(
        "POST",
        _path(CLIENT_V3, "room_keys", "version"),
        json={"algorithm": algorithm, "auth_data": dict(auth_data)},
        idempotent=False,
    )


def room_keys_version_get(version: str | None = None) -> Request:
    """``GET /room_keys/version[/{version}]``; the server answers 404 when there is none."""
    segments = ["room_keys", "version"] + ([version] if version is not None else [])
    return Request("GET", _path(CLIENT_V3, *segments))


def room_keys_version_delete(version: str) -> Request:
    return Request("DELETE", _path(CLIENT_V3, "room_keys", "version", version))


def room_keys_put(version: str, rooms: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> Request:
    """``PUT /room_keys/keys?version=`` with ``{room: {session: KeyBackupData}}``.

    Idempotent: the server keeps the better of two copies of a session."""
    body = {"rooms": {r: {"sessions": dict(s)} for r, s in rooms.items()}}
    return Request(
        "PUT", _path(CLIENT_V3, "room_keys", "keys"), query=_q(version=version), json=body
    )


def room_keys_get(
    version: str, room_id: str | None = None, session_id: str | None = None
) -> Request:
    """``GET /room_keys/keys[/{roomId}[/{sessionId}]]?version=``: every session of the
    version, of one room (a `RoomKeysRoomResponse`), or one session (a `KeyBackupData`).
    A session the backup does not hold is 404."""
    if session_id is not None and room_id is None:
        raise ValueError("a session is asked for within its room")
    segments = ["room_keys", "keys"] + [x for x in (room_id, session_id) if x is not None]
    return Request("GET", _path(CLIENT_V3, *segments), query=_q(version=version))


def password_auth(user_id: str, password: str, session: str | None = None) -> dict[str, Any]:
    """The ``auth`` object of a user-interactive request answered with the password."""
    auth: dict[str, Any] = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": user_id},
        "password": password,
    }
    if session is not None:
        auth["session"] = session
    return auth


def device_signing_upload(
    keys: Mapping[str, Mapping[str, Any]], *, auth: Mapping[str, Any] | None = None
) -> Request:
    """``POST /keys/device_signing/upload`` with ``master_key``, ``self_signing_key``,
    ``user_signing_key`` (any of them) and the user-interactive ``auth``."""
    body: dict[str, Any] = {name: dict(key) for name, key in keys.items()}
    if auth is not None:
        body["auth"] = dict(auth)
    return Request("POST", _path(CLIENT_V3, "keys", "device_signing", "upload"), json=body)


def signatures_upload(signed: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> Request:
    """``POST /keys/signatures/upload`` with ``{user: {key_id_or_device: signed object}}``."""
    body = {u: {k: dict(o) for k, o in by.items()} for u, by in signed.items()}
    return Request("POST", _path(CLIENT_V3, "keys", "signatures", "upload"), json=body)
