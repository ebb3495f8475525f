"""The crash matrix: SIGKILL the bot at each durable boundary of an answer, restart it,
and prove at most one visible answer per message and exactly one terminal turn record.

The kill is the documented test hook ``GAPLINE_FAULT=<boundary>`` (gapline.journal._faults):
the bot process kills itself with SIGKILL the first time it reaches that boundary, so
nothing after it runs. Both storage backends run the whole matrix.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from gapline.journal import FaultPoint, JournalStore, TurnState
from gapline.storage import open_backend
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

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", "postgres"])
def store_dsn(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "journal.sqlite3")
    return request.getfixturevalue("postgres_dsn")


async def terminal_records(store: str, principal: str, source: str) -> int:
    backend = await open_backend(store)
    try:
        await JournalStore.open(backend)
        row = await backend.read(
            lambda tx: tx.one(
                "SELECT COUNT(*) FROM journal_turns WHERE principal_id = ? AND source_event_id = ?"
                " AND state = ?",
                (principal, source, TurnState.DELIVERED.value),
            )
        )
        assert row is not None
        return int(row[0])
    finally:
        await backend.close()


def stop(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    return process.wait(timeout=30)


@pytest.mark.parametrize("boundary", [p.value for p in FaultPoint])
async def test_sigkill_at_boundary_then_restart(
    boundary: str, store_dsn: str, synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    await crash_and_restart(boundary, store_dsn, synapse_kit, tmp_path)


@pytest.mark.parametrize(
    "boundary",
    [
        f"{FaultPoint.AFTER_CLAIM_BEFORE_SEND.value}@initial",
        f"{FaultPoint.AFTER_SEND_BEFORE_ACKNOWLEDGEMENT.value}@initial",
    ],
)
async def test_sigkill_around_the_placeholder_then_restart(
    boundary: str, synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    """The INITIAL stage too: a resent placeholder collapses onto the first one."""
    await crash_and_restart(boundary, str(tmp_path / "journal.sqlite3"), synapse_kit, tmp_path)


async def crash_and_restart(
    boundary: str, store_dsn: str, synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    bot = await make_bot_user(synapse_kit)
    room = await synapse_kit.room(alice)
    log = tmp_path / "bot.log"
    first = bot_process(synapse_kit.base_url, bot.user_id, store_dsn, fault=boundary, log_path=log)
    second: subprocess.Popen[bytes] | None = None
    try:
        async with synapse_kit.client(alice) as client:
            await client.invite(room, bot.user_id)
            await wait_joined(client, room, bot.user_id)
            sources = await synapse_kit.send_messages(alice, room, ["one", "two"])
            # The fault fires on the first answer; the process must die by SIGKILL.
            assert first.wait(timeout=60) == -signal.SIGKILL, log.read_text()[-3000:]

            second = bot_process(synapse_kit.base_url, bot.user_id, store_dsn, log_path=log)

            async def all_delivered() -> bool:
                return delivered(await turn_states(store_dsn, bot.user_id, sources))

            await eventually(all_delivered, within=90, what="both turns delivered after restart")
            events = await room_events(client, room)

            # Both turns may have been delivered before the crash (the worker acknowledges
            # concurrently): let the restarted bot finish starting before asking it to stop.
            async def restarted() -> bool:
                return log.read_text().count('"msg": "ready"') >= 2

            await eventually(restarted, what="the restarted bot's first sync")
        assert stop(second) == 0, log.read_text()[-3000:]
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    answers = answers_by_source(events, bot.user_id)
    for source, body in zip(sources, ["one", "two"], strict=True):
        assert len(answers.get(source, [])) == 1, (boundary, answers.get(source))
        assert answers[source][0].final_body == f"echo: {body}"
        # The resent final edit collapsed onto the first (same device, same txn id).
        assert answers[source][0].final_edits == 1
        assert await terminal_records(store_dsn, bot.user_id, source) == 1
