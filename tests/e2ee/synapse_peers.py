"""The two sides of the integration tests: a gapline device and a matrix-nio device.

`GaplineDevice` is the smallest client a caller of `gapline.e2ee` would write:
a `MatrixClient`, a SQLite store, a `CryptoDriver`, and a ``sync`` step that
feeds room state and sync's encryption fields to the machine, decrypts the
timeline, keeps what it cannot decrypt, retries it when its session's key
arrives, and commits the machine's changes together with the sync token.

`NioDevice` is matrix-nio's ``AsyncClient`` with its own (vodozemac) crypto:
an implementation that is not gapline's, on the other end of every exchange.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nio
import vodozemac

from gapline.e2ee import (
    CryptoDriver,
    DecryptedEvent,
    KeyUpdates,
    RoomKey,
    UnableToDecrypt,
    VerificationEvent,
    VerificationStatus,
    send_verification,
)
from gapline.matrix import ClientEvent, MatrixClient, Session, SyncResponse
from gapline.storage import Backend, Migration, Tx, open_backend

ENCRYPTION = {
    "type": "m.room.encryption",
    "state_key": "",
    "content": {"algorithm": "m.megolm.v1.aes-sha2"},
}
_TOKEN = [
    Migration(
        1,
        "sync token",
        "CREATE TABLE test_sync_token (id INTEGER PRIMARY KEY, token TEXT NOT NULL)",
    )
]
_ROUNDS = 40  # bounded waits: each round is one long-poll sync


def _make_directory(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class GaplineDevice:
    session: Session
    directory: Path
    store_key: bytes = field(default_factory=lambda: os.urandom(32))
    client: MatrixClient | None = None
    backend: Backend | None = None
    driver: CryptoDriver | None = None
    since: str | None = None
    members: dict[str, set[str]] = field(default_factory=dict)
    bodies: dict[str, str] = field(default_factory=dict)  # event ID -> decrypted body
    decrypted: dict[str, DecryptedEvent] = field(default_factory=dict)
    retained: dict[str, tuple[str, ClientEvent, UnableToDecrypt]] = field(default_factory=dict)
    healed: list[str] = field(default_factory=list)
    verifications: list[VerificationStatus] = field(default_factory=list)  # each step's status

    async def start(self, homeserver: str) -> GaplineDevice:
        self.client = MatrixClient(homeserver, session=self.session, trust_env=False)
        self.backend = await open_backend(str(self.directory / "gapline.db"))
        await self.backend.migrate("test_driver", _TOKEN)
        row = await self.backend.read(
            lambda tx: tx.one("SELECT token FROM test_sync_token WHERE id = 1")
        )
        self.since = None if row is None else row[0]
        self.driver = await CryptoDriver.open(self.backend, self.client, self.store_key)
        await self.driver.send_outgoing()  # publish the device keys
        return self

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.aclose()
        if self.backend is not None:
            await self.backend.close()

    async def restart(self, homeserver: str) -> None:
        """Close everything and open again from the store, as a restarted process would."""
        await self.stop()
        await self.start(homeserver)

    @property
    def machine(self) -> Any:
        assert self.driver is not None
        return self.driver.machine

    async def sync(self, timeout_ms: int = 0) -> KeyUpdates:
        assert self.client is not None and self.driver is not None
        answer: SyncResponse = await self.client.sync(since=self.since, timeout_ms=timeout_ms)
        machine = self.driver.machine
        encrypted: dict[str, list[ClientEvent]] = {}
        for room_id, room in answer.rooms.join.items():
            members = self.members.setdefault(room_id, set())
            for event in [*room.state.events, *room.timeline.events]:
                if event.type == "m.room.encryption" and event.state_key == "":
                    machine.set_room_encryption(room_id, event.content)
                elif event.type == "m.room.member" and event.state_key is not None:
                    if event.content.get("membership") in ("join", "invite"):
                        members.add(event.state_key)
                    else:
                        members.discard(event.state_key)
                        machine.room_member_left(room_id, event.state_key)
            machine.update_tracked_users(members)
            encrypted[room_id] = [e for e in room.timeline.events if e.type == "m.room.encrypted"]
        updates = machine.receive_sync(
            answer, initial=self.since is None
        )  # to-device first: keys for this sync's events
        room_events: list[VerificationEvent] = []
        for room_id, events in encrypted.items():
            for event, result in zip(
                events, machine.decrypt_room_events(room_id, events), strict=True
            ):
                self._keep(room_id, event, result)
                if isinstance(result, DecryptedEvent):
                    room_events.append(VerificationEvent.from_room(room_id, event, result))
        for room_id, room in answer.rooms.join.items():
            plain = [e for e in room.timeline.events if e.type != "m.room.encrypted"]
            room_events.extend(VerificationEvent.from_room(room_id, e) for e in plain)
        self._heal(updates)
        to_device = [*answer.to_device.events, *updates.to_device]
        for event in [*map(VerificationEvent.from_to_device, to_device), *room_events]:
            if event.is_verification:
                status = machine.verification.receive(event)
                if status is not None:
                    self.verifications.append(status)
        token = answer.next_batch

        def save_token(tx: Tx) -> None:
            tx.execute(
                "INSERT INTO test_sync_token (id, token) VALUES (1, ?) "
                "ON CONFLICT (id) DO UPDATE SET token = excluded.token",
                (token,),
            )

        await self.driver.commit(also=save_token)  # the machine's changes and the token, at once
        self.since = token
        sent = await self.driver.send_outgoing()
        self._heal(sent.updates)
        await self.driver.commit()
        await send_verification(self.driver)
        return updates

    def _keep(
        self, room_id: str, event: ClientEvent, result: DecryptedEvent | UnableToDecrypt
    ) -> None:
        if isinstance(result, DecryptedEvent):
            self.decrypted[event.event_id] = result
            self.bodies[event.event_id] = str(result.content.get("body"))
            if self.retained.pop(event.event_id, None) is not None:
                self.healed.append(event.event_id)
        else:
            self.retained[event.event_id] = (room_id, event, result)

    def _heal(self, updates: KeyUpdates) -> None:
        sessions = {(k.room_id, k.session_id) for k in updates.room_keys}
        for room_id, event, utd in list(self.retained.values()):
            if (room_id, utd.session_id) in sessions:
                self._keep(room_id, event, self.machine.decrypt_room_event(room_id, event))

    async def wait_until(self, done: Callable[[], bool]) -> None:
        for _ in range(_ROUNDS):
            if done():
                return
            await self.sync(timeout_ms=1000)
        raise AssertionError(
            f"{self.session.user_id} {self.session.device_id}: condition never met"
        )

    async def send_text(self, room_id: str, body: str) -> str:
        assert self.client is not None and self.driver is not None
        members = list(await self.client.joined_members(room_id))
        await self.driver.share_room_key(room_id, members)
        content = await self.driver.encrypt(
            room_id, "m.room.message", {"msgtype": "m.text", "body": body}
        )
        return await self.client.send_event(
            room_id, "m.room.encrypted", content, txn_id=uuid.uuid4().hex
        )


def add_made_up_sessions(device: GaplineDevice, count: int) -> None:
    """Room keys as a device collects them, made directly (a key backup takes any)."""
    sender = vodozemac.Account()
    for i in range(count):
        outbound = vodozemac.GroupSession()
        added = device.machine.inbound.add(
            RoomKey(
                f"!room{i % 3}:made-up", outbound.session_id, outbound.session_key.to_base64(),
                sender.curve25519_key.to_base64(), sender.ed25519_key.to_base64(), None, None,
            )
        )  # fmt: skip
        assert added is True


@dataclass
class NioDevice:
    client: nio.AsyncClient
    bodies: dict[str, str] = field(default_factory=dict)
    undecryptable: dict[str, nio.MegolmEvent] = field(default_factory=dict)

    @classmethod
    async def login(
        cls, homeserver: str, user_id: str, directory: Path, password: str = "password"
    ) -> NioDevice:
        _make_directory(directory)
        config = nio.AsyncClientConfig(encryption_enabled=True, store_sync_tokens=True)
        client = nio.AsyncClient(homeserver, user_id, store_path=str(directory), config=config)
        answer = await client.login(password, device_name="nio peer")
        assert isinstance(answer, nio.LoginResponse), answer
        device = cls(client)
        await device.step()
        return device

    @property
    def olm(self) -> Any:
        """nio's OlmMachine (its crypto), for the steps a test drives by hand."""
        assert self.client.olm is not None
        return self.client.olm

    @property
    def session(self) -> Session:
        c = self.client
        return Session(c.homeserver, c.user_id, str(c.device_id), str(c.access_token))

    async def step(self, timeout_ms: int = 0) -> None:
        """One sync plus the key maintenance nio's own sync loop would do."""
        answer = await self.client.sync(timeout=timeout_ms)
        assert isinstance(answer, nio.SyncResponse), answer
        for room in answer.rooms.join.values():
            for event in room.timeline.events:
                if isinstance(event, nio.RoomMessageText):
                    self.bodies[event.event_id] = event.body
                    self.undecryptable.pop(event.event_id, None)
                elif isinstance(event, nio.MegolmEvent):
                    self.undecryptable[event.event_id] = event
        await self.keys()

    async def keys(self) -> None:
        c = self.client
        if c.should_upload_keys:
            await c.keys_upload()
        if c.should_query_keys:
            await c.keys_query()
        if c.should_claim_keys:
            await c.keys_claim(c.get_users_for_key_claiming())
        await c.send_to_device_messages()

    async def retry_undecryptable(self) -> None:
        for event_id, event in list(self.undecryptable.items()):
            try:
                decrypted = self.client.decrypt_event(event)
            except nio.EncryptionError:
                continue  # still no key (nio raises where gapline returns a value)
            if isinstance(decrypted, nio.RoomMessageText):
                self.bodies[event_id] = decrypted.body
                del self.undecryptable[event_id]

    async def wait_until(self, done: Callable[[], bool]) -> None:
        for _ in range(_ROUNDS):
            if done():
                return
            await self.step(timeout_ms=1000)
            await self.retry_undecryptable()
        raise AssertionError(f"nio {self.client.user_id}: condition never met")

    async def send_text(self, room_id: str, body: str) -> str:
        await self.step()
        answer = await self.client.room_send(
            room_id,
            "m.room.message",
            {"msgtype": "m.text", "body": body},
            ignore_unverified_devices=True,
        )
        assert isinstance(answer, nio.RoomSendResponse), answer
        return answer.event_id

    async def hold_back_room_key(self, room_id: str) -> tuple[str, dict[str, Any]]:
        """Share a new session for ``room_id`` as nio would, but keep its to-device messages:
        nio believes it shared, so its next messages use the session nobody else has.
        Returns the session ID and the held ``sendToDevice`` messages."""
        c, olm = self.client, self.olm
        await c.joined_members(room_id)
        missing = c.get_missing_sessions(room_id)
        if missing:
            await c.keys_claim(missing)
        sharing_with, to_device = olm.share_group_session(
            room_id, list(c.rooms[room_id].users), ignore_unverified_devices=True
        )
        outbound = olm.outbound_group_sessions[room_id]
        outbound.users_shared_with.update(sharing_with)
        outbound.shared = True
        return outbound.id, to_device["messages"]

    async def close(self) -> None:
        await self.client.close()
