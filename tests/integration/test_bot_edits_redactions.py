"""User edits and redactions reach the projection; a strict read repairs a redacted revision."""

from __future__ import annotations

from pathlib import Path

import pytest

from gapline.journal import ConversationKey, ConversationRow
from tests.fixtures.synapse import SynapseKit
from tests.integration.bot_support import eventually, make_bot_user, running_bot, wait_joined

pytestmark = pytest.mark.slow


def edit(target: str, body: str) -> dict[str, object]:
    return {
        "msgtype": "m.text",
        "body": f"* {body}",
        "m.new_content": {"msgtype": "m.text", "body": body},
        "m.relates_to": {"rel_type": "m.replace", "event_id": target},
    }


async def test_edits_and_redactions_are_projected_and_strict_read_refetches(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    bot_user = await make_bot_user(synapse_kit)
    room = await synapse_kit.room(alice)
    store = str(tmp_path / "journal.sqlite3")
    key = ConversationKey(room)
    async with (
        running_bot(synapse_kit.base_url, bot_user.user_id, store) as bot,
        synapse_kit.client(alice) as client,
    ):
        assert bot.journal is not None and bot.reader is not None
        journal, reader = bot.journal, bot.reader
        await client.invite(room, bot_user.user_id)
        await wait_joined(client, room, bot_user.user_id)
        kept = await client.send_text(room, "first words")
        gone = await client.send_text(room, "to be deleted")

        async def row(event_id: str) -> ConversationRow | None:
            return await journal.message(room, event_id)

        await eventually(lambda: row(gone), what="messages admitted")

        # A user's edit is projected.
        first_edit = await client.send_message(room, edit(kept, "second words"))

        async def edited() -> bool:
            current = await row(kept)
            return current is not None and current.body == "second words" and current.edited

        await eventually(edited, what="the edit projected")

        # Redacting the original removes the message.
        await client.redact(room, gone)

        async def removed() -> bool:
            return await row(gone) is None

        await eventually(removed, what="the redacted original removed")

        # A second edit, then redacting it (the visible revision): the server's revision
        # is the first edit again. Non-strict reads omit the row; a strict read refetches.
        second_edit = await client.send_message(room, edit(kept, "third words"))

        async def third() -> bool:
            current = await row(kept)
            return current is not None and current.body == "third words"

        await eventually(third, what="the second edit projected")
        await client.redact(room, second_edit)

        async def owing() -> bool:
            page = await journal.read_conversation(room, None, 50)
            return any(d.logical_event_id == kept for d in page.owing_refresh)

        await eventually(owing, what="the body cleared with a refresh debt")
        lenient = await reader.read(key, limit=50)
        assert kept not in [r.event_id for r in lenient.rows]

        strict = await reader.read(key, limit=50, strict=True)
        (repaired,) = [r for r in strict.rows if r.event_id == kept]
        assert repaired.body == "second words"
        assert repaired.revision_event_id == first_edit
        assert not strict.owing_refresh
        # The repair is durable: a later non-strict read sees it without the server.
        again = await journal.read_conversation(room, None, 50)
        assert kept in [r.event_id for r in again.rows]
        assert gone not in [r.event_id for r in again.rows]
