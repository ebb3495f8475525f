"""The echo bot against a real Synapse: answers, streaming, projection, strict reads."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

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

    # `gapline journal read`: every answer at its final body, no progress edit ever visible.
    async def projected() -> list[dict[str, Any]] | None:
        rows = await journal_read_cli(store, bot.user_id, room)
        mine = [r for r in rows if r["sender"] == bot.user_id]
        done = len(mine) == 50 and all(str(r["body"]).startswith("echo: message") for r in mine)
        return rows if done else None

    rows = await eventually(projected, what="answers projected at their final body")
    assert [r["body"] for r in rows if r["sender"] == alice.user_id] == bodies
    mine = [r for r in rows if r["sender"] == bot.user_id]
    assert sorted(r["body"] for r in mine) == sorted(f"echo: {b}" for b in bodies)
    assert all(r["edited"] for r in mine)
    assert not any("…" in str(r["body"]) for r in rows)


async def journal_read_cli(store: str, principal: str, room: str) -> list[dict[str, Any]]:
    process = await asyncio.create_subprocess_exec(
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
        "200",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return [json.loads(line) for line in out.decode().splitlines()]


async def test_a_long_answer_travels_as_a_sidecar_through_synapse_media(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    alice = await synapse_kit.user("alice")
    bot = await make_bot_user(synapse_kit)
    store = str(tmp_path / "journal.sqlite3")
    room = await synapse_kit.room(alice)
    body = "a long line of text " * 20
    async with (
        running_bot(synapse_kit.base_url, bot.user_id, store, sidecar_limit=100) as running,
        synapse_kit.client(alice) as client,
    ):
        assert running.journal is not None
        journal = running.journal
        await client.invite(room, bot.user_id)
        await wait_joined(client, room, bot.user_id)
        (source,) = await synapse_kit.send_messages(alice, room, [body])

        async def projected() -> bool:
            turn = await journal.turn(source)
            if turn is None or turn.final_event_id is None or turn.initial_event_id is None:
                return False
            row = await journal.message(room, turn.initial_event_id)
            return row is not None and row.body == f"echo: {body}"

        await eventually(projected, what="the full text resolved from the sidecar")
        events = await room_events(client, room)
    (final,) = [
        e
        for e in events
        if e.sender == bot.user_id
        and e.content.get("m.new_content", {}).get("io.gapline.stream_status") == "complete"
    ]
    visible = final.content["m.new_content"]
    assert visible["body"] != f"echo: {body}"  # what other clients show: the preview
    assert visible["io.gapline.sidecar"]["url"].startswith("mxc://")


async def test_a_burst_of_20_in_one_room_is_answered_in_order(
    synapse_kit: SynapseKit, tmp_path: Path
) -> None:
    """One turn per room at a time, in receipt order: each answer (its placeholder and its
    final edit) reaches the room before the next message's, and every later turn's
    conversation holds the earlier answers."""
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
        bodies = [f"in order {i}" for i in range(20)]
        sources = await synapse_kit.send_messages(alice, room, bodies)

        async def all_delivered() -> bool:
            return delivered(await turn_states(store, bot.user_id, sources))

        await eventually(all_delivered, within=120, what="20 delivered turns")
        events = await room_events(client, room)
    position = {e.event_id: i for i, e in enumerate(events)}
    answers = answers_by_source(events, bot.user_id)
    placeholders = [position[answers[s][0].reply_event_id] for s in sources]
    assert placeholders == sorted(placeholders)
    finals = [
        max(
            i
            for i, e in enumerate(events)
            if e.sender == bot.user_id
            and e.content.get("m.relates_to", {}).get("event_id") == answers[s][0].reply_event_id
            and e.content.get("m.new_content", {}).get("io.gapline.stream_status") == "complete"
        )
        for s in sources
    ]
    assert finals == sorted(finals)
    # Each answer was final before the next message's placeholder was sent.
    assert all(final < nxt for final, nxt in zip(finals, placeholders[1:], strict=False))
    assert [answers[s][0].final_body for s in sources] == [f"echo: {b}" for b in bodies]
