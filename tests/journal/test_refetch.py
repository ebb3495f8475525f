"""The point refetch and strict/non-strict reads, on the fake homeserver."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gapline.journal import (
    ConversationKey,
    ConversationReader,
    EventKind,
    JournalStore,
    PointRefetcher,
    PrincipalJournal,
    Provenance,
    RefreshDebt,
    StaleConversation,
)
from gapline.journal._ingress import inbound_event
from gapline.matrix.testing import FakeHomeserver
from gapline.storage import open_backend
from tests.activity import Gate

BOT = "@bot:example.org"


def edit(target: str, body: str) -> dict[str, Any]:
    return {
        "msgtype": "m.text",
        "body": f"* {body}",
        "m.new_content": {"msgtype": "m.text", "body": body},
        "m.relates_to": {"rel_type": "m.replace", "event_id": target},
    }


@pytest.fixture
async def journal(tmp_path: Path) -> AsyncGenerator[PrincipalJournal]:
    backend = await open_backend(str(tmp_path / "j.sqlite3"))
    try:
        yield (await JournalStore.open(backend)).principal(BOT)
    finally:
        await backend.close()


class Scene:
    """A room where alice wrote one message and edited it twice, all admitted."""

    def __init__(self, fake: FakeHomeserver, journal: PrincipalJournal) -> None:
        self.fake, self.journal = fake, journal
        fake.register("alice")
        self.alice = fake.user_id("alice")
        self.room = fake.create_room(self.alice, members=[BOT])
        self.original = fake.send_text(self.alice, self.room, "v0")
        self.edit1 = fake.send_event(
            self.alice, self.room, "m.room.message", edit(self.original, "v1")
        )
        self.edit2 = fake.send_event(
            self.alice, self.room, "m.room.message", edit(self.original, "v2")
        )
        self.admitted: set[str] = set()

    async def admit_new(self) -> None:
        """Admit every event of the room not admitted yet, as sync would deliver them."""
        epoch = await self.journal.epoch(self.room)
        for event in self.fake.events(self.room):
            if event.event_id in self.admitted:
                continue
            self.admitted.add(event.event_id)
            kind = (
                EventKind.REDACTION if event.type == "m.room.redaction" else EventKind.CONTEXT_ONLY
            )
            await self.journal.admit(
                inbound_event(self.room, event, kind=kind, provenance=Provenance.LIVE), epoch=epoch
            )

    async def body(self) -> str | None:
        row = await self.journal.message(self.room, self.original)
        return None if row is None else row.body


async def damaged_scene(journal: PrincipalJournal) -> Scene:
    scene = Scene(FakeHomeserver(), journal)
    await scene.admit_new()
    assert await scene.body() == "v2"
    scene.fake.redact(scene.alice, scene.room, scene.edit2)  # the visible revision
    await scene.admit_new()
    assert await journal.refresh_debt(scene.room, scene.original) is not None
    return scene


@dataclass
class CountingRefetcher(PointRefetcher):
    """A refetcher that signals once ``expected`` callers wait on its refetches."""

    expected: int = 1
    callers: int = 0
    all_waiting: asyncio.Event = field(default_factory=asyncio.Event)

    async def refetch(self, debt: RefreshDebt) -> bool:
        self.callers += 1
        if self.callers >= self.expected:
            self.all_waiting.set()
        # Joining the shared task happens before the first await below, so every
        # counted caller already waits on it when the signal is seen.
        return await super().refetch(debt)


def requests(fake: FakeHomeserver, endpoint: str) -> int:
    return len([r for r in fake.requests if r.endpoint == endpoint])


async def test_non_strict_read_omits_the_damaged_row_and_never_asks(
    journal: PrincipalJournal,
) -> None:
    scene = await damaged_scene(journal)
    async with scene.fake.client(scene.fake.register("bot")) as client:
        reader = ConversationReader(journal, refetcher=PointRefetcher(journal, client, BOT))
        page = await reader.read(ConversationKey(scene.room), limit=10)
    assert scene.original not in [r.event_id for r in page.rows]
    assert requests(scene.fake, "event") == requests(scene.fake, "relations") == 0


async def test_concurrent_strict_reads_share_one_refetch_and_get_the_server_revision(
    journal: PrincipalJournal,
) -> None:
    scene = await damaged_scene(journal)
    # The server's answer is held until all three readers wait on the refetch.
    gate = Gate(scene.fake.transport, "event")
    async with scene.fake.client(scene.fake.register("bot"), transport=gate) as client:
        refetcher = CountingRefetcher(journal, client, BOT, expected=3)
        reader = ConversationReader(journal, refetcher=refetcher)

        async def release_once_all_wait() -> None:
            await refetcher.all_waiting.wait()
            gate.release()

        pages, _ = await asyncio.gather(
            asyncio.gather(
                *(reader.read(ConversationKey(scene.room), limit=10, strict=True) for _ in range(3))
            ),
            release_once_all_wait(),
        )
    assert requests(scene.fake, "event") == 1
    for page in pages:
        (row,) = [r for r in page.rows if r.event_id == scene.original]
        assert row.body == "v1" and row.revision_event_id == scene.edit1
    assert await journal.refresh_debt(scene.room, scene.original) is None


async def test_a_failed_refetch_fails_closed_and_the_next_strict_read_retries(
    journal: PrincipalJournal,
) -> None:
    scene = await damaged_scene(journal)
    scene.fake.fail("event", status=403, errcode="M_FORBIDDEN", times=1)
    async with scene.fake.client(scene.fake.register("bot")) as client:
        reader = ConversationReader(journal, refetcher=PointRefetcher(journal, client, BOT))
        with pytest.raises(StaleConversation) as failure:
            await reader.read(ConversationKey(scene.room), limit=10, strict=True)
        assert failure.value.event_ids == (scene.original,)
        assert await journal.refresh_debt(scene.room, scene.original) is not None
        page = await reader.read(ConversationKey(scene.room), limit=10, strict=True)
    assert [r.body for r in page.rows if r.event_id == scene.original] == ["v1"]


async def test_a_cancelled_refetch_leaves_the_token(journal: PrincipalJournal) -> None:
    scene = await damaged_scene(journal)
    gate = Gate(scene.fake.transport, "event")  # never released: the server never answers
    async with scene.fake.client(scene.fake.register("bot"), transport=gate) as client:
        refetcher = PointRefetcher(journal, client, BOT)
        reader = ConversationReader(journal, refetcher=refetcher)
        read = asyncio.create_task(reader.read(ConversationKey(scene.room), limit=10, strict=True))
        await gate.arrived.wait()  # the refetch is in flight
        read.cancel()
        await refetcher.aclose()
        with pytest.raises(asyncio.CancelledError):
            await read
    assert await journal.refresh_debt(scene.room, scene.original) is not None


async def test_a_newer_edit_wins_over_an_in_flight_refetch(journal: PrincipalJournal) -> None:
    scene = await damaged_scene(journal)
    gate = Gate(scene.fake.transport, "event")
    async with scene.fake.client(scene.fake.register("bot"), transport=gate) as client:
        reader = ConversationReader(journal, refetcher=PointRefetcher(journal, client, BOT))
        read = asyncio.create_task(reader.read(ConversationKey(scene.room), limit=10, strict=True))
        await gate.arrived.wait()  # the refetch asked the server, which has not answered
        scene.fake.send_event(scene.alice, scene.room, "m.room.message", edit(scene.original, "v3"))
        await scene.admit_new()
        gate.release()
        page = await read
    assert [r.body for r in page.rows if r.event_id == scene.original] == ["v3"]


async def test_a_redacted_original_found_by_the_refetch_removes_the_message(
    journal: PrincipalJournal,
) -> None:
    scene = await damaged_scene(journal)
    # The server redacted the original too, but this journal has not seen that yet.
    scene.fake.redact(scene.alice, scene.room, scene.original)
    async with scene.fake.client(scene.fake.register("bot")) as client:
        reader = ConversationReader(journal, refetcher=PointRefetcher(journal, client, BOT))
        page = await reader.read(ConversationKey(scene.room), limit=10, strict=True)
    assert scene.original not in [r.event_id for r in page.rows]
    assert not page.owing_refresh


async def test_without_a_homeserver_strict_reads_fail_closed(journal: PrincipalJournal) -> None:
    scene = await damaged_scene(journal)
    with pytest.raises(StaleConversation):
        await ConversationReader(journal).read(ConversationKey(scene.room), limit=10, strict=True)
