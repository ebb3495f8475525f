"""An approval in an encrypted room against a real Synapse, with matrix-nio as the
approver, on SQLite and PostgreSQL: the card and its resolution go out encrypted, and
the call they name (the message's text as the tool's arguments) is stored sealed: the
approval tables and the outbox hold none of it, nor its digest, nor an approval id a
guess could be hashed into, and on SQLite neither does any file of the store (the
database, its WAL)."""

from __future__ import annotations

from pathlib import Path

import nio as nio_lib
import pytest

from gapline.journal import ToolCall, approval_id_for, approve
from tests.fixtures.synapse import SynapseKit
from tests.integration.bot_support import (
    eventually,
    room_events,
)
from tests.integration.e2ee_rooms import encrypted_room_with_bot
from tests.integration.test_bot_e2ee import (
    answered,
    journal_query,
    nothing_in_the_clear,
    store_bytes,
)
from tests.integration.test_bot_e2ee import (
    store_dsn as store_dsn,  # the fixture: both backends
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SECRET = "wire 4711 to the account ending 0815"


async def approval_values(store: str, principal: str) -> str:
    """Every stored value of the principal's approval rows and outbox, as one text."""
    found: list[object] = []
    for sql in (
        "SELECT * FROM approval_cards WHERE principal_id = ?",
        "SELECT * FROM approval_continuations WHERE principal_id = ?",
        "SELECT * FROM journal_outbox WHERE principal_id = ?",
    ):
        found += await journal_query(store, sql, (principal,))
    return repr(found)


async def test_an_approval_in_an_encrypted_room_is_sealed_at_rest(
    synapse_kit: SynapseKit, tmp_path: Path, store_dsn: str
) -> None:
    async with encrypted_room_with_bot(synapse_kit, tmp_path, store_dsn, handler=approve) as e:
        bot, nio, client, room = e.bot, e.nio, e.client, e.room
        asking = await nio.send_text(room, SECRET)

        # The card is an m.notice (nio's bodies keep texts only): its event id
        # is the journal's, once the card was delivered.
        async def card_event() -> str | None:
            rows = await journal_query(
                store_dsn,
                "SELECT card_event_id FROM approval_cards WHERE principal_id = ?",
                (bot.user_id,),
            )
            return rows[0][0] if rows and rows[0][0] else None

        card = await eventually(card_event, what="the approval card")
        sent = await nio.client.room_send(
            room,
            "m.room.message",
            {
                "msgtype": "m.text",
                "body": "approve",
                "m.relates_to": {"m.in_reply_to": {"event_id": card}},
            },
            ignore_unverified_devices=True,
        )
        assert isinstance(sent, nio_lib.RoomSendResponse), sent
        await eventually(
            lambda: answered(store_dsn, bot.user_id, asking),
            within=90,
            what="the approved answer",
        )
        await nio.wait_until(lambda: f"* echo: {SECRET}" in nio.bodies.values())

        async def resolution_sent() -> bool:
            rows = await journal_query(
                store_dsn,
                "SELECT acked_event_id FROM journal_outbox WHERE principal_id = ?"
                " AND purpose = 'approval_card' AND stage = 'final'",
                (bot.user_id,),
            )
            return bool(rows and rows[0][0])

        await eventually(resolution_sent, what="the card's resolution")
        stored = await approval_values(store_dsn, bot.user_id)
        data_open = store_bytes(store_dsn)
        events = await room_events(client, room)
    nothing_in_the_clear(events, bot.user_id)
    # The rows are there (a card and its resolution), and none names the call.
    assert stored.count("approval_card") >= 2, stored
    # Nor its digest, nor an id a guess could be hashed into: the id is keyed.
    call = ToolCall("echo", {"text": SECRET})
    guessable = (call.digest(), approval_id_for(bot.user_id, asking, 0, call))
    for secret in (SECRET, "4711", "echo(", '"text"', *guessable):
        assert secret not in stored, secret
    if data_open is not None:  # SQLite: the database and its WAL, open and closed
        data = data_open + (store_bytes(store_dsn) or b"")
        assert len(data) > 10_000 and b"approval_cards" in data
        for secret in (SECRET, "account ending 0815", "echo({", *guessable):
            assert secret.encode() not in data, secret
