"""Hydration and the point refetch against Synapse's real /relations and /messages."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

from gapline.journal import (
    ConversationKey,
    ConversationReader,
    Hydrator,
    JournalStore,
    PointRefetcher,
    PrincipalJournal,
)
from gapline.journal._hydration import HydrationBounds, StopReason, fetch_thread
from gapline.storage import open_backend
from tests.fixtures.synapse import SynapseKit

pytestmark = pytest.mark.slow


def reply(root: str, body: str) -> dict[str, Any]:
    return {
        "msgtype": "m.text",
        "body": body,
        "m.relates_to": {"rel_type": "m.thread", "event_id": root},
    }


def edit(target: str, body: str) -> dict[str, Any]:
    return {
        "msgtype": "m.text",
        "body": f"* {body}",
        "m.new_content": {"msgtype": "m.text", "body": body},
        "m.relates_to": {"rel_type": "m.replace", "event_id": target},
    }


@pytest.fixture
async def journal_for(tmp_path: Path) -> AsyncGenerator[Any]:
    backend = await open_backend(str(tmp_path / "j.sqlite3"))
    store = await JournalStore.open(backend)
    try:
        yield store.principal
    finally:
        await backend.close()


async def test_a_cold_thread_is_hydrated_from_synapse(
    synapse_kit: SynapseKit, journal_for: Any
) -> None:
    alice = await synapse_kit.user("alice")
    reader_user = await synapse_kit.user("reader")
    room = await synapse_kit.room(alice, reader_user)
    async with synapse_kit.client(alice) as client:
        root = await client.send_text(room, "root")
        replies = []
        for i in range(4):
            replies.append(await client.send_message(room, reply(root, f"r{i}")))
            await client.send_message(room, edit(replies[-1], f"r{i} edited"))
        await client.redact(room, replies[0])
    journal: PrincipalJournal = journal_for(reader_user.user_id)
    async with synapse_kit.client(reader_user) as client:
        # Synapse serves edits before their originals (dir=b) and reports depth 3.
        fetch = await fetch_thread(
            client, room, root, HydrationBounds(window_messages=2), is_progress=lambda e: False
        )
        assert fetch.stop is StopReason.WINDOW
        assert [e.content.get("m.new_content", e.content).get("body") for e in fetch.events] == [
            "r3 edited",
            "r3",
            "r2 edited",
            "r2",
        ]
        hydrator = Hydrator(journal, client, reader_user.user_id)
        reader = ConversationReader(
            journal,
            refetcher=PointRefetcher(journal, client, reader_user.user_id),
            hydrator=hydrator,
        )
        page = await reader.read(ConversationKey(room, root), limit=10)
    assert [(r.body, r.edited) for r in page.rows] == [
        ("r1 edited", True),
        ("r2 edited", True),
        ("r3 edited", True),
    ]
    coverage = await journal.coverage(ConversationKey(room, root))
    assert coverage is not None and coverage.reached_start
    root_row = await journal.message(room, root)
    assert root_row is not None and root_row.body == "root"


async def test_a_cold_room_is_hydrated_once(synapse_kit: SynapseKit, journal_for: Any) -> None:
    alice = await synapse_kit.user("alice")
    reader_user = await synapse_kit.user("reader")
    room = await synapse_kit.room(alice, reader_user)
    bodies = [f"m{i}" for i in range(12)]
    await synapse_kit.send_messages(alice, room, bodies)
    journal: PrincipalJournal = journal_for(reader_user.user_id)
    async with synapse_kit.client(reader_user) as client:
        reader = ConversationReader(
            journal, hydrator=Hydrator(journal, client, reader_user.user_id)
        )
        page = await reader.read(ConversationKey(room), limit=5)
        assert [r.body for r in page.rows] == bodies[-5:]
        assert page.next_before is not None
        older = await reader.read(ConversationKey(room), limit=20, before=page.next_before)
    assert [r.body for r in older.rows] == bodies[:-5]
