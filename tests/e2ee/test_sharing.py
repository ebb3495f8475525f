"""Outbound sessions: fail closed, rotation, leaves and removed devices, m.no_olm, invited members."""

from __future__ import annotations

import pytest

from gapline.e2ee import (
    EncryptionRefused,
    EncryptionRefusedReason,
    ShareState,
    UnableToDecrypt,
    UtdReason,
)

from .harness import Clock, Peer, Room, connected, online
from .keyserver import KeyServer


def _three() -> tuple[KeyServer, Clock, list]:
    server, clock = KeyServer(), Clock()
    peers = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"), ("@carol:x", "C1"))
    return server, clock, peers


def test_encryption_fails_closed() -> None:
    server, clock = KeyServer(), Clock()
    (alice,) = online(server, clock, ("@alice:x", "A1"))
    with pytest.raises(EncryptionRefused) as plain:
        alice.machine.encrypt_room_event("!plain:x", "m.room.message", {"body": "x"})
    assert plain.value.reason is EncryptionRefusedReason.NOT_ENCRYPTED
    with pytest.raises(EncryptionRefused):
        alice.machine.share_room_key("!plain:x", ["@alice:x"])
    room = Room("!r:x")
    alice.join(room)
    assert alice.machine.is_room_encrypted(room.room_id)
    with pytest.raises(EncryptionRefused) as early:
        alice.machine.encrypt_room_event(room.room_id, "m.room.message", {"body": "x"})
    assert early.value.reason is EncryptionRefusedReason.NOT_SHARED
    odd = Room("!odd:x")
    alice.join(odd, {"algorithm": "m.megolm.v2.future"})
    with pytest.raises(EncryptionRefused) as unknown:
        alice.machine.share_room_key(odd.room_id, ["@alice:x"])
    assert unknown.value.reason is EncryptionRefusedReason.UNSUPPORTED_ALGORITHM


def test_a_room_becoming_encrypted_mid_session_is_honoured() -> None:
    server, clock = KeyServer(), Clock()
    (alice,) = online(server, clock, ("@alice:x", "A1"))
    assert not alice.machine.is_room_encrypted("!r:x")
    alice.machine.set_room_encryption("!r:x", {"algorithm": "m.megolm.v1.aes-sha2"})
    assert alice.machine.is_room_encrypted("!r:x")
    assert alice.commit().rooms[0].room_id == "!r:x"


def test_rotation_after_rotation_period_msgs() -> None:
    server, clock = KeyServer(), Clock()
    alice, bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))
    room = Room("!r:x")
    settings = {"algorithm": "m.megolm.v1.aes-sha2", "rotation_period_msgs": 2}
    alice.join(room, settings)
    bob.join(room, settings)
    events = [alice.send(room, f"m{i}") for i in range(5)]
    sessions = [e.content["session_id"] for e in events]
    assert sessions[0] == sessions[1] != sessions[2] == sessions[3] != sessions[4]
    with pytest.raises(EncryptionRefused) as expired:
        alice.machine.encrypt_room_event(room.room_id, "m.room.message", {"body": "x"})
        alice.machine.encrypt_room_event(room.room_id, "m.room.message", {"body": "y"})
    assert expired.value.reason is EncryptionRefusedReason.EXPIRED
    bob.sync()
    assert [bob.body(room, e) for e in events] == [f"m{i}" for i in range(5)]


def test_rotation_after_rotation_period_ms() -> None:
    server, clock = KeyServer(), Clock()
    alice, _bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))
    room = Room("!r:x")
    alice.join(room, {"algorithm": "m.megolm.v1.aes-sha2", "rotation_period_ms": 60_000})
    first = alice.send(room, "a")
    clock.advance(59_999)
    assert alice.send(room, "b").content["session_id"] == first.content["session_id"]
    clock.advance(1)
    assert alice.send(room, "c").content["session_id"] != first.content["session_id"]


def test_a_member_leaving_rotates_and_the_leaver_cannot_read_what_follows() -> None:
    _server, _clock, (alice, bob, carol) = _three()
    room = connected([alice, bob, carol])
    before = alice.send(room, "all three")
    alice.machine.room_member_left(room.room_id, "@carol:x")
    room.members.discard("@carol:x")
    report = alice.share(room)
    assert report.rotated and ("@carol:x", "C1") not in report.shared_with
    after = alice.send(room, "without carol")
    assert after.content["session_id"] != before.content["session_id"]
    bob.sync()
    carol.sync()
    assert bob.body(room, after) == "without carol"
    utd = carol.read(room, after)
    assert isinstance(utd, UnableToDecrypt) and utd.reason is UtdReason.MISSING_ROOM_KEY


def test_a_member_gone_from_the_member_list_rotates_even_without_a_leave_signal() -> None:
    _server, _clock, (alice, bob, carol) = _three()
    room = connected([alice, bob, carol])
    before = alice.send(room, "x")
    room.members.discard("@carol:x")
    assert alice.send(room, "y").content["session_id"] != before.content["session_id"]


def test_a_removed_device_rotates_the_session() -> None:
    server, _clock, (alice, bob, carol) = _three()
    room = connected([alice, bob, carol])
    before = alice.send(room, "x")
    server.remove_device("@carol:x", "C1")
    alice.sync()
    assert alice.send(room, "y").content["session_id"] != before.content["session_id"]


def test_a_device_without_one_time_keys_gets_no_olm_and_the_others_get_the_key() -> None:
    server, clock = KeyServer(), Clock()
    alice, bob, carol = online(
        server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"), ("@carol:x", "C1")
    )
    server.one_time_keys[carol.me].clear()
    del server.fallback_keys[carol.me]
    room = Room("!r:x")
    for p in (alice, bob, carol):
        p.join(room)
    report = alice.share(room)
    assert report.state is ShareState.READY
    assert report.shared_with == (("@bob:x", "B1"),) and report.withheld == (("@carol:x", "C1"),)
    event = alice.send(room, "for bob")
    bob.sync()
    carol.sync()
    assert bob.body(room, event) == "for bob"
    utd = carol.read(room, event)
    assert isinstance(utd, UnableToDecrypt)
    assert (utd.reason, utd.withheld_code) == (UtdReason.WITHHELD, "m.no_olm")


def _carol_without_keys() -> tuple[KeyServer, Clock, Peer, Peer, Room]:
    server, clock = KeyServer(), Clock()
    alice, carol = online(server, clock, ("@alice:x", "A1"), ("@carol:x", "C1"))
    server.one_time_keys[carol.me].clear()
    del server.fallback_keys[carol.me]
    room = Room("!r:x")
    alice.join(room)
    carol.join(room)
    return server, clock, alice, carol, room


def _withheld_notices(server: KeyServer, peer: Peer) -> int:
    return sum(e["type"] == "m.room_key.withheld" for e in server.inbox[peer.me])


def test_a_withheld_device_is_told_once_per_session() -> None:
    server, clock, alice, carol, room = _carol_without_keys()
    first = alice.send(room, "one")
    clock.advance(60_000)
    second = alice.send(room, "two")
    assert first.content["session_id"] == second.content["session_id"]
    assert _withheld_notices(server, carol) == 1


def test_a_withheld_device_gets_the_session_once_it_has_keys_again() -> None:
    server, clock, alice, carol, room = _carol_without_keys()
    first = alice.send(room, "before")
    carol.sync()  # sees its one-time key count at zero and uploads new keys
    assert server.one_time_keys[carol.me]
    clock.advance(2 * 3600 * 1000)  # past the machine's wait before claiming again
    second = alice.send(room, "after")
    assert first.content["session_id"] == second.content["session_id"]  # no rotation
    carol.sync()
    assert carol.body(room, second) == "after"
    still = carol.read(room, first)  # shared from the index it had reached: honest
    assert isinstance(still, UnableToDecrypt)


def test_a_claimed_key_with_a_bad_signature_is_refused_and_withheld() -> None:
    server, clock = KeyServer(), Clock()
    alice, bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))

    def forge(answer: dict) -> dict:
        for devices in answer["one_time_keys"].values():
            for keys in devices.values():
                for key in keys.values():
                    key["key"] = key["key"][:-2] + ("AA" if key["key"][-2:] != "AA" else "BA")
        return answer

    server.edit_claim = forge
    room = Room("!r:x")
    alice.join(room)
    bob.join(room)
    alice.machine.update_tracked_users(room.members)
    alice.pump()
    alice.machine.share_room_key(room.room_id, sorted(room.members))
    updates = alice.pump()
    assert [r.code.value for r in updates.refusals] == ["bad_signature"]
    report = alice.machine.share_room_key(room.room_id, sorted(room.members))
    assert report.state is ShareState.READY and report.withheld == (("@bob:x", "B1"),)


def test_invited_members_get_the_key_unless_history_is_joined_only() -> None:
    server, clock = KeyServer(), Clock()
    alice, _bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))
    room = Room("!r:x")
    alice.join(room)
    for visibility, expected in (("joined", ()), ("shared", (("@bob:x", "B1"),))):
        alice.machine.set_room_encryption(
            room.room_id, {"algorithm": "m.megolm.v1.aes-sha2", "v": visibility}
        )
        for _ in range(4):
            report = alice.machine.share_room_key(
                room.room_id, ["@alice:x"], invited=["@bob:x"], history_visibility=visibility
            )
            alice.pump()
            if report.state is ShareState.READY:
                break
        assert report.shared_with == expected, visibility


def test_an_alone_member_is_reported_unreachable() -> None:
    server, clock = KeyServer(), Clock()
    (alice,) = online(server, clock, ("@alice:x", "A1"))
    room = Room("!r:x")
    alice.join(room)
    room.members.add("@ghost:x")  # a member with no device keys at all
    report = alice.share(room)
    assert report.state is ShareState.READY and report.unreachable_users == ("@ghost:x",)
