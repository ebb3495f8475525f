"""SIGKILL the bot during to-device processing and during key sharing, restart it: no room
key lost, no Olm session out of step, no message answered twice. matrix-nio is the peer
and decrypts every answer itself; both storage backends run every boundary.

The kill is the documented hook ``GAPLINE_FAULT=<boundary>`` (``CryptoFaultPoint``):
the process kills itself the first time it reaches the boundary, nothing after it runs.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import nio
import pytest

from gapline.journal import CryptoFaultPoint
from gapline.matrix import ClientEvent, MatrixClient
from tests.e2ee.synapse_peers import ENCRYPTION, NioDevice
from tests.fixtures.synapse import SynapseKit
from tests.integration.bot_support import (
    answers_by_source,
    bot_process,
    delivered,
    eventually,
    make_bot_user,
    room_events,
    wait_joined,
)
from tests.integration.test_bot_e2ee import nothing_in_the_clear, turn_states

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PASSPHRASE_ENV = {"GAPLINE_PASSPHRASE": "correct horse battery staple"}


@pytest.fixture(params=["sqlite", "postgres"])
def store_dsn(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "journal.sqlite3")
    return request.getfixturevalue("postgres_dsn")


def decrypted_by_nio(peer: NioDevice, events: list[ClientEvent], room_id: str) -> list[ClientEvent]:
    """The room as nio reads it: each encrypted event decrypted by nio's own crypto (an
    event nio cannot decrypt fails the test: the bot sent something unreadable)."""
    out: list[ClientEvent] = []
    for event in events:
        if event.type != "m.room.encrypted":
            out.append(event)
            continue
        raw = {
            "event_id": event.event_id,
            "sender": event.sender,
            "origin_server_ts": event.origin_server_ts,
            "type": event.type,
            "content": event.content,
            "room_id": room_id,
        }
        plain = peer.client.decrypt_event(nio.MegolmEvent.from_dict(raw))
        content = dict(plain.source["content"])
        if "m.relates_to" in event.content and "m.relates_to" not in content:
            content["m.relates_to"] = event.content["m.relates_to"]
        out.append(
            ClientEvent(
                event_id=event.event_id,
                type=plain.source["type"],
                sender=event.sender,
                origin_server_ts=event.origin_server_ts,
                content=content,
            )
        )
    return out


def stop(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    return process.wait(timeout=30)


async def encrypted_room_with_bot(client: MatrixClient, bot_id: str) -> str:
    return await client.create_room(
        preset="private_chat", initial_state=[ENCRYPTION], invite=[bot_id]
    )


@pytest.mark.parametrize("boundary", [p.value for p in CryptoFaultPoint])
async def test_sigkill_in_a_crypto_step_then_restart(
    boundary: str, store_dsn: str, synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    bot = await make_bot_user(synapse_kit)
    peer = await NioDevice.login(synapse_kit.base_url, alice.user_id, tmp_path / "alice-nio")
    log = tmp_path / "bot.log"
    env: dict[str, Any] = {**PASSPHRASE_ENV, "GAPLINE_FAULT_ONCE": str(tmp_path / "fired")}
    first = bot_process(
        synapse_kit.base_url, bot.user_id, store_dsn, fault=boundary, log_path=log, extra_env=env
    )
    second: subprocess.Popen[bytes] | None = None
    try:
        async with synapse_kit.client(alice) as client:
            room = await encrypted_room_with_bot(client, bot.user_id)
            await wait_joined(client, room, bot.user_id)

            async def bot_device_known() -> bool:
                await peer.step()
                devices = peer.client.device_store.active_user_devices(bot.user_id)
                return any(True for _ in devices)

            await eventually(bot_device_known, what="nio sees the bot's device")
            # The first message carries nio's room key to the bot (to-device), and its
            # answer makes the bot share its own key with nio: every boundary is on it.
            one = await peer.send_text(room, "one")
            assert first.wait(timeout=60) == -signal.SIGKILL, log.read_text()[-3000:]

            second = bot_process(
                synapse_kit.base_url,
                bot.user_id,
                store_dsn,
                fault=boundary,  # FAULT_ONCE: it does not fire again
                log_path=log,
                extra_env=env,
            )

            async def answered(*sources: str) -> bool:
                return delivered(await turn_states(store_dsn, bot.user_id, list(sources)))

            await eventually(lambda: answered(one), within=90, what="'one' answered")
            # Same nio session, no new key: the key received before the kill survived.
            two = await peer.send_text(room, "two")
            await eventually(lambda: answered(two), within=90, what="'two' answered")
            # A new nio session: its key travels over the same Olm channel as the first,
            # so the bot's Olm session from nio must still be in step.
            peer.olm.rotate_outbound_group_session(room)
            three = await peer.send_text(room, "three")
            await eventually(lambda: answered(three), within=90, what="'three' answered")
            sources = [one, two, three]

            async def nio_reads_every_answer() -> bool:
                await peer.step()
                try:
                    plain = decrypted_by_nio(peer, await room_events(client, room), room)
                except nio.EncryptionError:
                    return False
                answers = answers_by_source(plain, bot.user_id)
                return all(answers.get(s) and answers[s][0].final_body for s in sources)

            await eventually(nio_reads_every_answer, within=90, what="nio decrypts the answers")
            events = await room_events(client, room)

            async def restarted() -> bool:
                return log.read_text().count('"msg": "ready"') >= 2

            await eventually(restarted, what="the restarted bot's first sync")
        assert stop(second) == 0, log.read_text()[-3000:]
        nothing_in_the_clear(events, bot.user_id)
        answers = answers_by_source(decrypted_by_nio(peer, events, room), bot.user_id)
        for source, body in zip(sources, ["one", "two", "three"], strict=True):
            assert len(answers.get(source, [])) == 1, (boundary, answers.get(source))
            assert answers[source][0].final_body == f"echo: {body}"
            assert answers[source][0].final_edits == 1
        assert (tmp_path / "fired").exists()  # the kill happened where it was asked for
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
        await peer.close()
