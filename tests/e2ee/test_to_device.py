"""Olm to-device rules: replays, bad ciphertext, unknown or lying senders, forwarded keys, withheld."""

from __future__ import annotations

import copy

import vodozemac

from gapline.e2ee import RefusalCode, UnableToDecrypt, UtdReason
from gapline.e2ee._canonical import b64decode, b64encode

from .harness import (
    Clock,
    Peer,
    Room,
    connected,
    deliver,
    export_session,
    olm_event,
    olm_payload,
    online,
)
from .keyserver import KeyServer


def _keyed_pair() -> tuple[KeyServer, Clock, Peer, Peer]:
    server, clock = KeyServer(), Clock()
    alice, bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))
    return server, clock, alice, bob


def test_a_replayed_pre_key_message_is_refused_and_nothing_is_lost() -> None:
    server, _clock, alice, bob = _keyed_pair()
    room = Room("!r:x")
    alice.join(room)
    bob.join(room)
    event = alice.send(room, "once")  # the first message from alice to bob: a pre-key message
    (key_event,) = [e for e in server.inbox[bob.me]]
    assert next(iter(key_event["content"]["ciphertext"].values()))["type"] == 0
    replay = copy.deepcopy(key_event)
    assert bob.sync().room_keys
    server.inbox[bob.me].append(replay)
    updates = bob.sync()
    assert [r.code for r in updates.refusals] in (
        [RefusalCode.OLM_REPLAY],
        [RefusalCode.OLM_UNDECRYPTABLE],
    )
    assert updates.room_keys == ()
    assert bob.body(room, event) == "once"
    later = alice.send(room, "still in step")
    assert bob.body(room, later) == "still in step"


def test_a_replayed_normal_message_is_refused() -> None:
    server, _clock, alice, bob = _keyed_pair()
    connected([alice, bob])
    content = olm_event(alice, bob, olm_payload(alice, bob, "m.example", {"n": 1}))
    assert next(iter(content["ciphertext"].values()))["type"] in (0, 1)
    deliver(server, bob, "@alice:x", "m.room.encrypted", content)
    deliver(server, bob, "@alice:x", "m.room.encrypted", copy.deepcopy(content))
    updates = bob.sync()
    assert [e.content for e in updates.to_device] == [{"n": 1}]
    assert len(updates.refusals) == 1
    assert updates.refusals[0].code in (RefusalCode.OLM_UNDECRYPTABLE, RefusalCode.OLM_REPLAY)


def test_malformed_base64_and_a_wrong_mac_are_refused_and_the_session_survives() -> None:
    server, _clock, alice, bob = _keyed_pair()
    connected([alice, bob])
    curve = bob.machine.identity_keys["curve25519"]
    bad = olm_event(alice, bob, olm_payload(alice, bob, "m.example", {"n": 0}))
    bad["ciphertext"][curve]["body"] = "!!not base64!!"
    deliver(server, bob, "@alice:x", "m.room.encrypted", bad)
    tampered = olm_event(alice, bob, olm_payload(alice, bob, "m.example", {"n": 1}))
    raw = bytearray(b64decode(tampered["ciphertext"][curve]["body"]))
    raw[-1] ^= 0x01  # the MAC's last byte
    tampered["ciphertext"][curve]["body"] = b64encode(bytes(raw))
    deliver(server, bob, "@alice:x", "m.room.encrypted", tampered)
    deliver(
        server,
        bob,
        "@alice:x",
        "m.room.encrypted",
        olm_event(alice, bob, olm_payload(alice, bob, "m.example", {"n": 2})),
    )
    updates = bob.sync()
    assert updates.refusals[0].code is RefusalCode.MALFORMED
    assert len(updates.refusals) == 2
    assert [e.content for e in updates.to_device] == [{"n": 2}]


def test_a_payload_that_lies_about_its_sender_or_recipient_is_refused() -> None:
    server, _clock, alice, bob = _keyed_pair()
    connected([alice, bob])
    lies = [
        olm_payload(alice, bob, "m.example", {}, sender="@carol:x"),
        olm_payload(alice, bob, "m.example", {}, recipient="@carol:x"),
        olm_payload(alice, bob, "m.example", {}, recipient_keys={"ed25519": "AAAA"}),
        olm_payload(
            alice,
            bob,
            "m.example",
            {},
            keys={"ed25519": vodozemac.Account().ed25519_key.to_base64()},
        ),
    ]
    for payload in lies:
        deliver(server, bob, "@alice:x", "m.room.encrypted", olm_event(alice, bob, payload))
    updates = bob.sync()
    assert [r.code for r in updates.refusals] == [
        RefusalCode.SENDER_MISMATCH,
        RefusalCode.WRONG_RECIPIENT,
        RefusalCode.WRONG_RECIPIENT,
        RefusalCode.SENDER_MISMATCH,
    ]
    assert updates.to_device == ()


def test_a_room_key_from_a_device_not_yet_known_waits_for_its_keys() -> None:
    server, clock = KeyServer(), Clock()
    (bob,) = online(server, clock, ("@bob:x", "B1"))
    (alice,) = online(server, clock, ("@alice:x", "A1"))
    room = Room("!r:x")
    alice.join(room)
    room.members.add("@bob:x")
    alice.machine.update_tracked_users(room.members)
    event = alice.send(room, "early")
    assert bob.machine.device("@alice:x", "A1") is None
    updates = bob.sync()  # the key's device is unknown: kept, sender queried, then accepted
    assert [k.session_id for k in updates.room_keys] == [event.content["session_id"]]
    assert bob.body(room, event) == "early"
    # It was saved while it waited (sealed) and deleted once handled.
    assert any(c.pending_added for c in bob.saved) and any(c.pending_removed for c in bob.saved)
    sealed = next(c.pending_added[0].sealed for c in bob.saved if c.pending_added)
    assert b"session_key" not in sealed and event.content["session_id"].encode() not in sealed
    assert not bob.machine.receiver.pending_senders()


def test_a_to_device_from_a_device_that_stays_unknown_is_refused_after_the_query() -> None:
    server, clock = KeyServer(), Clock()
    alice, bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))
    connected([alice, bob])
    ghost = Peer(server, "@alice:x", "GHOST", clock)  # never uploads its device keys
    bob_otk = next(iter(server.one_time_keys[bob.me].values()))["key"]
    ghost.machine.olm.add_outbound(bob.machine.identity_keys["curve25519"], bob_otk, clock())
    deliver(
        server,
        bob,
        "@alice:x",
        "m.room.encrypted",
        olm_event(ghost, bob, olm_payload(ghost, bob, "m.example", {})),
    )
    updates = bob.sync()
    assert [r.code for r in updates.refusals] == [RefusalCode.UNKNOWN_DEVICE]
    assert not bob.machine.receiver.pending_senders()


def test_a_forwarded_room_key_is_accepted_from_our_own_device_and_marked() -> None:
    server, clock = KeyServer(), Clock()
    a1, a2, bob = online(server, clock, ("@alice:x", "A1"), ("@alice:x", "A2"), ("@bob:x", "B1"))
    room = connected([a1, a2, bob])
    server.hold_to_device = True
    event = bob.send(room, "forward me")
    server.hold_to_device = False
    server.held = [(t, e) for t, e in server.held if t != a2.me]
    server.release_to_device()
    a1.sync()
    sid = event.content["session_id"]
    exported = export_session(a1.machine.inbound._sessions[(room.room_id, sid)].session)
    forward = {
        "algorithm": "m.megolm.v1.aes-sha2",
        "room_id": room.room_id,
        "session_id": sid,
        "session_key": exported,
        "sender_key": bob.machine.identity_keys["curve25519"],
        "sender_claimed_ed25519_key": bob.machine.identity_keys["ed25519"],
        "forwarding_curve25519_key_chain": [],
    }
    deliver(
        server,
        a2,
        "@alice:x",
        "m.room.encrypted",
        olm_event(a1, a2, olm_payload(a1, a2, "m.forwarded_room_key", forward)),
    )
    assert [k.session_id for k in a2.sync().room_keys] == [sid]
    result = a2.read(room, event)
    assert not isinstance(result, UnableToDecrypt)
    assert result.forwarded and result.content["body"] == "forward me" and result.sender == "@bob:x"
    entry = a2.machine.inbound._sessions[(room.room_id, sid)]
    assert entry.key.forwarding_chain == (a1.machine.identity_keys["curve25519"],)
    # The same forward from another user is refused.
    deliver(
        server,
        a1,
        "@bob:x",
        "m.room.encrypted",
        olm_event(
            bob, a1, olm_payload(bob, a1, "m.forwarded_room_key", {**forward, "session_id": "x"})
        ),
    )
    assert [r.code for r in a1.sync().refusals] == [RefusalCode.FORWARD_NOT_TRUSTED]


def test_a_withheld_notice_makes_the_utd_say_withheld_until_the_key_comes() -> None:
    server, _clock, alice, bob = _keyed_pair()
    room = connected([alice, bob])
    server.hold_to_device = True
    event = alice.send(room, "held back")
    sid = event.content["session_id"]
    deliver(
        server,
        bob,
        "@alice:x",
        "m.room_key.withheld",
        {
            "algorithm": "m.megolm.v1.aes-sha2",
            "room_id": room.room_id,
            "session_id": sid,
            "sender_key": alice.machine.identity_keys["curve25519"],
            "code": "m.unverified",
            "reason": "not verified",
        },
    )
    assert bob.sync().withheld
    utd = bob.read(room, event)
    assert isinstance(utd, UnableToDecrypt)
    assert (utd.reason, utd.withheld_code) == (UtdReason.WITHHELD, "m.unverified")
    server.hold_to_device = False
    server.release_to_device()
    bob.sync()
    assert bob.body(room, event) == "held back"


def test_room_keys_in_the_clear_or_for_another_session_are_refused() -> None:
    server, _clock, alice, bob = _keyed_pair()
    connected([alice, bob])
    deliver(
        server,
        bob,
        "@alice:x",
        "m.room_key",
        {"room_id": "!r:x", "session_id": "s", "session_key": "k"},
    )
    other = vodozemac.GroupSession()
    key = {
        "algorithm": "m.megolm.v1.aes-sha2",
        "room_id": "!r:x",
        "session_id": "not-" + other.session_id,
        "session_key": other.session_key.to_base64(),
    }
    deliver(
        server,
        bob,
        "@alice:x",
        "m.room.encrypted",
        olm_event(alice, bob, olm_payload(alice, bob, "m.room_key", key)),
    )
    updates = bob.sync()
    assert [r.code for r in updates.refusals] == [
        RefusalCode.MALFORMED,
        RefusalCode.SESSION_MISMATCH,
    ]
    assert updates.room_keys == ()
