"""An encrypted room with alice (a matrix-nio device) and the bot (with a passphrase)
joined and known to each other: the start the e2ee bot tests share."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gapline.journal import Bot, Handler, echo
from gapline.matrix import MatrixClient, Session
from tests.e2ee.synapse_peers import ENCRYPTION, NioDevice
from tests.fixtures.synapse import SynapseKit
from tests.integration.bot_support import make_bot_user, running_bot, wait_joined

PASSPHRASE = "correct horse battery staple"

# History visible to members invited or joined later (the spec's default, said outright).
SHARED = {
    "type": "m.room.history_visibility",
    "state_key": "",
    "content": {"history_visibility": "shared"},
}


def in_room(nio: NioDevice, room_id: str, user_id: str) -> bool:
    """Whether nio's sync has shown ``user_id`` as a member of the room."""
    return room_id in nio.client.rooms and user_id in nio.client.rooms[room_id].users


@dataclass(frozen=True)
class EncryptedRoom:
    alice: Session
    bot: Session
    nio: NioDevice  # alice's device
    client: MatrixClient  # alice's plain client
    room: str
    running: Bot


@contextlib.asynccontextmanager
async def encrypted_room_with_bot(
    kit: SynapseKit,
    tmp_path: Path,
    store: str,
    *,
    handler: Handler = echo,
    initial_state: Sequence[dict[str, Any]] = (),
    sidecar_limit: int = 16_000,
) -> AsyncGenerator[EncryptedRoom]:
    """alice creates the room (encrypted from its start), invites the bot, and both see
    each other; nio is closed on the way out."""
    alice = await kit.user("alice")
    bot = await make_bot_user(kit)
    nio = await NioDevice.login(kit.base_url, alice.user_id, tmp_path / "alice-nio")
    try:
        async with kit.client(alice) as client:
            room = await client.create_room(
                preset="private_chat",
                initial_state=[ENCRYPTION, *initial_state],
                invite=[bot.user_id],
            )
            async with running_bot(
                kit.base_url,
                bot.user_id,
                store,
                allow=frozenset({alice.user_id}),
                handler=handler,
                passphrase=PASSPHRASE,
                sidecar_limit=sidecar_limit,
            ) as running:
                await wait_joined(client, room, bot.user_id)
                await nio.wait_until(lambda: in_room(nio, room, bot.user_id))
                await nio.keys()
                yield EncryptedRoom(alice, bot, nio, client, room, running)
    finally:
        await nio.close()
