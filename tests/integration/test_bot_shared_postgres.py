"""Two bot processes, one PostgreSQL database, different principals: no shared rows."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.synapse import SynapseKit
from tests.integration.bot_support import (
    answers_by_source,
    bot_process,
    delivered,
    eventually,
    make_bot_user,
    room_events,
    turn_states,
    wait_joined,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def journal_read(store: str, principal: str, room: str) -> list[dict[str, object]]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gapline.cli",
            "journal",
            "read",
            "--store",
            store,
            "--principal",
            principal,
            "--room",
            room,
            "--limit",
            "100",
        ],
        capture_output=True,
        check=True,
        timeout=60,
    )
    return [json.loads(line) for line in out.stdout.decode().splitlines()]


async def test_two_bots_share_one_database_without_touching_each_other(
    synapse_kit: SynapseKit, postgres_dsn: str, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    bots = [await make_bot_user(synapse_kit) for _ in range(2)]
    rooms = [await synapse_kit.room(alice) for _ in range(2)]
    log = tmp_path / "bots.log"
    processes = [
        bot_process(synapse_kit.base_url, b.user_id, postgres_dsn, log_path=log) for b in bots
    ]
    try:
        sources: list[list[str]] = []
        async with synapse_kit.client(alice) as client:
            for bot, room in zip(bots, rooms, strict=True):
                await client.invite(room, bot.user_id)
                await wait_joined(client, room, bot.user_id)
            for i, room in enumerate(rooms):
                sources.append(
                    await synapse_kit.send_messages(
                        alice, room, [f"to bot {i} #{n}" for n in range(3)]
                    )
                )
            for bot, ids in zip(bots, sources, strict=True):

                async def done(bot_id: str = bot.user_id, ids: list[str] = ids) -> bool:
                    return delivered(await turn_states(postgres_dsn, bot_id, ids))

                await eventually(done, within=90, what=f"{bot.user_id} answered")
            events = [await room_events(client, room) for room in rooms]
        for process in processes:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()

    for i, (bot, room) in enumerate(zip(bots, rooms, strict=True)):
        answers = answers_by_source(events[i], bot.user_id)
        assert sorted(len(answers[s]) for s in sources[i]) == [1, 1, 1]
        other = bots[1 - i]
        # Each bot's turns exist only under its own principal.
        assert set((await turn_states(postgres_dsn, other.user_id, sources[i])).values()) == {None}
        mine = journal_read(postgres_dsn, bot.user_id, room)
        assert [r["body"] for r in mine if r["sender"] == alice.user_id] == [
            f"to bot {i} #{n}" for n in range(3)
        ]
        assert journal_read(postgres_dsn, other.user_id, room) == []
