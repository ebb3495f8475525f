"""The "before our join" rule kept through a late key, against a real Synapse with a
matrix-nio peer: a message alice encrypted before the bot joined, whose key the bot gets
only later, is journaled as a decryption failure from before the join and, once healed,
admitted as context only (never answered); what alice says after the join is answered."""

from __future__ import annotations

from pathlib import Path

import pytest

from gapline.journal import EventKind
from tests.e2ee.synapse_peers import ENCRYPTION, NioDevice
from tests.fixtures.synapse import SynapseKit
from tests.integration.bot_support import eventually, make_bot_user, running_bot, wait_joined
from tests.integration.e2ee_rooms import PASSPHRASE, SHARED
from tests.integration.test_bot_e2ee import (
    answered,
    hold_back_next_key,
    journal_query,
    turn_states,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def test_a_failure_from_before_the_join_heals_into_context_only(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    bot = await make_bot_user(synapse_kit)
    store = str(tmp_path / "journal.sqlite3")
    nio = await NioDevice.login(synapse_kit.base_url, alice.user_id, tmp_path / "alice-nio")

    async def row(event_id: str) -> tuple[str, int, str | None] | None:
        rows = await journal_query(
            store,
            "SELECT kind, settled, upgraded_from FROM journal_events"
            " WHERE principal_id = ? AND event_id = ?",
            (bot.user_id, event_id),
        )
        return (rows[0][0], int(rows[0][1]), rows[0][2]) if rows else None

    try:
        # The bot's device exists (its keys uploaded) before it is in any room.
        async with running_bot(synapse_kit.base_url, bot.user_id, store, passphrase=PASSPHRASE):
            pass
        async with synapse_kit.client(alice) as client:
            room = await client.create_room(
                preset="private_chat", initial_state=[ENCRYPTION, SHARED], invite=[bot.user_id]
            )

            def bot_invited() -> bool:
                known = nio.client.rooms.get(room)
                return known is not None and bot.user_id in known.users

            await nio.wait_until(bot_invited)
            await nio.keys()
            # Encrypted before the bot joins, with a key nio holds back.
            held, _session = await hold_back_next_key(nio, room)
            before = await nio.send_text(room, "said before the bot came?")
            async with running_bot(
                synapse_kit.base_url,
                bot.user_id,
                store,
                allow=frozenset({alice.user_id}),
                passphrase=PASSPHRASE,
            ):
                await wait_joined(client, room, bot.user_id)

                async def failure_before_join() -> bool:
                    found = await row(before)
                    return found is not None and found[0] == EventKind.DECRYPTION_FAILURE.value

                await eventually(failure_before_join, what="the failure from before the join")
                async with synapse_kit.client(nio.session) as as_nio:
                    await as_nio.send_to_device("m.room.encrypted", held, "late-key")

                async def healed() -> bool:
                    found = await row(before)
                    return found is not None and found[2] == "decryption_failure"

                await eventually(healed, within=90, what="the late key healing the failure")
                after = await nio.send_text(room, "said after the bot came")
                await eventually(
                    lambda: answered(store, bot.user_id, after), within=90, what="the answer"
                )
        assert await row(before) == (EventKind.CONTEXT_ONLY.value, 1, "decryption_failure")
        assert await turn_states(store, bot.user_id, [before]) == {before: None}
    finally:
        await nio.close()
