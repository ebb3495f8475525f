"""Server-side key backup: the construction, trust in a version, upload once, restore, bad entries."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
from dataclasses import replace
from typing import Any

import msgspec
import pytest
import vodozemac
from cryptography.hazmat.primitives import hashes, padding
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from gapline.e2ee import BACKUP_SECRET, CryptoMachine, DecryptedEvent, UnableToDecrypt
from gapline.e2ee._backup_crypto import (
    BACKUP_ALGORITHM,
    BackupEntryInvalid,
    BackupKey,
    seal_session,
)
from gapline.e2ee._canonical import b64decode, b64encode
from gapline.matrix import BackupVersionResponse, Request, RoomKeysResponse

from .harness import Clock, Peer, Room, connected, online
from .keyserver import KeyServer


def _kdf(shared: bytes) -> tuple[bytes, bytes, bytes]:
    out = HKDF(algorithm=hashes.SHA256(), length=80, salt=bytes(32), info=b"").derive(shared)
    return out[:32], out[32:64], out[64:]


def _spec_decrypt(private: bytes, data: dict[str, str]) -> bytes:
    """The construction on `cryptography`: X25519, HKDF-SHA-256 (zero salt) to 80 bytes,
    AES-256-CBC with PKCS#7; the MAC as deployed clients compute it (over an empty input)."""
    shared = X25519PrivateKey.from_private_bytes(private).exchange(
        X25519PublicKey.from_public_bytes(b64decode(data["ephemeral"]))
    )
    aes_key, mac_key, iv = _kdf(shared)
    assert hmac.new(mac_key, b"", hashlib.sha256).digest()[:8] == b64decode(data["mac"])
    decryptor = Cipher(algorithms.AES(aes_key), modes.CBC(iv)).decryptor()
    padded = decryptor.update(b64decode(data["ciphertext"])) + decryptor.finalize()
    unpadder = padding.PKCS7(128).unpadder()
    return unpadder.update(padded) + unpadder.finalize()


def _spec_encrypt(public: bytes, plaintext: bytes) -> dict[str, str]:
    ephemeral = X25519PrivateKey.generate()
    shared = ephemeral.exchange(X25519PublicKey.from_public_bytes(public))
    aes_key, mac_key, iv = _kdf(shared)
    padder = padding.PKCS7(128).padder()
    encryptor = Cipher(algorithms.AES(aes_key), modes.CBC(iv)).encryptor()
    ciphertext = (
        encryptor.update(padder.update(plaintext) + padder.finalize()) + encryptor.finalize()
    )
    eph = ephemeral.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    mac = hmac.new(mac_key, b"", hashlib.sha256).digest()[:8]
    return {"ephemeral": b64encode(eph), "ciphertext": b64encode(ciphertext), "mac": b64encode(mac)}


def test_session_data_follows_the_specified_construction_both_ways() -> None:
    key = BackupKey.generate()
    session = {"algorithm": "m.megolm.v1.aes-sha2", "session_key": "AQID", "sender_key": "k"}
    sealed = seal_session(key.encryption(), session)
    assert json.loads(_spec_decrypt(b64decode(key.secret), sealed)) == session
    public = b64decode(key.public_key)
    assert key.open(_spec_encrypt(public, json.dumps(session).encode())) == session
    bad = {**sealed, "mac": b64encode(b"\0" * 8)}
    with pytest.raises(BackupEntryInvalid, match="MAC"):
        key.open(bad)


class RoomKeysServer:
    """``/room_keys`` in memory: one version, sessions kept as uploaded."""

    def __init__(self) -> None:
        self.version: BackupVersionResponse | None = None
        self.rooms: dict[str, dict[str, dict[str, Any]]] = {}
        self.puts = 0

    def create(self, request: Request) -> str:
        assert request.method == "POST" and request.path.endswith("/room_keys/version")
        self.version = BackupVersionResponse(
            algorithm=request.json["algorithm"], auth_data=request.json["auth_data"], version="1"
        )
        return "1"

    def put(self, request: Request) -> None:
        assert request.method == "PUT" and dict(request.query) == {"version": "1"}
        self.puts += 1
        for room_id, room in request.json["rooms"].items():
            for session_id, data in room["sessions"].items():
                self.rooms.setdefault(room_id, {})[session_id] = data

    def keys(self) -> RoomKeysResponse:
        body = {"rooms": {r: {"sessions": s} for r, s in self.rooms.items()}}
        return msgspec.convert(body, RoomKeysResponse)

    def count(self) -> int:
        return sum(len(s) for s in self.rooms.values())


def _upload_all(machine: CryptoMachine, server: RoomKeysServer, batch: int = 200) -> int:
    sent = 0
    while (upload := machine.backup.next_upload(batch)) is not None:
        server.put(upload.request)
        machine.backup.upload_done(upload)
        sent += len(upload.sessions)
    return sent


def _versioned(machine: CryptoMachine) -> RoomKeysServer:
    """A backup server whose version ``machine`` created (and uses)."""
    keys = RoomKeysServer()
    keys.create(machine.backup.create_version())
    machine.backup.version_created("1")
    return keys


def _scene() -> tuple[KeyServer, Clock, Peer, Peer, Room]:
    server, clock = KeyServer(), Clock()
    alice, bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))
    room = connected([alice, bob])
    return server, clock, alice, bob, room


def test_every_session_is_uploaded_once_in_batches() -> None:
    _server, _clock, alice, bob, room = _scene()
    first = alice.send(room, "one")
    bob.sync()
    keys = _versioned(bob.machine)
    held = set(bob.machine.inbound.identifiers())
    assert bob.machine.backup.pending == len(held)
    assert _upload_all(bob.machine, keys, batch=1) == len(held)
    assert keys.puts == len(held)  # batches of one here
    assert bob.machine.backup.pending == 0 and bob.machine.backup.next_upload() is None
    rows = bob.commit().backed_up
    assert {(r.room_id, r.session_id) for r in rows} == held
    # The same key again changes nothing; a new session is the only one uploaded.
    second_room = Room("!second:x")
    alice.join(second_room)
    bob.join(second_room)
    later = alice.send(second_room, "two")
    bob.sync()
    assert bob.machine.backup.pending == 1
    assert _upload_all(bob.machine, keys) == 1
    assert later.content["session_id"] in keys.rooms[second_room.room_id]
    assert first.content["session_id"] in keys.rooms[room.room_id]


def test_a_better_copy_is_uploaded_again_and_the_same_copy_is_not() -> None:
    server, clock, alice, bob, room = _scene()
    events = [alice.send(room, f"m{i}") for i in range(3)]
    bob.sync()
    sid = events[0].content["session_id"]
    session = bob.machine.inbound._sessions[(room.room_id, sid)]
    phone = Peer(server, "@bob:x", "B2", clock)

    def give(index: int) -> bool | object:
        exported = session.session.export_at(index)
        assert exported is not None
        key = replace(session.key, session_key=exported.to_base64(), forwarded=True)
        return phone.machine.inbound.add(key)

    assert give(2) is True
    keys = _versioned(phone.machine)
    assert _upload_all(phone.machine, keys) == 1
    assert keys.rooms[room.room_id][sid]["first_message_index"] == 2
    assert give(2) is False and phone.machine.backup.pending == 0
    assert give(0) is True and phone.machine.backup.pending == 1  # earlier index: better
    assert _upload_all(phone.machine, keys) == 1
    assert keys.rooms[room.room_id][sid]["first_message_index"] == 0
    assert give(1) is False and phone.machine.backup.pending == 0


def test_a_backup_restores_on_a_new_device_marked_from_backup() -> None:
    server, clock, alice, bob, room = _scene()
    events = [alice.send(room, f"history {i}") for i in range(3)]
    bob.sync()
    keys = _versioned(bob.machine)
    _upload_all(bob.machine, keys)
    secret = bob.machine.vault.get(BACKUP_SECRET)
    assert secret is not None
    phone = Peer(server, "@bob:x", "B2", clock)
    assert isinstance(phone.read(room, events[0]), UnableToDecrypt)
    phone.machine.vault.put(BACKUP_SECRET, secret)  # as a recovery from secret storage would
    assert keys.version is not None
    trust = phone.machine.backup.use_version(keys.version)
    assert trust.trusted and "holds its private key" in trust.reason
    report = phone.machine.backup.restore("1", keys.keys())
    assert len(report.imported) == keys.count() and not report.refusals
    results = [phone.read(room, e) for e in events]
    bodies = [r.content["body"] for r in results if isinstance(r, DecryptedEvent)]
    assert bodies == ["history 0", "history 1", "history 2"]
    assert all(r.forwarded for r in results if isinstance(r, DecryptedEvent))
    sid = events[0].content["session_id"]
    assert phone.machine.backup.is_from_backup(room.room_id, sid)
    assert phone.machine.backup.pending == 0  # not uploaded back to where it came from
    again = phone.machine.backup.restore("1", keys.keys())
    assert again.imported == () and again.already_known == keys.count()


def test_a_backup_entry_failing_its_mac_is_refused_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, clock, alice, bob, room = _scene()
    event = alice.send(room, "kept")
    bob.sync()
    keys = _versioned(bob.machine)
    _upload_all(bob.machine, keys)
    sid = event.content["session_id"]
    entry = keys.rooms[room.room_id][sid]
    raw = bytearray(base64.b64decode(entry["session_data"]["ciphertext"] + "=="))
    raw[0] ^= 1
    entry["session_data"]["ciphertext"] = b64encode(bytes(raw))
    phone = Peer(server, "@bob:x", "B2", clock)
    phone.machine.vault.put(BACKUP_SECRET, bob.machine.vault.get(BACKUP_SECRET) or "")
    with caplog.at_level(logging.WARNING, logger="gapline.e2ee.backup"):
        report = phone.machine.backup.restore("1", keys.keys())
    assert [r.detail for r in report.refusals if sid in r.detail]
    assert any(sid in m and "refused" in m for m in caplog.messages)
    assert not phone.machine.inbound.has_session(room.room_id, sid)
    assert len(report.imported) == keys.count() - 1  # the others came in


def _version(auth_data: dict[str, Any]) -> BackupVersionResponse:
    return BackupVersionResponse(algorithm=BACKUP_ALGORITHM, auth_data=auth_data, version="7")


def test_a_version_is_trusted_only_when_signed_by_a_trusted_device(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, clock, _alice, bob, _room = _scene()
    public = BackupKey.generate().public_key
    unsigned = {"public_key": public}
    ours = bob.machine.account.sign_json(unsigned)
    with caplog.at_level(logging.WARNING, logger="gapline.e2ee.backup"):
        refused = bob.machine.backup.use_version(_version(unsigned))
    assert not refused.trusted and bob.machine.backup.version is None
    assert "version 7 refused" in caplog.text
    assert bob.machine.backup.next_upload() is None
    forged = {**ours, "public_key": BackupKey.generate().public_key}  # signature of another key
    assert not bob.machine.backup.use_version(_version(forged)).trusted
    # Another device of bob, known but not cross-signed: not enough either.
    other = Peer(server, "@bob:x", "B9", clock)
    other.pump()
    bob.machine.receive_sync_changes(changed=["@bob:x"])
    bob.pump()
    assert bob.machine.device("@bob:x", "B9") is not None
    by_other = other.machine.account.sign_json(unsigned)
    untrusted = bob.machine.backup.use_version(_version(by_other))
    assert not untrusted.trusted and "B9 is not trusted" in untrusted.reason
    trusted = bob.machine.backup.use_version(_version(ours))
    assert trusted.trusted and bob.machine.backup.version == "7"
    assert bob.machine.backup.pending == len(bob.machine.inbound.identifiers())
    # An untrusted version replacing it on the server: uploads stop, not to the old one.
    replaced = BackupVersionResponse(algorithm=BACKUP_ALGORITHM, auth_data=unsigned, version="8")
    assert not bob.machine.backup.use_version(replaced).trusted
    assert bob.machine.backup.version is None and bob.machine.backup.next_upload() is None
    assert bob.machine.take_changes().backup_version_removed


def test_restoring_without_the_key_is_a_clear_error() -> None:
    _server, _clock, _alice, bob, _room = _scene()
    with pytest.raises(ValueError, match="no backup key is held"):
        bob.machine.backup.restore("1", RoomKeysResponse())


def test_pk_message_parts_are_named_not_positional() -> None:
    """vodozemac's ``Message.to_base64`` orders its parts otherwise than its constructor;
    the sealed object is built from the named fields."""
    key = BackupKey.generate()
    sealed = seal_session(key.encryption(), {"a": 1})
    assert len(b64decode(sealed["ephemeral"])) == 32 and len(b64decode(sealed["mac"])) == 8
    message = vodozemac.Message.from_base64(
        sealed["ciphertext"], sealed["mac"], sealed["ephemeral"]
    )
    assert message.ephemeral_key == b64decode(sealed["ephemeral"])


def test_keys_are_fetchable_only_from_a_version_whose_private_key_is_held() -> None:
    server = KeyServer()
    clock = Clock()
    alice = Peer(server, "@alice:x", "A1", clock)
    backup = alice.machine.backup
    assert backup.fetchable_version is None  # no version
    request = backup.create_version()
    backup.version_created("7")
    assert request.json is not None and backup.fetchable_version == "7"
    alice.machine.vault.put(BACKUP_SECRET, BackupKey.generate().secret)  # another key
    assert backup.fetchable_version is None
    alice.machine.vault.put(BACKUP_SECRET, "not a key")
    assert backup.fetchable_version is None
