"""Cross-signing: bootstrap, signing our devices and other users' master keys, trust levels."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import pytest
import vodozemac

from gapline.e2ee import (
    MASTER_SECRET,
    CryptoMachine,
    DecryptedEvent,
    RequestKind,
    RoomKey,
    TrustLevel,
    signing_bytes,
)
from gapline.e2ee._canonical import signed, verify_signature
from gapline.e2ee._cross_signing import CrossSigningBootstrap, _new_seed, _Signer
from gapline.matrix import ClientEvent, KeysQueryResponse


def _answer_query(machine: CryptoMachine, users: list[str], answer: KeysQueryResponse) -> None:
    machine.update_tracked_users(users)
    machine.receive_sync_changes(changed=users)
    machine.take_changes()
    (request,) = [r for r in machine.outgoing_requests() if r.kind is RequestKind.KEYS_QUERY]
    machine.mark_request_as_sent(request.request_id, answer)
    machine.take_changes()


def _published(machine: CryptoMachine, keys: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The /keys/query fields that list a bootstrap's keys for the machine's user."""
    user = machine.user_id
    return {
        "master_keys": {user: keys["master_key"]},
        "self_signing_keys": {user: keys["self_signing_key"]},
        "user_signing_keys": {user: keys["user_signing_key"]},
    }


def _key(obj: dict[str, Any]) -> str:
    return next(iter(obj["keys"].values()))


def test_bootstrap_signs_each_key_as_the_spec_chains_them() -> None:
    machine = CryptoMachine.create(os.urandom(32), "@me:x", "DEV")
    boot = machine.cross_signing.bootstrap()
    master, ssk, usk = (
        boot.keys[k] for k in ("master_key", "self_signing_key", "user_signing_key")
    )
    assert master["usage"] == ["master"] and _key(master) == boot.master_key
    verify_signature(master, "@me:x", "ed25519:DEV", machine.identity_keys["ed25519"])
    for sub in (ssk, usk):
        verify_signature(sub, "@me:x", f"ed25519:{boot.master_key}", boot.master_key)
    assert machine.vault.get(MASTER_SECRET) is not None
    # Held but not yet listed by the server: no trust from it yet.
    assert machine.cross_signing.trusted_master_key() is None
    _answer_query(
        machine,
        ["@me:x"],
        KeysQueryResponse(device_keys={"@me:x": {}}, **_published(machine, boot.keys)),
    )
    assert machine.cross_signing.trusted_master_key() == boot.master_key
    body = machine.cross_signing.sign_own_device()
    assert body is not None
    device = body["@me:x"]["DEV"]
    verify_signature(device, "@me:x", f"ed25519:{_key(ssk)}", _key(ssk))
    verify_signature(device, "@me:x", "ed25519:DEV", machine.identity_keys["ed25519"])  # kept


class Other:
    """A device of some user, made by hand: keys, and cross-signing keys signed as needed."""

    def __init__(self, user: str, device: str) -> None:
        self.user, self.device = user, device
        self.account = vodozemac.Account()
        self.master = _Signer(_new_seed())
        self.ssk = _Signer(_new_seed())

    def device_keys(self, *, cross_signed: bool) -> dict[str, Any]:
        obj = {
            "user_id": self.user,
            "device_id": self.device,
            "algorithms": ["m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"],
            "keys": {
                f"curve25519:{self.device}": self.account.curve25519_key.to_base64(),
                f"ed25519:{self.device}": self.account.ed25519_key.to_base64(),
            },
        }
        obj = signed(obj, self.user, f"ed25519:{self.device}",
                     lambda m: self.account.sign(m).to_base64())  # fmt: skip
        if cross_signed:
            obj = signed(obj, self.user, f"ed25519:{self.ssk.public}", self.ssk.sign)
        return obj

    def cross_keys(self) -> tuple[dict[str, Any], dict[str, Any]]:
        def key(usage: str, k: _Signer) -> dict[str, Any]:
            return {
                "user_id": self.user,
                "usage": [usage],
                "keys": {f"ed25519:{k.public}": k.public},
            }

        master = key("master", self.master)
        ssk = signed(key("self_signing", self.ssk), self.user, f"ed25519:{self.master.public}",
                     self.master.sign)  # fmt: skip
        return master, ssk


def test_own_devices_signed_by_our_self_signing_key_are_verified_when_we_hold_the_master() -> None:
    me = CryptoMachine.create(os.urandom(32), "@me:x", "DEV")
    boot = me.cross_signing.bootstrap()
    ssk_seed = me.vault.get("m.cross_signing.self_signing")
    assert ssk_seed is not None
    laptop = Other("@me:x", "LAPTOP")
    laptop.ssk = _Signer(ssk_seed)
    listed = {"@me:x": {"LAPTOP": laptop.device_keys(cross_signed=True)}}
    _answer_query(me, ["@me:x"], KeysQueryResponse(device_keys=listed, **_published(me, boot.keys)))
    device = me.device("@me:x", "LAPTOP")
    assert device is not None and device.trust is TrustLevel.VERIFIED
    tracked = me.devices.get("@me:x", "LAPTOP")
    assert tracked is not None and tracked.trust is TrustLevel.CROSS_SIGNED  # the tracker's level
    # Without the master seed (a device that never recovered) it is only cross-signed.
    me.vault.remove(MASTER_SECRET)
    device = me.device("@me:x", "LAPTOP")
    assert device is not None and device.trust is TrustLevel.CROSS_SIGNED


def test_a_held_seed_of_a_replaced_master_key_gives_no_trust(
    caplog: pytest.LogCaptureFixture,
) -> None:
    me = CryptoMachine.create(os.urandom(32), "@me:x", "DEV")
    me.cross_signing.bootstrap()
    elsewhere = CryptoMachine.create(os.urandom(32), "@me:x", "NEW")
    replaced = elsewhere.cross_signing.bootstrap()  # another device bootstrapped again
    with caplog.at_level(logging.WARNING, logger="gapline.e2ee.cross_signing"):
        _answer_query(
            me,
            ["@me:x"],
            KeysQueryResponse(device_keys={"@me:x": {}}, **_published(elsewhere, replaced.keys)),
        )
        assert me.cross_signing.trusted_master_key() is None
    assert "not our listed master key" in caplog.text
    assert me.cross_signing.sign_with_master({"a": 1}) == {"a": 1}


@dataclass
class WithCarol:
    """Our machine after bootstrapping, knowing carol's cross-signed PHONE (not verified)."""

    me: CryptoMachine
    boot: CrossSigningBootstrap
    carol: Other
    master: dict[str, Any]
    listed: dict[str, Any]
    fields: dict[str, Any]

    @classmethod
    def make(cls) -> WithCarol:
        me = CryptoMachine.create(os.urandom(32), "@me:x", "DEV")
        boot = me.cross_signing.bootstrap()
        carol = Other("@carol:x", "PHONE")
        master, ssk = carol.cross_keys()
        listed = {"@carol:x": {"PHONE": carol.device_keys(cross_signed=True)}, "@me:x": {}}
        fields = _published(me, boot.keys)
        fields["master_keys"]["@carol:x"] = master
        fields["self_signing_keys"]["@carol:x"] = ssk
        _answer_query(me, ["@me:x", "@carol:x"], KeysQueryResponse(device_keys=listed, **fields))
        return cls(me, boot, carol, master, listed, fields)


def test_signing_another_users_master_key_verifies_their_cross_signed_devices() -> None:
    w = WithCarol.make()
    me, boot, carol, master, listed, fields = w.me, w.boot, w.carol, w.master, w.listed, w.fields
    device = me.device("@carol:x", "PHONE")
    assert device is not None and device.trust is TrustLevel.CROSS_SIGNED
    assert not me.cross_signing.user_verified("@carol:x")
    body = me.cross_signing.sign_user("@carol:x")
    assert body is not None
    signed_master = body["@carol:x"][carol.master.public]
    usk = _key(boot.keys["user_signing_key"])
    verify_signature(signed_master, "@me:x", f"ed25519:{usk}", usk)
    assert signing_bytes(signed_master) == signing_bytes(master)  # the same key object
    fields["master_keys"]["@carol:x"] = signed_master  # as the server lists it afterwards
    _answer_query(me, ["@carol:x"], KeysQueryResponse(device_keys=listed, **fields))
    assert me.cross_signing.user_verified("@carol:x")
    device = me.device("@carol:x", "PHONE")
    assert device is not None and device.trust is TrustLevel.VERIFIED
    # A device of carol's that her self-signing key did not sign stays unsigned.
    carol2 = Other("@carol:x", "TABLET")
    listed["@carol:x"]["TABLET"] = carol2.device_keys(cross_signed=False)
    _answer_query(me, ["@carol:x"], KeysQueryResponse(device_keys=listed, **fields))
    tablet = me.device("@carol:x", "TABLET")
    assert tablet is not None and tablet.trust is TrustLevel.UNSIGNED


def test_an_event_from_a_verified_device_decrypts_as_verified() -> None:
    w = WithCarol.make()
    me, carol, listed, fields = w.me, w.carol, w.listed, w.fields
    outbound = vodozemac.GroupSession()
    curve = carol.account.curve25519_key.to_base64()
    ed = carol.account.ed25519_key.to_base64()
    key = outbound.session_key.to_base64()
    added = me.inbound.add(
        RoomKey("!r:x", outbound.session_id, key, curve, ed, "@carol:x", "PHONE")
    )
    assert added is True

    def event(n: int) -> ClientEvent:
        plaintext = {"type": "m.room.message", "room_id": "!r:x", "content": {"body": str(n)}}
        content = {
            "algorithm": "m.megolm.v1.aes-sha2",
            "ciphertext": outbound.encrypt(json.dumps(plaintext).encode()).to_base64(),
            "session_id": outbound.session_id,
            "sender_key": curve,
        }
        return ClientEvent(event_id=f"$e{n}", type="m.room.encrypted", sender="@carol:x",
                           origin_server_ts=n, content=content)  # fmt: skip

    before = me.decrypt_room_event("!r:x", event(1))
    assert isinstance(before, DecryptedEvent) and before.trust is TrustLevel.CROSS_SIGNED
    signed_master = (me.cross_signing.sign_user("@carol:x") or {})["@carol:x"][carol.master.public]
    fields["master_keys"]["@carol:x"] = signed_master
    _answer_query(me, ["@carol:x"], KeysQueryResponse(device_keys=listed, **fields))
    after = me.decrypt_room_event("!r:x", event(2))
    assert isinstance(after, DecryptedEvent) and after.trust is TrustLevel.VERIFIED
