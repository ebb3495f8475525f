"""Invited members and the room key, against a real Synapse with matrix-nio peers: when
the room's ``m.room.history_visibility`` lets invited members read (``shared`` here, the
spec's rule: a member sees what was sent while it was invited once it joins), the bot
shares its session with an invited member's devices too, so what the bot said while
that member was invited decrypts once it joins."""

from __future__ import annotations

from pathlib import Path

import pytest

from gapline.journal._crypto import room_members
from gapline.matrix import ClientEvent
from tests.e2ee.synapse_peers import NioDevice
from tests.fixtures.synapse import SynapseKit
from tests.integration.bot_support import eventually
from tests.integration.e2ee_rooms import SHARED, encrypted_room_with_bot
from tests.integration.test_bot_e2ee import answered

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def state(event_type: str, state_key: str, content: dict[str, str]) -> ClientEvent:
    return ClientEvent(
        event_id=f"${event_type}{state_key}", type=event_type, sender="@a:x",
        origin_server_ts=1, content=content, state_key=state_key,
    )  # fmt: skip


def test_the_recipients_are_read_from_the_rooms_state() -> None:
    members = room_members(
        [
            state("m.room.member", "@j:x", {"membership": "join"}),
            state("m.room.member", "@i:x", {"membership": "invite"}),
            state("m.room.member", "@l:x", {"membership": "leave"}),
            state("m.room.history_visibility", "", {"history_visibility": "joined"}),
        ]
    )
    assert (members.joined, members.invited, members.history_visibility) == (
        ("@j:x",),
        ("@i:x",),
        "joined",
    )
    assert room_members([]).history_visibility == "shared"  # the spec's default


async def test_an_invited_member_reads_what_the_bot_said_while_it_was_invited(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    carol = await synapse_kit.user("carol")
    store = str(tmp_path / "journal.sqlite3")
    invited = await NioDevice.login(synapse_kit.base_url, carol.user_id, tmp_path / "carol-nio")
    try:
        async with encrypted_room_with_bot(
            synapse_kit, tmp_path, store, initial_state=[SHARED]
        ) as e:
            await e.client.invite(e.room, carol.user_id)
            asked = await e.nio.send_text(e.room, "said while carol was invited")
            await eventually(
                lambda: answered(store, e.bot.user_id, asked), within=90, what="the answer"
            )
            # Only now does carol join: the answer was encrypted while she was invited.
            await invited.client.join(e.room)
            await invited.wait_until(
                lambda: "* echo: said while carol was invited" in invited.bodies.values()
            )
    finally:
        await invited.close()
