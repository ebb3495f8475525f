"""Machines talking through the in-memory `KeyServer`: peers, rooms, a shared clock.

``Peer`` wraps one `CryptoMachine` the way a client engine would: after every
step it takes the changes (kept in ``peer.saved``), then sends the outgoing
requests to the key server and reports the answers. ``Room`` hands out event
IDs and keeps the timeline as `ClientEvent` values.
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from typing import Any

import vodozemac

from gapline.e2ee import (
    Changes,
    CryptoMachine,
    DecryptedEvent,
    KeyUpdates,
    ShareReport,
    ShareState,
    UnableToDecrypt,
    merge_updates,
)
from gapline.matrix import ClientEvent

from .keyserver import KeyServer


class Clock:
    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.now = start_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@dataclass
class Room:
    room_id: str
    members: set[str] = field(default_factory=set)
    events: list[ClientEvent] = field(default_factory=list)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def add(self, sender: str, event_type: str, content: dict[str, Any]) -> ClientEvent:
        event = ClientEvent(
            event_id=f"$ev{next(self._ids)}",
            type=event_type,
            sender=sender,
            origin_server_ts=1,
            content=content,
        )
        self.events.append(event)
        return event


class Peer:
    def __init__(
        self,
        server: KeyServer,
        user_id: str,
        device_id: str,
        clock: Clock,
        store_key: bytes | None = None,
    ) -> None:
        self.server = server
        self.clock = clock
        self.store_key = store_key or os.urandom(32)
        self.machine = CryptoMachine.create(self.store_key, user_id, device_id, clock=clock)
        self.saved: list[Changes] = []
        server.register(user_id, device_id)

    @property
    def me(self) -> tuple[str, str]:
        return (self.machine.user_id, self.machine.device_id)

    def commit(self) -> Changes:
        changes = self.machine.take_changes()
        self.saved.append(changes)
        return changes

    def pump(self, rounds: int = 8) -> KeyUpdates:
        """Send every outgoing request to the server and report the answers."""
        self.commit()
        updates = []
        for _ in range(rounds):
            requests = self.machine.outgoing_requests()
            if not requests:
                break
            for req in requests:
                answer = self.server.handle(self.me, req.request, req.response_type)
                updates.append(self.machine.mark_request_as_sent(req.request_id, answer))
                self.commit()
        return merge_updates(*updates)

    def sync(self) -> KeyUpdates:
        updates = self.machine.receive_sync(self.server.sync(*self.me))
        self.commit()
        return merge_updates(updates, self.pump())

    def join(self, room: Room, content: dict[str, Any] | None = None) -> None:
        room.members.add(self.machine.user_id)
        self.machine.set_room_encryption(
            room.room_id, content or {"algorithm": "m.megolm.v1.aes-sha2"}
        )
        self.machine.update_tracked_users(room.members)
        self.commit()

    def share(self, room: Room) -> ShareReport:
        for _ in range(6):
            report = self.machine.share_room_key(room.room_id, sorted(room.members))
            self.pump()
            if report.state is ShareState.READY:
                return report
        raise AssertionError("sharing did not settle")

    def send(self, room: Room, body: str) -> ClientEvent:
        self.share(room)
        content = self.machine.encrypt_room_event(
            room.room_id, "m.room.message", {"msgtype": "m.text", "body": body}
        )
        self.commit()
        return room.add(self.machine.user_id, "m.room.encrypted", content)

    def read(self, room: Room, event: ClientEvent) -> DecryptedEvent | UnableToDecrypt:
        result = self.machine.decrypt_room_event(room.room_id, event)
        self.commit()
        return result

    def body(self, room: Room, event: ClientEvent) -> str:
        result = self.read(room, event)
        assert isinstance(result, DecryptedEvent), result
        return result.content["body"]


def online(server: KeyServer, clock: Clock, *ids: tuple[str, str]) -> list[Peer]:
    """Peers that uploaded their keys and saw each other's device lists."""
    peers = [Peer(server, u, d, clock) for u, d in ids]
    for peer in peers:
        peer.pump()
    for peer in peers:
        peer.sync()  # each sees the others' device list changes
    return peers


def olm_payload(
    from_peer: Peer, to_peer: Peer, event_type: str, content: dict[str, Any], **overrides: Any
) -> dict[str, Any]:
    """The plaintext of an Olm to-device event, as `from_peer` would build it."""
    s, r = from_peer.machine, to_peer.machine
    payload = {
        "type": event_type,
        "content": content,
        "sender": s.user_id,
        "sender_device": s.device_id,
        "keys": {"ed25519": s.identity_keys["ed25519"]},
        "recipient": r.user_id,
        "recipient_keys": {"ed25519": r.identity_keys["ed25519"]},
    }
    payload.update(overrides)
    return payload


def olm_event(sender: Peer, recipient: Peer, payload: dict[str, Any]) -> dict[str, Any]:
    """An ``m.room.encrypted`` to-device content carrying ``payload`` over the sender's
    existing Olm session with the recipient (create one first, e.g. with a share)."""
    curve = recipient.machine.identity_keys["curve25519"]
    ciphertext = sender.machine.olm.encrypt(curve, json.dumps(payload).encode(), sender.clock())
    sender.commit()
    return {
        "algorithm": "m.olm.v1.curve25519-aes-sha2",
        "sender_key": sender.machine.identity_keys["curve25519"],
        "ciphertext": {curve: ciphertext},
    }


def deliver(
    server: KeyServer, recipient: Peer, sender_user: str, event_type: str, content: dict[str, Any]
) -> None:
    server.inbox.setdefault(recipient.me, []).append(
        {"sender": sender_user, "type": event_type, "content": content}
    )


def connected(peers: list[Peer], room_id: str = "!r:x") -> Room:
    """Olm sessions exist between all peers (each shared once in a setup room), and a
    fresh encrypted room ``room_id`` that all of them joined, with no session yet."""
    setup = Room("!setup:x")
    for p in peers:
        p.join(setup)
    for p in peers:
        p.share(setup)
    for p in peers:
        p.sync()
    room = Room(room_id)
    for p in peers:
        p.join(room)
    return room


def export_session(session: vodozemac.InboundGroupSession) -> str:
    """A session's key from its first known index, as a forwarded or exported key."""
    exported = session.export_at(session.first_known_index)
    assert exported is not None
    return exported.to_base64()
