"""An engine with encryption in front of the in-memory key server, and a peer to talk to.

The engine's client sends its key requests to ``tests.e2ee.keyserver.KeyServer``
(the same endpoints a homeserver serves); the room's timeline is written by
the test as sync answers, and the peer is a bare `CryptoMachine` (``Peer``)
that shares its room key over Olm through the same server.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import msgspec
import pytest

from gapline.history import Engine, Event
from gapline.matrix import (
    ClientEvent,
    JoinedRoom,
    MatrixClient,
    Rooms,
    Session,
    StateBlock,
    Timeline,
)
from gapline.matrix.testing import FakeHomeserver
from gapline.storage import KdfParams
from tests.e2ee.harness import Clock, Peer
from tests.e2ee.keyserver import KeyServer
from tests.e2ee.synapse_peers import ENCRYPTION, NioDevice

ALICE = ("@alice:x", "A1")
ROOM = "!enc:x"
MEGOLM = {"algorithm": "m.megolm.v1.aes-sha2"}


class Sink:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def publish(self, event: Event) -> None:
        self.events.append(event)


@dataclass
class Scene:
    server: KeyServer
    clock: Clock
    engine: Engine
    sink: Sink
    bob: Peer
    hs: Homeserver
    ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def state(
        self, event_type: str, state_key: str, content: dict[str, Any], sender: str = "@bob:x"
    ) -> ClientEvent:
        return ClientEvent(
            event_id=f"$s{next(self.ids)}",
            type=event_type,
            sender=sender,
            origin_server_ts=1_000 + next(self.ids),
            content=content,
            state_key=state_key,
        )

    def encrypted(self, body: str, **extra: Any) -> ClientEvent:
        """A message bob encrypts (sharing his session first when it is new)."""
        machine = self.bob.machine
        for _ in range(6):
            report = machine.share_room_key(ROOM, ["@alice:x", "@bob:x"])
            self.bob.pump()
            if report.state.name == "READY":
                break
        content = machine.encrypt_room_event(
            ROOM, "m.room.message", {"msgtype": "m.text", "body": body, **extra}
        )
        self.bob.commit()
        return self._from_bob("$e", "m.room.encrypted", content)

    def plain(self, body: str, **extra: Any) -> ClientEvent:
        """A message bob sends in plaintext (in the same order as his encrypted ones)."""
        return self._from_bob("$p", "m.room.message", {"msgtype": "m.text", "body": body, **extra})

    def _from_bob(self, prefix: str, event_type: str, content: dict[str, Any]) -> ClientEvent:
        n = next(self.ids)
        return ClientEvent(
            event_id=f"{prefix}{n}",
            type=event_type,
            sender="@bob:x",
            origin_server_ts=2_000 + n,
            content=content,
        )

    async def sync(
        self,
        *events: ClientEvent,
        state: tuple[ClientEvent, ...] = (),
        prev_batch: str | None = None,
    ) -> None:
        """One sync answer for alice: the key server's to-device part, and these events
        (``prev_batch``: a limited timeline, older events left out)."""
        base = self.server.sync(*ALICE)
        timeline = Timeline(
            events=list(events), limited=prev_batch is not None, prev_batch=prev_batch
        )
        joined = JoinedRoom(timeline=timeline, state=StateBlock(events=list(state)))
        response = msgspec.structs.replace(base, rooms=Rooms(join={ROOM: joined}))
        await self.engine.ingest(response)

    async def join_encrypted_room(self) -> None:
        await self.sync(
            self.state("m.room.create", "", {"creator": "@bob:x"}),
            self.state("m.room.member", "@bob:x", {"membership": "join"}),
            self.state("m.room.encryption", "", MEGOLM),
            self.state("m.room.member", "@alice:x", {"membership": "join"}, sender="@alice:x"),
        )
        self.bob.sync()  # bob sees alice's new device

    def rows(self) -> list[Any]:
        return list(self.engine.timeline(ROOM).state.items)


@dataclass
class Homeserver:
    """The room endpoints alice's client meets besides the key server's."""

    older: list[ClientEvent] = field(default_factory=list)
    """``/messages`` answers these (oldest first) as one last page, newest first."""
    sent: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """Every room event sent (type, content)."""
    state: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Room state the server answers by type (``/state/{type}``)."""
    context: dict[str, ClientEvent] = field(default_factory=dict)
    """Events ``/context/{event_id}`` answers (others: not found)."""


def alice_client(
    server: KeyServer,
    hs: Homeserver,
    device: tuple[str, str] = ALICE,
    backup: FakeHomeserver | None = None,
) -> MatrixClient:
    """Alice's client: the key endpoints from ``server``, the room ones from ``hs``, and
    the key backup (``/room_keys``) from ``backup``'s, when given."""
    server.register(*device)
    token = "t"
    if backup is not None:
        token = backup.register(device[0].split(":")[0][1:], device_id=device[1]).access_token

    def handler(request: httpx.Request) -> Any:
        path = request.url.raw_path.decode()
        bare = unquote(path.split("?")[0])
        if "/room_keys/" in bare and backup is not None:
            return backup.handle(request)
        if bare.endswith("/sync"):
            return httpx.Response(200, json={"next_batch": "s-next"})
        if "/relations/" in bare:
            return httpx.Response(200, json={"chunk": []})
        if "/context/" in bare:
            found = hs.context.get(bare.split("/context/")[1])
            if found is None:
                return httpx.Response(404, json={"errcode": "M_NOT_FOUND", "error": "no"})
            return httpx.Response(200, json={"event": msgspec.to_builtins(found)})
        if "/messages" in bare:
            chunk = [msgspec.to_builtins(e) for e in reversed(hs.older)]
            return httpx.Response(200, json={"chunk": chunk, "start": "t0"})
        if "/send/" in bare:
            event_type = bare.split("/send/")[1].split("/")[0]
            hs.sent.append((event_type, json.loads(request.content)))
            return httpx.Response(200, json={"event_id": f"$sent{len(hs.sent)}"})
        if "/state/" in bare:
            found = hs.state.get(bare.split("/state/")[1].split("/")[0])
            if found is None:
                return httpx.Response(404, json={"errcode": "M_NOT_FOUND", "error": "no"})
            return httpx.Response(200, json=found)
        body = json.loads(request.content) if request.content else None
        return httpx.Response(200, json=server._answer(device, path, body))

    return MatrixClient(
        "https://hs.example",
        session=Session("https://hs.example", device[0], device[1], token),
        transport=httpx.MockTransport(handler),
    )


@contextlib.asynccontextmanager
async def scene(
    store: Path,
    server: KeyServer | None = None,
    bob: Peer | None = None,
    backup: FakeHomeserver | None = None,
    *,
    e2ee: bool = True,
    sink: Sink | None = None,
) -> AsyncGenerator[Scene]:
    server = server or KeyServer()
    clock = Clock()
    if bob is None:
        bob = Peer(server, "@bob:x", "B1", clock)
        bob.pump()
        bob.machine.set_room_encryption(ROOM, MEGOLM)
        bob.machine.update_tracked_users(["@alice:x", "@bob:x"])
        bob.commit()
    sink = sink or Sink()
    hs = Homeserver()
    async with (
        alice_client(server, hs, backup=backup) as client,
        Engine.open(
            store, client, passphrase="pw", sink=sink, sync=False, send=True, e2ee=e2ee,
            kdf_cost=KdfParams.cheap(),
        ) as engine,
    ):  # fmt: skip
        yield Scene(server, clock, engine, sink, bob, hs)


async def encrypted_room(kit: Any, owner: Session, member: Session) -> str:
    """A private encrypted room of ``owner`` that ``member`` joined."""
    async with kit.client(owner) as client:
        room = await client.create_room(
            preset="private_chat", initial_state=[ENCRYPTION], invite=[member.user_id]
        )
    async with kit.client(member) as client:
        await client.join(room)
    return room


@pytest.fixture
async def peers(synapse_kit: Any, tmp_path: Path) -> AsyncGenerator[tuple[Session, NioDevice, str]]:
    alice = await synapse_kit.user("alice")
    bob = await synapse_kit.user("bob")
    room = await encrypted_room(synapse_kit, alice, bob)
    nio = await NioDevice.login(synapse_kit.base_url, bob.user_id, tmp_path / "nio")
    try:
        yield alice, nio, room
    finally:
        await nio.close()
