"""The key backup and cross-signing request builders: paths, queries, bodies, retry safety."""

from __future__ import annotations

import msgspec
import pytest

from gapline.matrix import RoomKeysResponse, crypto_api, parse


def test_backup_version_builders() -> None:
    create = crypto_api.room_keys_version_create("alg", {"public_key": "k"})
    assert (create.method, create.path) == ("POST", "/_matrix/client/v3/room_keys/version")
    assert create.json == {"algorithm": "alg", "auth_data": {"public_key": "k"}}
    assert not create.idempotent  # a retry could make a second version
    assert crypto_api.room_keys_version_get().path.endswith("/room_keys/version")
    assert crypto_api.room_keys_version_get("7").path.endswith("/room_keys/version/7")
    delete = crypto_api.room_keys_version_delete("7")
    assert (delete.method, delete.path) == ("DELETE", "/_matrix/client/v3/room_keys/version/7")


def test_room_keys_put_and_get() -> None:
    entry = {"first_message_index": 0, "forwarded_count": 0, "is_verified": False,
             "session_data": {"ciphertext": "c", "mac": "m", "ephemeral": "e"}}  # fmt: skip
    put = crypto_api.room_keys_put("3", {"!r:x": {"S/1": entry}})
    assert put.method == "PUT" and put.query == (("version", "3"),) and put.idempotent
    assert put.json == {"rooms": {"!r:x": {"sessions": {"S/1": entry}}}}
    get = crypto_api.room_keys_get("3")
    assert (get.method, get.query) == ("GET", (("version", "3"),))
    room = crypto_api.room_keys_get("3", "!r:x")
    assert room.path == "/_matrix/client/v3/room_keys/keys/%21r%3Ax"
    one = crypto_api.room_keys_get("3", "!r:x", "S/1")
    assert one.path == "/_matrix/client/v3/room_keys/keys/%21r%3Ax/S%2F1"
    with pytest.raises(ValueError, match="within its room"):
        crypto_api.room_keys_get("3", session_id="S")
    answer = parse(msgspec.json.encode(put.json), RoomKeysResponse)
    assert answer.rooms["!r:x"].sessions["S/1"].session_data["mac"] == "m"


def test_cross_signing_builders() -> None:
    auth = crypto_api.password_auth("@me:x", "pw")
    assert auth == {"type": "m.login.password", "identifier": {"type": "m.id.user", "user": "@me:x"},
                    "password": "pw"}  # fmt: skip
    assert crypto_api.password_auth("@me:x", "pw", session="s")["session"] == "s"
    upload = crypto_api.device_signing_upload({"master_key": {"usage": ["master"]}}, auth=auth)
    assert upload.path == "/_matrix/client/v3/keys/device_signing/upload"
    assert upload.json == {"master_key": {"usage": ["master"]}, "auth": auth}
    signatures = crypto_api.signatures_upload({"@me:x": {"DEV": {"device_id": "DEV"}}})
    assert signatures.path == "/_matrix/client/v3/keys/signatures/upload"
    assert signatures.json == {"@me:x": {"DEV": {"device_id": "DEV"}}}
