"""An invited member gets the room key from a restarted bot, against a real Synapse with
matrix-nio peers, on SQLite and PostgreSQL, after a SIGKILL and after a clean stop.

The bot keeps each encrypted room's audience (joined and invited members, history
visibility) in the journal, written with the sync token that delivered it. carol is
invited while the bot runs; the bot is stopped and started again, and only then does
alice write. The restarted bot's incremental sync says nothing of carol, so only the
stored audience can make it share its new session with her: once she joins, her nio
device decrypts the answer sent while she was invited. Neither bot asks the homeserver
for the room's state (the journal already knows the audience), which its log would say.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.e2ee.synapse_peers import ENCRYPTION, NioDevice
from tests.fixtures.synapse import SynapseKit
from tests.integration.bot_support import bot_process, eventually, make_bot_user, wait_joined
from tests.integration.e2ee_rooms import SHARED, in_room
from tests.integration.test_bot_e2ee import answered, journal_query
from tests.integration.test_bot_e2ee import store_dsn as store_dsn  # the fixture: both backends

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PASSPHRASE_ENV = {"GAPLINE_PASSPHRASE": "correct horse battery staple"}
ASKED = "room audience asked of the homeserver"


def log_records(log: Path) -> list[dict[str, object]]:
    out = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


@pytest.mark.parametrize("stop", ["sigkill", "sigterm"])
async def test_a_restarted_bot_shares_its_key_with_a_member_invited_before(
    stop: str, store_dsn: str, synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    carol = await synapse_kit.user("carol")
    bot = await make_bot_user(synapse_kit)
    nio = await NioDevice.login(synapse_kit.base_url, alice.user_id, tmp_path / "alice-nio")
    invited = await NioDevice.login(synapse_kit.base_url, carol.user_id, tmp_path / "carol-nio")
    log = tmp_path / "bot.log"
    first = bot_process(
        synapse_kit.base_url, bot.user_id, store_dsn, log_path=log, extra_env=PASSPHRASE_ENV
    )
    second: subprocess.Popen[bytes] | None = None
    try:
        async with synapse_kit.client(alice) as client:
            room = await client.create_room(
                preset="private_chat", initial_state=[ENCRYPTION, SHARED], invite=[bot.user_id]
            )
            await wait_joined(client, room, bot.user_id)
            await nio.wait_until(lambda: in_room(nio, room, bot.user_id))
            await nio.keys()
            await client.invite(room, carol.user_id)

            async def carol_stored_as_invited() -> bool:
                rows = await journal_query(
                    store_dsn,
                    "SELECT membership FROM journal_room_members"
                    " WHERE principal_id = ? AND room_id = ? AND user_id = ?",
                    (bot.user_id, room, carol.user_id),
                )
                return rows == [("invite",)]

            await eventually(carol_stored_as_invited, what="the bot to record carol's invite")
            if stop == "sigkill":
                first.kill()
                assert first.wait(timeout=30) == -signal.SIGKILL
            else:
                first.send_signal(signal.SIGTERM)
                assert first.wait(timeout=30) == 0, log.read_text()[-3000:]

            second = bot_process(
                synapse_kit.base_url, bot.user_id, store_dsn, log_path=log, extra_env=PASSPHRASE_ENV
            )

            async def restarted() -> bool:
                return sum(r["msg"] == "ready" for r in log_records(log)) >= 2

            await eventually(restarted, what="the restarted bot's first sync")
            asked = await nio.send_text(room, "said after the restart, carol invited")
            await eventually(
                lambda: answered(store_dsn, bot.user_id, asked), within=90, what="the answer"
            )
            # Only now does carol join: the answer was encrypted while she was invited.
            await invited.client.join(room)
            await invited.wait_until(
                lambda: "* echo: said after the restart, carol invited" in invited.bodies.values()
            )
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0, log.read_text()[-3000:]
        # The join's sync carried the room's whole state, and every later sync its
        # changes: no bot ever needed the homeserver's /state for this room.
        assert not [r for r in log_records(log) if r["msg"] == ASKED]
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        await nio.close()
        await invited.close()
