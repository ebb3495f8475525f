"""Megolm room-event rules: replay, claimed sender, malformed ciphertext, wrong room, relations."""

from __future__ import annotations

from typing import Any

import msgspec

from gapline.e2ee import DecryptedEvent, RefusalCode, UnableToDecrypt, UtdReason
from gapline.e2ee._canonical import b64decode, b64encode
from gapline.matrix import ClientEvent

from .harness import Clock, Peer, Room, connected, online
from .keyserver import KeyServer


def _room() -> tuple[KeyServer, Room, Peer, Peer]:
    server, clock = KeyServer(), Clock()
    alice, bob = online(server, clock, ("@alice:x", "A1"), ("@bob:x", "B1"))
    room = connected([alice, bob])
    return server, room, alice, bob


def _copy(event: ClientEvent, **changes: Any) -> ClientEvent:
    return msgspec.structs.replace(event, **changes)


def test_the_same_index_under_another_event_id_is_a_replay_and_is_refused() -> None:
    _server, room, alice, bob = _room()
    event = alice.send(room, "original")
    bob.sync()
    assert bob.body(room, event) == "original"
    assert bob.body(room, event) == "original"  # the same event again (a refetch) is fine
    replay = bob.read(room, _copy(event, event_id="$replayed"))
    assert isinstance(replay, UnableToDecrypt)
    assert (replay.reason, replay.refusal) == (UtdReason.MALFORMED, RefusalCode.MEGOLM_REPLAY)


def test_a_replay_is_refused_even_when_the_replay_comes_first_in_a_batch() -> None:
    _server, room, alice, bob = _room()
    event = alice.send(room, "x")
    bob.sync()
    first, second = bob.machine.decrypt_room_events(
        room.room_id, [event, _copy(event, event_id="$other")]
    )
    assert isinstance(first, DecryptedEvent)
    assert isinstance(second, UnableToDecrypt) and second.refusal is RefusalCode.MEGOLM_REPLAY
    assert [s.message_index for s in bob.commit().seen] == [0]


def test_an_event_whose_sender_is_not_the_sessions_owner_is_untrusted() -> None:
    _server, room, alice, bob = _room()
    event = alice.send(room, "I am alice")
    bob.sync()
    forged = bob.read(room, _copy(event, sender="@mallory:x"))
    assert isinstance(forged, UnableToDecrypt)
    assert (forged.reason, forged.refusal) == (UtdReason.UNTRUSTED, RefusalCode.SENDER_MISMATCH)
    assert (
        bob.body(room, event) == "I am alice"
    )  # the refusal recorded no index: the real one reads


def test_malformed_ciphertext_and_a_tampered_signature_are_malformed() -> None:
    _server, room, alice, bob = _room()
    event = alice.send(room, "intact")
    bob.sync()
    garbage = bob.read(
        room, _copy(event, event_id="$g", content={**event.content, "ciphertext": "%%%"})
    )
    raw = bytearray(b64decode(event.content["ciphertext"]))
    raw[-1] ^= 1
    tampered = bob.read(
        room,
        _copy(event, event_id="$t", content={**event.content, "ciphertext": b64encode(bytes(raw))}),
    )
    no_session = bob.read(
        room,
        _copy(
            event,
            event_id="$n",
            content={k: v for k, v in event.content.items() if k != "session_id"},
        ),
    )
    for utd in (garbage, tampered, no_session):
        assert isinstance(utd, UnableToDecrypt) and utd.reason is UtdReason.MALFORMED, utd
    assert bob.body(room, event) == "intact"


def test_an_event_moved_to_another_room_does_not_decrypt_there() -> None:
    _server, room, alice, bob = _room()
    event = alice.send(room, "for this room")
    bob.sync()
    moved = bob.machine.decrypt_room_event("!elsewhere:x", event)
    assert isinstance(moved, UnableToDecrypt) and moved.reason is UtdReason.MISSING_ROOM_KEY


def test_relations_stay_in_the_clear_and_come_back_into_the_content() -> None:
    _server, room, alice, bob = _room()
    alice.share(room)
    relates = {"rel_type": "m.thread", "event_id": "$root"}
    content = alice.machine.encrypt_room_event(
        room.room_id,
        "m.room.message",
        {"msgtype": "m.text", "body": "in thread", "m.relates_to": relates},
    )
    alice.commit()
    assert content["m.relates_to"] == relates
    event = room.add("@alice:x", "m.room.encrypted", content)
    bob.sync()
    result = bob.read(room, event)
    assert isinstance(result, DecryptedEvent) and result.content["m.relates_to"] == relates
