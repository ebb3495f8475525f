"""Messages sent while the bot was down, beyond one sync's timeline, are recovered and answered."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.synapse import SynapseKit
from tests.integration.bot_support import (
    answers_by_source,
    delivered,
    eventually,
    make_bot_user,
    room_events,
    running_bot,
    turn_states,
    wait_joined,
)

pytestmark = pytest.mark.slow


async def test_a_limited_sync_after_downtime_recovers_the_gap(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    bot_user = await make_bot_user(synapse_kit)
    room = await synapse_kit.room(alice)
    store = str(tmp_path / "journal.sqlite3")
    async with (
        running_bot(synapse_kit.base_url, bot_user.user_id, store, timeline_limit=3),
        synapse_kit.client(alice) as client,
    ):
        await client.invite(room, bot_user.user_id)
        await wait_joined(client, room, bot_user.user_id)
    bodies = [f"while down {i}" for i in range(8)]
    sources = await synapse_kit.send_messages(alice, room, bodies)
    async with (
        running_bot(synapse_kit.base_url, bot_user.user_id, store, timeline_limit=3) as bot,
        synapse_kit.client(alice) as client,
    ):
        assert bot.journal is not None
        journal = bot.journal

        async def all_delivered() -> bool:
            return delivered(await turn_states(store, bot_user.user_id, sources))

        await eventually(all_delivered, within=90, what="every message of the gap answered")
        events = await room_events(client, room)
        page = await journal.read_conversation(room, None, 50)
    answers = answers_by_source(events, bot_user.user_id)
    assert [len(answers[s]) for s in sources] == [1] * len(sources)
    # Without the recovery the 5 messages left out of the limited sync were never admitted.
    assert [r.body for r in page.rows if r.sender == alice.user_id][-8:] == bodies


async def test_history_from_before_the_join_is_not_answered(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    bot_user = await make_bot_user(synapse_kit)
    room = await synapse_kit.room(alice)
    earlier = await synapse_kit.send_messages(alice, room, [f"old {i}" for i in range(6)])
    store = str(tmp_path / "journal.sqlite3")
    async with (
        running_bot(synapse_kit.base_url, bot_user.user_id, store, timeline_limit=3),
        synapse_kit.client(alice) as client,
    ):
        await client.invite(room, bot_user.user_id)
        await wait_joined(client, room, bot_user.user_id)
        (after,) = await synapse_kit.send_messages(alice, room, ["new"])

        async def answered() -> bool:
            return delivered(await turn_states(store, bot_user.user_id, [after]))

        await eventually(answered, what="the message after the join answered")
        assert set((await turn_states(store, bot_user.user_id, earlier)).values()) == {None}
        events = await room_events(client, room)
    answers = answers_by_source(events, bot_user.user_id)
    assert set(answers) == {after}
