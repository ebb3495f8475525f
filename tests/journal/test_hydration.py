"""Hydration walks on the fake homeserver, projected into a real SQLite journal."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from gapline.journal import (
    STREAM_STATUS_KEY,
    ChunkOutcome,
    ConversationKey,
    Coverage,
    DepartureSource,
    HydrationBounds,
    HydrationFailed,
    Hydrator,
    InboundEvent,
    JournalStore,
    PrincipalJournal,
    RecursionNotHonoured,
    RefreshDebt,
    Revision,
    StopReason,
)
from gapline.journal._hydration import fetch_relation_tree, fetch_thread
from gapline.matrix import ClientEvent, MessagesResponse, RelationsResponse
from gapline.matrix.testing import FakeHomeserver
from gapline.storage import open_backend
from tests.activity import Gate

BOT = "@bot:example.org"


def never_progress(event: ClientEvent) -> bool:
    return False


def thread_reply(root: str, body: str) -> dict[str, Any]:
    return {
        "msgtype": "m.text",
        "body": body,
        "m.relates_to": {"rel_type": "m.thread", "event_id": root},
    }


def edit(target: str, body: str, **extra: Any) -> dict[str, Any]:
    return {
        "msgtype": "m.text",
        "body": f"* {body}",
        "m.new_content": {"msgtype": "m.text", "body": body, **extra},
        "m.relates_to": {"rel_type": "m.replace", "event_id": target},
    }


def thread_room(fake: FakeHomeserver, replies: int, edits_each: int) -> tuple[str, str]:
    fake.register("alice")
    fake.register("bot")
    alice = fake.user_id("alice")
    room = fake.create_room(alice, members=[BOT])
    root = fake.send_text(alice, room, "root")
    for i in range(replies):
        reply = fake.send_event(alice, room, "m.room.message", thread_reply(root, f"r{i}"))
        for j in range(edits_each):
            fake.send_event(alice, room, "m.room.message", edit(reply, f"r{i} v{j}"))
    return room, root


async def test_thread_walk_asks_dir_b_recursively_without_a_type_filter() -> None:
    fake = FakeHomeserver()
    room, root = thread_room(fake, replies=3, edits_each=1)
    async with fake.client(fake.register("bot")) as client:
        fetch = await fetch_thread(
            client, room, root, HydrationBounds(page_size=2), is_progress=never_progress
        )
    assert fetch.root.event_id == root
    assert fetch.stop is StopReason.COMPLETE
    assert len(fetch.events) == 6
    walks = [r for r in fake.requests if r.endpoint == "relations"]
    assert len(walks) == 3
    for request in walks:
        assert request.query["dir"] == "b"
        assert request.query["recurse"] == "true"
        assert request.path.rstrip("/").endswith(root.replace("$", "%24"))  # no /rel_type segment


async def test_the_window_counts_logical_messages_and_keeps_their_edit_tails() -> None:
    fake = FakeHomeserver()
    room, root = thread_room(fake, replies=5, edits_each=2)
    async with fake.client(fake.register("bot")) as client:
        fetch = await fetch_thread(
            client,
            room,
            root,
            HydrationBounds(window_messages=2, page_size=4),
            is_progress=never_progress,
        )
    assert fetch.stop is StopReason.WINDOW
    bodies = [e.content.get("m.new_content", e.content)["body"] for e in fetch.events]
    # Newest first; the window stops right after the 2nd logical message, whose edits
    # (sent after it) were already collected. The root is kept besides the window.
    assert bodies == ["r4 v1", "r4 v0", "r4", "r3 v1", "r3 v0", "r3"]
    assert fetch.root.content["body"] == "root"


async def test_the_event_ceiling_bounds_raw_events() -> None:
    fake = FakeHomeserver()
    room, root = thread_room(fake, replies=5, edits_each=3)
    async with fake.client(fake.register("bot")) as client:
        fetch = await fetch_thread(
            client,
            room,
            root,
            HydrationBounds(window_messages=50, max_fetched_events=5),
            is_progress=never_progress,
        )
    assert fetch.stop is StopReason.EVENT_CEILING
    assert len(fetch.events) == 5


class CannedRelations:
    """A relations source answering fixed pages (for the recursion_depth rule)."""

    def __init__(self, pages: list[RelationsResponse]) -> None:
        self.pages = pages

    async def relations(self, room_id: str, event_id: str, **kwargs: Any) -> RelationsResponse:
        return self.pages.pop(0)

    async def get_event(self, room_id: str, event_id: str) -> ClientEvent:
        raise AssertionError("not used")

    async def messages(self, room_id: str, **kwargs: Any) -> MessagesResponse:
        raise AssertionError("not used")


def _event(n: int) -> ClientEvent:
    return ClientEvent(
        event_id=f"$e{n}",
        type="m.room.message",
        sender="@a:x",
        origin_server_ts=n,
        content={"msgtype": "m.text", "body": str(n)},
    )


@pytest.mark.parametrize("depth", [0, 1, 3])
async def test_any_reported_depth_is_accepted_on_a_non_empty_page(depth: int) -> None:
    source = CannedRelations([RelationsResponse(chunk=[_event(1)], recursion_depth=depth)])
    events, stop, _ = await fetch_relation_tree(
        source, "!r:x", "$root", HydrationBounds(), is_progress=never_progress
    )
    assert [e.event_id for e in events] == ["$e1"] and stop is StopReason.COMPLETE


async def test_a_non_empty_page_without_depth_means_recurse_was_ignored() -> None:
    source = CannedRelations([RelationsResponse(chunk=[_event(1)])])
    with pytest.raises(RecursionNotHonoured):
        await fetch_relation_tree(
            source, "!r:x", "$root", HydrationBounds(), is_progress=never_progress
        )


async def test_an_empty_page_need_not_report_a_depth() -> None:
    source = CannedRelations([RelationsResponse(chunk=[])])
    events, stop, _ = await fetch_relation_tree(
        source, "!r:x", "$root", HydrationBounds(), is_progress=never_progress
    )
    assert events == () and stop is StopReason.COMPLETE


@pytest.fixture
async def journal(tmp_path: Path) -> AsyncIterator[PrincipalJournal]:
    backend = await open_backend(str(tmp_path / "j.sqlite3"))
    try:
        yield (await JournalStore.open(backend)).principal(BOT)
    finally:
        await backend.close()


async def test_thread_hydration_drops_own_progress_edits(journal: PrincipalJournal) -> None:
    fake = FakeHomeserver()
    room, root = thread_room(fake, replies=1, edits_each=0)
    answer = fake.send_event(BOT, room, "m.room.message", thread_reply(root, "…"))
    for status, body in (("streaming", "ec"), ("streaming", "echo"), ("complete", "echo: r0")):
        fake.send_event(
            BOT, room, "m.room.message", edit(answer, body, **{STREAM_STATUS_KEY: status})
        )
    async with fake.client(fake.register("bot")) as client:
        hydrator = Hydrator(journal, client, BOT)
        coverage = await hydrator.ensure(ConversationKey(room, root))
    assert coverage.reached_start and coverage.messages == 2
    page = await journal.read_conversation(room, root, 10)
    assert [r.body for r in page.rows] == ["r0", "echo: r0"]


class ColdTogether:
    """The journal as a hydrator sees it, except that its first ``readers`` coverage
    reads answer only once all of them were asked: those readers find the room cold
    at the same moment, so the second can only share the first one's walk."""

    def __init__(self, journal: PrincipalJournal, *, readers: int) -> None:
        self._journal = journal
        self._barrier = asyncio.Barrier(readers)
        self._first = readers

    async def epoch(self, room_id: str) -> int:
        return await self._journal.epoch(room_id)

    async def project_chunk(
        self, room_id: str, events: Sequence[InboundEvent], *, expected_epoch: int
    ) -> ChunkOutcome:
        return await self._journal.project_chunk(room_id, events, expected_epoch=expected_epoch)

    async def publish_coverage(
        self, key: ConversationKey, *, reached_start: bool, messages: int, expected_epoch: int
    ) -> bool:
        return await self._journal.publish_coverage(
            key, reached_start=reached_start, messages=messages, expected_epoch=expected_epoch
        )

    async def refresh_debt(self, room_id: str, logical_event_id: str) -> RefreshDebt | None:
        return await self._journal.refresh_debt(room_id, logical_event_id)

    async def install_refetched(
        self,
        room_id: str,
        logical_event_id: str,
        revision: Revision | None,
        *,
        expected_epoch: int,
        expected_refresh_token: str,
    ) -> bool:
        return await self._journal.install_refetched(
            room_id,
            logical_event_id,
            revision,
            expected_epoch=expected_epoch,
            expected_refresh_token=expected_refresh_token,
        )

    async def coverage(self, key: ConversationKey) -> Coverage | None:
        coverage = await self._journal.coverage(key)
        if self._first > 0:
            self._first -= 1
            await self._barrier.wait()
        return coverage


async def test_concurrent_first_readers_share_one_room_walk(journal: PrincipalJournal) -> None:
    fake = FakeHomeserver()
    fake.register("alice")
    alice = fake.user_id("alice")
    room = fake.create_room(alice, members=[BOT])
    fake.send_messages(alice, room, [f"m{i}" for i in range(30)])
    async with fake.client(fake.register("bot")) as client:
        view = ColdTogether(journal, readers=2)
        hydrator = Hydrator(view, client, BOT, room_bounds=HydrationBounds(page_size=10))
        key = ConversationKey(room)
        first, second = await asyncio.gather(hydrator.ensure(key), hydrator.ensure(key))
        walked = len([r for r in fake.requests if r.endpoint == "messages"])
        assert first == second and first.reached_start
        # Covered now: a later reader makes no request at all.
        await hydrator.ensure(key)
    assert len([r for r in fake.requests if r.endpoint == "messages"]) == walked
    assert walked == 5  # 36 events in pages of 10, then the empty page
    page = await journal.read_conversation(room, None, 100)
    assert [r.body for r in page.rows] == [f"m{i}" for i in range(30)]


async def test_an_epoch_advance_during_hydration_publishes_no_coverage(
    journal: PrincipalJournal,
) -> None:
    fake = FakeHomeserver()
    fake.register("alice")
    alice = fake.user_id("alice")
    room = fake.create_room(alice, members=[BOT])
    fake.send_messages(alice, room, [f"m{i}" for i in range(30)])
    gate = Gate(fake.transport, "messages", call=2)
    async with fake.client(fake.register("bot"), transport=gate) as client:
        hydrator = Hydrator(journal, client, BOT, room_bounds=HydrationBounds(page_size=10))
        walk = asyncio.create_task(hydrator.ensure(ConversationKey(room)))
        await gate.arrived.wait()  # the first page is projected, the second in flight
        await journal.fence_departure(room, source=DepartureSource.LOCAL)
        gate.release()
        with pytest.raises(HydrationFailed):
            await walk
    assert await journal.coverage(ConversationKey(room)) is None
