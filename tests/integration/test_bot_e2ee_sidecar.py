"""A long answer in an encrypted room, against a real Synapse with matrix-nio as the peer,
on SQLite and PostgreSQL: the bot sends a preview plus an encrypted attachment (AES-CTR,
the spec's ``file`` object inside the Megolm-encrypted edit); nio downloads it, decrypts
it with its own ``decrypt_attachment`` and reads the whole text. What the homeserver
stores is ciphertext, and the bot's own journal resolves its answer's full text."""

from __future__ import annotations

from pathlib import Path

import nio as nio_lib
import pytest
from nio.crypto.attachments import decrypt_attachment

from gapline.journal import SIDECAR_KEY
from tests.fixtures.synapse import SynapseKit
from tests.integration.bot_support import eventually, room_events
from tests.integration.e2ee_rooms import encrypted_room_with_bot
from tests.integration.test_bot_e2ee import (
    answered,
    nothing_in_the_clear,
    projected_bodies,
)
from tests.integration.test_bot_e2ee import store_dsn as store_dsn  # the fixture: both backends
from tests.integration.test_bot_e2ee_crash import decrypted_by_nio

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LONG = "a long line of encrypted text " * 20


async def test_a_long_answer_is_an_encrypted_attachment_nio_reads(
    synapse_kit: SynapseKit, tmp_path: Path, store_dsn: str
) -> None:
    async with encrypted_room_with_bot(synapse_kit, tmp_path, store_dsn, sidecar_limit=100) as e:
        asked = await e.nio.send_text(e.room, LONG)
        await eventually(lambda: answered(store_dsn, e.bot.user_id, asked), within=90)

        async def resolved() -> bool:
            bodies = await projected_bodies(store_dsn, e.bot.user_id, e.room)
            return f"echo: {LONG}" in bodies

        # The bot's own ingress decrypted its answer's attachment from the sync echo.
        await eventually(resolved, what="the full text resolved in the journal")
        await e.nio.step()
        events = await room_events(e.client, e.room)
        plain = decrypted_by_nio(e.nio, events, e.room)
        (final,) = [
            event
            for event in plain
            if event.sender == e.bot.user_id
            and event.content.get("m.new_content", {}).get("io.gapline.stream_status") == "complete"
        ]
        visible = final.content["m.new_content"]
        assert visible["body"] != f"echo: {LONG}"  # what other clients show: the preview
        sidecar = visible[SIDECAR_KEY]
        assert "url" not in sidecar  # never a plaintext attachment
        file = sidecar["file"]
        assert file["v"] == "v2" and file["key"]["alg"] == "A256CTR"
        downloaded = await e.nio.client.download(mxc=file["url"])
        assert isinstance(downloaded, nio_lib.MemoryDownloadResponse), downloaded
        assert b"line of encrypted text" not in downloaded.body  # the upload is ciphertext
        text = decrypt_attachment(
            downloaded.body, file["key"]["k"], file["hashes"]["sha256"], file["iv"]
        ).decode()
        assert text == f"echo: {LONG}"
        assert sidecar["size"] == len(text.encode())
    nothing_in_the_clear(events, e.bot.user_id)
