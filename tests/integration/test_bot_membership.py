"""Membership fences against Synapse: every departure applied exactly once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import quote

import pytest

from gapline.journal import (
    Conversation,
    DepartureSource,
    Final,
    HandlerStream,
    JournalStore,
    Progress,
    TriggerMessage,
    TurnState,
)
from gapline.matrix import Request
from gapline.storage import open_backend
from tests.fixtures.synapse import SynapseKit
from tests.integration.bot_support import (
    PASSWORD,
    answers_by_source,
    eventually,
    make_bot_user,
    room_events,
    running_bot,
    wait_joined,
)

pytestmark = pytest.mark.slow


async def test_leave_and_rejoin_while_a_message_is_pending(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    bot_user = await make_bot_user(synapse_kit)
    room = await synapse_kit.room(alice)
    started = asyncio.Event()
    gate = asyncio.Event()

    async def gated(conversation: Conversation, message: TriggerMessage) -> HandlerStream:
        if message.body == "held":
            started.set()
            await gate.wait()
        yield Progress("…")
        yield Progress("… …")
        yield Final(f"echo: {message.body}")

    store = str(tmp_path / "journal.sqlite3")
    async with (
        running_bot(synapse_kit.base_url, bot_user.user_id, store, handler=gated) as bot,
        synapse_kit.client(alice) as client,
    ):
        assert bot.journal is not None
        journal = bot.journal
        await client.invite(room, bot_user.user_id)
        await wait_joined(client, room, bot_user.user_id)
        (held,) = await synapse_kit.send_messages(alice, room, ["held"])
        await asyncio.wait_for(started.wait(), 60)

        await bot.leave(room)  # LOCAL fence: epoch 1, the pending source force-settled
        assert await journal.epoch(room) == 1
        gate.set()  # the handler finishes under the old epoch: its answer is refused

        async def echo_retired() -> bool:
            return await journal.rooms_owing_departure_reports() == ()

        await eventually(echo_retired, what="the leave's echo to retire the owed report")
        assert await journal.epoch(room) == 1  # the echo did not advance a second time

        await client.invite(room, bot_user.user_id)
        await wait_joined(client, room, bot_user.user_id)
        (after,) = await synapse_kit.send_messages(alice, room, ["after"])

        async def answered() -> bool:
            turn = await journal.turn(after)
            return turn is not None and turn.state is TurnState.DELIVERED

        await eventually(answered, what="the message after the rejoin answered")
        held_turn = await journal.turn(held)
        assert held_turn is not None and held_turn.state is not TurnState.DELIVERED
        assert held not in [p.event.event_id for p in await journal.pending(100)]
        assert await journal.epoch(room) == 1
        events = await room_events(client, room)
    answers = answers_by_source(events, bot_user.user_id)
    assert [a.final_body for a in answers[after]] == ["echo: after"]
    # The held message got at most its placeholder, never a final answer.
    assert all(a.final_body is None for a in answers.get(held, []))


async def _local_leave_while_stopped(
    synapse_kit: SynapseKit, store: str, principal: str, room: str
) -> None:
    """What `Bot.leave` does, done while the bot is not running: fence, then leave."""
    backend = await open_backend(store)
    try:
        journal = (await JournalStore.open(backend)).principal(principal)
        await journal.fence_departure(room, source=DepartureSource.LOCAL)
    finally:
        await backend.close()
    session = await synapse_kit.server.login(principal, PASSWORD)
    async with synapse_kit.client(session) as client:
        await client.leave(room)


async def test_reported_departures_after_restart_apply_exactly_once(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    """One leave, then two leaves before one echo, each echo seen only after a restart."""
    alice = await synapse_kit.user("alice")
    bot_user = await make_bot_user(synapse_kit)
    room = await synapse_kit.room(alice)
    store = str(tmp_path / "journal.sqlite3")
    async with (
        running_bot(synapse_kit.base_url, bot_user.user_id, store),
        synapse_kit.client(alice) as client,
    ):
        await client.invite(room, bot_user.user_id)
        await wait_joined(client, room, bot_user.user_id)
    # Stopped with a sync token. One local leave whose echo arrives after the restart.
    await _local_leave_while_stopped(synapse_kit, store, bot_user.user_id, room)
    bot_session = await synapse_kit.server.login(bot_user.user_id, PASSWORD)
    async with (
        running_bot(synapse_kit.base_url, bot_user.user_id, store) as bot,
        synapse_kit.client(alice) as client,
    ):
        assert bot.journal is not None
        journal = bot.journal

        async def retired() -> bool:
            return await journal.rooms_owing_departure_reports() == ()

        await eventually(retired, what="the echo after the restart")
        assert await journal.epoch(room) == 1
        await client.invite(room, bot_user.user_id)
        await wait_joined(client, room, bot_user.user_id)

    # Two leaves (with a rejoin between) before the bot sees a single sync.
    await _local_leave_while_stopped(synapse_kit, store, bot_user.user_id, room)
    async with synapse_kit.client(alice) as client:
        await client.invite(room, bot_user.user_id)
    async with synapse_kit.client(bot_session) as bot_client:
        await bot_client.join(room)
    await _local_leave_while_stopped(synapse_kit, store, bot_user.user_id, room)
    async with running_bot(synapse_kit.base_url, bot_user.user_id, store) as bot:
        assert bot.journal is not None
        journal = bot.journal

        async def both_retired() -> bool:
            return await journal.rooms_owing_departure_reports() == ()

        await eventually(both_retired, what="both echoes retired")
        assert await journal.epoch(room) == 3  # 1 + two local advances, no echo advanced

    # A restart redelivering nothing new changes nothing.
    async with running_bot(synapse_kit.base_url, bot_user.user_id, store) as bot:
        assert bot.journal is not None
        assert await bot.journal.epoch(room) == 3
        assert await bot.journal.rooms_owing_departure_reports() == ()


async def test_kick_is_a_reported_departure_that_advances_once(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    bot_user = await make_bot_user(synapse_kit)
    room = await synapse_kit.room(alice)
    store = str(tmp_path / "journal.sqlite3")
    async with (
        running_bot(synapse_kit.base_url, bot_user.user_id, store) as bot,
        synapse_kit.client(alice) as client,
    ):
        assert bot.journal is not None
        journal = bot.journal
        await client.invite(room, bot_user.user_id)
        await wait_joined(client, room, bot_user.user_id)
        kick = Request(
            "POST",
            f"/_matrix/client/v3/rooms/{quote(room, safe='')}/kick",
            json={"user_id": bot_user.user_id},
        )
        await client.request(kick, dict)

        async def advanced() -> bool:
            return await journal.epoch(room) == 1

        await eventually(advanced, what="the kick fenced")
        assert await journal.rooms_owing_departure_reports() == ()
    async with running_bot(synapse_kit.base_url, bot_user.user_id, store) as bot:
        assert bot.journal is not None
        assert await bot.journal.epoch(room) == 1
