"""Two and three machines exchanging keys and messages through recorded requests."""

from __future__ import annotations

from gapline.e2ee import DecryptedEvent, RequestKind, TrustLevel, UnableToDecrypt, UtdReason

from .harness import Clock, Room, online
from .keyserver import KeyServer


def test_first_upload_publishes_signed_device_keys_one_time_keys_and_a_fallback_key() -> None:
    server, clock = KeyServer(), Clock()
    (alice,) = online(server, clock, ("@alice:x", "A1"))
    uploaded = server.device_keys["@alice:x"]["A1"]
    assert uploaded["keys"] == {
        "curve25519:A1": alice.machine.identity_keys["curve25519"],
        "ed25519:A1": alice.machine.identity_keys["ed25519"],
    }
    assert len(server.one_time_keys[("@alice:x", "A1")]) == alice.machine.account.target_keys
    assert ("@alice:x", "A1") in server.fallback_keys
    assert alice.machine.outgoing_requests() == []  # nothing left to publish


def test_one_time_keys_are_topped_up_from_the_synced_count() -> None:
    server, clock = KeyServer(), Clock()
    (alice,) = online(server, clock, ("@alice:x", "A1"))
    stock = server.one_time_keys[("@alice:x", "A1")]
    for key_id in sorted(stock)[:20]:
        del stock[key_id]  # claimed by others
    alice.sync()
    assert len(stock) == alice.machine.account.target_keys
    server.fallback_keys[("@alice:x", "A1")] = (*server.fallback_keys[("@alice:x", "A1")][:2], True)
    old = server.fallback_keys[("@alice:x", "A1")][0]
    alice.sync()
    assert server.fallback_keys[("@alice:x", "A1")][0] != old  # a used fallback key is replaced


def test_bob_reads_alices_message_and_alice_reads_her_own() -> None:
    server, clock = KeyServer(), Clock()
    alice, bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))
    room = Room("!r:x")
    alice.join(room)
    bob.join(room)
    event = alice.send(room, "hello bob")
    assert event.content["algorithm"] == "m.megolm.v1.aes-sha2"
    assert "hello" not in str(event.content)
    updates = bob.sync()
    assert [k.session_id for k in updates.room_keys] == [event.content["session_id"]]
    result = bob.read(room, event)
    assert isinstance(result, DecryptedEvent)
    assert (result.sender, result.type, result.content["body"]) == (
        "@alice:x",
        "m.room.message",
        "hello bob",
    )
    assert result.sender_device == "A1" and not result.forwarded
    assert result.trust is TrustLevel.UNSIGNED
    assert alice.body(room, event) == "hello bob"
    reply = bob.send(room, "hi alice")
    alice.sync()
    assert alice.body(room, reply) == "hi alice"


def test_three_devices_one_share_reaches_both_others_in_one_request() -> None:
    server, clock = KeyServer(), Clock()
    alice, bob, carol = online(
        server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"), ("@carol:x", "C1")
    )
    room = Room("!r:x")
    for p in (alice, bob, carol):
        p.join(room)
    before = len(server.requests)
    report = alice.share(room)
    assert sorted(report.shared_with) == [("@bob:x", "B1"), ("@carol:x", "C1")]
    kinds = [
        r.path.removeprefix("/_matrix/client/v3/").split("/")[:2]
        for _, r in server.requests[before:]
    ]
    assert kinds == [["keys", "query"], ["keys", "claim"], ["sendToDevice", "m.room.encrypted"]]
    event = alice.send(room, "to both")
    bob.sync()
    carol.sync()
    assert bob.body(room, event) == carol.body(room, event) == "to both"


def test_a_key_that_arrives_late_heals_the_retained_events_of_its_session() -> None:
    server, clock = KeyServer(), Clock()
    alice, bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))
    room = Room("!r:x")
    alice.join(room)
    bob.join(room)
    server.hold_to_device = True
    events = [alice.send(room, f"m{i}") for i in range(3)]
    bob.sync()
    utds = [bob.read(room, e) for e in events]
    assert all(
        isinstance(u, UnableToDecrypt) and u.reason is UtdReason.MISSING_ROOM_KEY for u in utds
    )
    assert isinstance(utds[0], UnableToDecrypt)
    assert utds[0].to_wire() == {
        "UnableToDecrypt": {
            "session_id": events[0].content["session_id"],
            "reason": "MissingRoomKey",
        }
    }
    server.hold_to_device = False
    server.release_to_device()
    updates = bob.sync()
    assert {(k.room_id, k.session_id) for k in updates.room_keys} == {
        (room.room_id, events[0].content["session_id"])
    }
    assert [bob.body(room, e) for e in events] == ["m0", "m1", "m2"]


def test_a_device_that_joins_later_gets_the_current_session_from_its_index() -> None:
    server, clock = KeyServer(), Clock()
    alice, bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))
    room = Room("!r:x")
    alice.join(room)
    bob.join(room)
    first = alice.send(room, "before")
    (bob2,) = online(server, clock, ("@bob:x", "B2"))
    bob2.join(room)
    alice.sync()  # sees bob's device list change
    report = alice.share(room)
    assert not report.rotated and report.shared_with == (("@bob:x", "B2"),)
    second = alice.send(room, "after")
    assert second.content["session_id"] == first.content["session_id"]
    bob2.sync()
    assert bob2.body(room, second) == "after"
    early = bob2.read(room, first)
    assert isinstance(early, UnableToDecrypt) and early.reason is UtdReason.UNKNOWN_MESSAGE_INDEX


def test_two_devices_of_one_user_share_with_each_other() -> None:
    server, clock = KeyServer(), Clock()
    a1, a2, bob = online(server, clock, ("@alice:x", "A1"), ("@alice:x", "A2"), ("@bob:x", "B1"))
    room = Room("!r:x")
    for p in (a1, a2, bob):
        p.join(room)
    event = a1.send(room, "from my laptop")
    a2.sync()
    result = a2.read(room, event)
    assert isinstance(result, DecryptedEvent) and result.content["body"] == "from my laptop"
    reply = a2.send(room, "from my phone")
    a1.sync()
    assert a1.body(room, reply) == "from my phone"
    assert {d.device_id for d in a1.machine.devices_of("@alice:x")} == {"A1", "A2"}
    own = a1.machine.device("@alice:x", "A1")
    assert own is not None and own.trust is TrustLevel.OWN


def test_outgoing_requests_wait_for_unsaved_changes() -> None:
    from gapline.e2ee import UnsavedChanges

    server, clock = KeyServer(), Clock()
    (alice,) = online(server, clock, ("@alice:x", "A1"))
    room = Room("!r:x")
    alice.join(room)
    alice.machine.share_room_key(room.room_id, ["@alice:x"])
    try:
        alice.machine.outgoing_requests()
    except UnsavedChanges:
        pass
    else:
        raise AssertionError("requests were handed out before the new session was saved")
    alice.commit()
    kinds = {r.kind for r in alice.machine.outgoing_requests()}
    assert kinds <= {RequestKind.KEYS_QUERY, RequestKind.TO_DEVICE, RequestKind.KEYS_CLAIM}
