"""Device tracking: self-signatures, pinned keys, removal, cross-signing trust."""

from __future__ import annotations

import copy
from typing import Any

import vodozemac

from gapline.e2ee import RefusalCode, TrustLevel
from gapline.e2ee._canonical import signed

from .harness import Clock, Peer, online
from .keyserver import KeyServer


def _requery(peer: Peer, user: str) -> Any:
    peer.machine.update_tracked_users([user])
    peer.machine.receive_sync_changes(changed=[user])
    return peer.pump()


def test_a_device_with_a_bad_self_signature_is_refused() -> None:
    server, clock = KeyServer(), Clock()
    alice, _bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))
    (mallory,) = online(server, clock, ("@bob:x", "B2"))
    keys = server.device_keys["@bob:x"]["B2"]
    keys["keys"]["curve25519:B2"] = (
        vodozemac.Account().curve25519_key.to_base64()
    )  # signature no longer covers it
    updates = _requery(alice, "@bob:x")
    assert [r.code for r in updates.refusals] == [RefusalCode.BAD_SIGNATURE]
    assert [d.device_id for d in alice.machine.devices_of("@bob:x")] == ["B1"]
    assert mallory.machine.device_id == "B2"


def test_a_device_listed_under_another_id_is_refused() -> None:
    server, clock = KeyServer(), Clock()
    alice, _bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))

    def relist(answer: dict[str, Any]) -> dict[str, Any]:
        b1 = answer["device_keys"].get("@bob:x", {}).get("B1")
        if b1 is not None:
            answer["device_keys"]["@bob:x"]["EVIL"] = copy.deepcopy(b1)
        return answer

    server.edit_query = relist
    updates = _requery(alice, "@bob:x")
    assert [r.code for r in updates.refusals] == [RefusalCode.MISMATCHED_IDS]
    assert alice.machine.device("@bob:x", "EVIL") is None


def test_a_changed_key_for_a_known_device_is_refused_and_the_pinned_keys_stay() -> None:
    server, clock = KeyServer(), Clock()
    alice, bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))
    _requery(alice, "@bob:x")
    pinned = alice.machine.device("@bob:x", "B1")
    assert pinned is not None
    impostor = Peer(
        KeyServer(), "@bob:x", "B1", clock
    )  # same device ID, new keys, validly self-signed
    server.device_keys["@bob:x"]["B1"] = impostor.machine.account.device_keys()
    updates = _requery(alice, "@bob:x")
    assert [r.code for r in updates.refusals] == [RefusalCode.CHANGED_DEVICE_KEY]
    assert alice.machine.device("@bob:x", "B1") == pinned
    assert pinned.ed25519 == bob.machine.identity_keys["ed25519"]


def test_a_removed_device_is_marked_deleted_and_keeps_its_id_pinned() -> None:
    server, clock = KeyServer(), Clock()
    alice, _b1, _b2 = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"), ("@bob:x", "B2"))
    _requery(alice, "@bob:x")
    server.remove_device("@bob:x", "B2")
    alice.sync()
    assert [d.device_id for d in alice.machine.devices_of("@bob:x")] == ["B1"]
    gone = alice.machine.device("@bob:x", "B2")
    assert gone is not None and gone.deleted
    other = Peer(KeyServer(), "@bob:x", "B2", clock)
    server.device_keys["@bob:x"]["B2"] = other.machine.account.device_keys()
    updates = _requery(alice, "@bob:x")
    assert [r.code for r in updates.refusals] == [RefusalCode.CHANGED_DEVICE_KEY]


def test_users_that_left_are_no_longer_tracked() -> None:
    server, clock = KeyServer(), Clock()
    alice, _bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))
    alice.machine.update_tracked_users(["@bob:x"])
    alice.pump()
    assert "@bob:x" in alice.machine.devices.tracked
    alice.machine.receive_sync_changes(left=["@bob:x"])
    changes = alice.commit()
    assert "@bob:x" not in alice.machine.devices.tracked and changes.untracked_users == ("@bob:x",)


def _cross_sign(server: KeyServer, user: str, device_id: str, *, sign_ssk: bool = True) -> None:
    master, ssk = vodozemac.Account(), vodozemac.Account()  # two Ed25519 key pairs
    mpub, spub = master.ed25519_key.to_base64(), ssk.ed25519_key.to_base64()
    master_obj = {"user_id": user, "usage": ["master"], "keys": {f"ed25519:{mpub}": mpub}}
    ssk_obj: dict[str, Any] = {
        "user_id": user,
        "usage": ["self_signing"],
        "keys": {f"ed25519:{spub}": spub},
    }
    if sign_ssk:
        ssk_obj = signed(ssk_obj, user, f"ed25519:{mpub}", lambda m: master.sign(m).to_base64())
    server.master_keys[user] = master_obj
    server.self_signing_keys[user] = ssk_obj
    device = server.device_keys[user][device_id]
    server.device_keys[user][device_id] = signed(
        device, user, f"ed25519:{spub}", lambda m: ssk.sign(m).to_base64()
    )


def test_a_device_signed_by_its_owners_self_signing_key_is_cross_signed() -> None:
    server, clock = KeyServer(), Clock()
    alice, _b1, _b2 = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"), ("@bob:x", "B2"))
    _cross_sign(server, "@bob:x", "B1")
    updates = _requery(alice, "@bob:x")
    assert updates.refusals == () and "@bob:x" in updates.devices_changed
    trust = {d.device_id: d.trust for d in alice.machine.devices_of("@bob:x")}
    assert trust == {"B1": TrustLevel.CROSS_SIGNED, "B2": TrustLevel.UNSIGNED}


def test_a_self_signing_key_the_master_key_did_not_sign_counts_for_nothing() -> None:
    server, clock = KeyServer(), Clock()
    alice, _bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))
    _cross_sign(server, "@bob:x", "B1", sign_ssk=False)
    updates = _requery(alice, "@bob:x")
    assert [r.code for r in updates.refusals] == [RefusalCode.BAD_SIGNATURE]
    device = alice.machine.device("@bob:x", "B1")
    assert device is not None and device.trust is TrustLevel.UNSIGNED


def test_a_changed_device_list_during_a_query_is_queried_again() -> None:
    server, clock = KeyServer(), Clock()
    alice, _bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))
    alice.machine.update_tracked_users(["@bob:x"])
    alice.commit()
    (query,) = alice.machine.outgoing_requests()
    answer = server.handle(
        alice.me, query.request, query.response_type
    )  # answered before B2 existed
    online(server, clock, ("@bob:x", "B2"))
    alice.machine.receive_sync_changes(changed=["@bob:x"])  # arrives while the query is out
    alice.machine.mark_request_as_sent(query.request_id, answer)
    alice.pump()
    assert {d.device_id for d in alice.machine.devices_of("@bob:x")} == {"B1", "B2"}
