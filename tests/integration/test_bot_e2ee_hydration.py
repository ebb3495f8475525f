"""Decryption in hydration and in the point refetch, against a real Synapse with a
matrix-nio peer, on SQLite and PostgreSQL: an encrypted thread (its root and a reply)
read cold is fetched from the server and decrypted before it is projected, and the point
refetch of an encrypted message whose visible edit was redacted decrypts the original it
fetches. The same reads through the bare client (no decryption) project nothing, so
what the reader shows came from decryption."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import nio as nio_lib
import pytest

from gapline.journal import (
    ConversationKey,
    ConversationReader,
    EventKind,
    Hydrator,
    InboundEvent,
    JournalStore,
    PointRefetcher,
)
from gapline.journal._crypto import DecryptingSource
from gapline.journal._refetch import RefetchSource
from gapline.storage import open_backend
from tests.fixtures.synapse import SynapseKit
from tests.integration.bot_support import eventually
from tests.integration.e2ee_rooms import encrypted_room_with_bot
from tests.integration.test_bot_e2ee import answered
from tests.integration.test_bot_e2ee import store_dsn as store_dsn  # both backends

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def test_hydration_and_the_point_refetch_decrypt_what_they_fetch(
    synapse_kit: SynapseKit, tmp_path: Path, store_dsn: str
) -> None:
    backend = None
    try:
        async with encrypted_room_with_bot(synapse_kit, tmp_path, store_dsn) as e:
            alice, bot, nio, room, running = e.alice, e.bot, e.nio, e.room, e.running
            root = await nio.send_text(room, "an encrypted thread root")
            await nio.step()
            reply = await nio.client.room_send(
                room,
                "m.room.message",
                {
                    "msgtype": "m.text",
                    "body": "an encrypted reply in the thread",
                    "m.relates_to": {"rel_type": "m.thread", "event_id": root},
                },
                ignore_unverified_devices=True,
            )
            assert isinstance(reply, nio_lib.RoomSendResponse), reply
            reply_id = reply.event_id
            older = await nio.send_text(room, "an older message, fetched cold")
            for source in (root, older):
                await eventually(
                    lambda source=source: answered(store_dsn, bot.user_id, source),
                    within=90,
                    what="the bot holding the session's key",
                )
            crypto = running.crypto
            assert crypto is not None
            backend = await open_backend(store_dsn)
            store = await JournalStore.open(backend)
            async with synapse_kit.client(bot) as as_bot:
                source = DecryptingSource(as_bot, crypto)

                def reader_for(principal: str, through: RefetchSource) -> ConversationReader:
                    journal = store.principal(principal, sealing=crypto.sealing)
                    return ConversationReader(
                        journal,
                        refetcher=PointRefetcher(journal, through, bot.user_id),
                        hydrator=Hydrator(journal, through, bot.user_id),
                    )

                # A cold thread: hydration fetches and decrypts its root and reply.
                cold = reader_for("@cold-reader:localhost", source)
                thread = await cold.read(ConversationKey(room, root), limit=10)
                blind = reader_for("@blind-reader:localhost", as_bot)
                undecrypted = await blind.read(ConversationKey(room, root), limit=10)

                # The point refetch: the older message and an edit admitted as ingress
                # would, then the edit redacted; the strict read refetches the original
                # from the server, encrypted, and decrypts it.
                refetch_journal = store.principal("@refetcher:localhost", sealing=crypto.sealing)
                plain = {"msgtype": "m.text", "body": "an older message, fetched cold"}
                original = InboundEvent(
                    older, room, None, alice.user_id, 1000, "m.room.message",
                    json.dumps(plain), EventKind.CONTEXT_ONLY,
                )  # fmt: skip
                edited = dataclasses.replace(
                    original,
                    event_id="$a-local-edit",
                    origin_server_ts=2000,
                    content=json.dumps(
                        {
                            "msgtype": "m.text",
                            "body": "* edited",
                            "m.new_content": {"msgtype": "m.text", "body": "edited"},
                            "m.relates_to": {"rel_type": "m.replace", "event_id": older},
                        }
                    ),
                )
                redacted = dataclasses.replace(
                    original,
                    event_id="$the-edit-redacted",
                    origin_server_ts=3000,
                    type="m.room.redaction",
                    content=json.dumps({"redacts": "$a-local-edit"}),
                    kind=EventKind.REDACTION,
                )
                for event in (original, edited, redacted):
                    await refetch_journal.admit(event, epoch=0)
                refetching = ConversationReader(
                    refetch_journal,
                    refetcher=PointRefetcher(refetch_journal, source, bot.user_id),
                )
                page = await refetching.read(ConversationKey(room), limit=10, strict=True)
    finally:
        if backend is not None:
            await backend.close()

    assert thread.root is not None and thread.root.body == "an encrypted thread root"
    # The reply and the bot's own encrypted answer to it, both decrypted.
    bodies = [r.body for r in thread.rows]
    assert bodies == ["an encrypted reply in the thread", "echo: an encrypted reply in the thread"]
    assert thread.rows[0].event_id == reply_id
    assert undecrypted.rows == () and (
        undecrypted.root is None or undecrypted.root.body != "an encrypted thread root"
    )
    assert [(r.event_id, r.body, r.edited) for r in page.rows] == [
        (older, "an older message, fetched cold", False)
    ]
