"""The echo bot against a real Synapse: answers, streaming, projection, strict reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from gapline.journal import JournalStore
from gapline.storage import open_backend
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


async def test_echo_answers_each_of_50_messages_exactly_once(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    bot = await make_bot_user(synapse_kit)
    store = str(tmp_path / "journal.sqlite3")
    room = await synapse_kit.room(alice)
    async with (
        running_bot(synapse_kit.base_url, bot.user_id, store, allow=frozenset({alice.user_id})),
        synapse_kit.client(alice) as client,
    ):
        await client.invite(room, bot.user_id)
        await wait_joined(client, room, bot.user_id)
        bodies = [f"message {i}" for i in range(50)]
        sources = await synapse_kit.send_messages(alice, room, bodies)

        async def all_delivered() -> bool:
            return delivered(await turn_states(store, bot.user_id, sources))

        await eventually(all_delivered, within=120, what="50 delivered turns")
        events = await room_events(client, room)
    answers = answers_by_source(events, bot.user_id)
    for source, body in zip(sources, bodies, strict=True):
        assert len(answers.get(source, [])) == 1, f"{source} answered {answers.get(source)}"
        (answer,) = answers[source]
        assert answer.final_body == f"echo: {body}"
        assert answer.progress_edits >= 2
        assert answer.final_edits == 1

    # The projection: every answer at its final body, no progress edit ever visible.
    backend = await open_backend(store)
    try:
        journal = (await JournalStore.open(backend)).principal(bot.user_id)

        async def projected() -> bool:
            page = await journal.read_conversation(room, None, 200)
            mine = [r for r in page.rows if r.sender == bot.user_id]
            return len(mine) == 50 and all(r.body.startswith("echo: message") for r in mine)

        await eventually(projected, what="answers projected at their final body")
        page = await journal.read_conversation(room, None, 200)
        assert [r.body for r in page.rows if r.sender == alice.user_id] == bodies
        assert sorted(r.body for r in page.rows if r.sender == bot.user_id) == sorted(
            f"echo: {b}" for b in bodies
        )
    finally:
        await backend.close()
