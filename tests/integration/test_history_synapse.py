"""The history engine against a real Synapse: opening, the recent load, restarts, the
limited-sync holes, fills (Ready, Budget, AccessibleStart, Unavailable), RoomBusy, Cancel.

The server's own ``/messages`` walk is the truth every timeline is compared with.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import msgspec
import pytest

from gapline.history import (
    Cancel,
    Continuity,
    EngineConfig,
    EventNotFound,
    FillGap,
    GapLifecycle,
    HistoryRepair,
    Interrupted,
    Ok,
    OpenRoom,
    PaginateBackwards,
    RecentHistoryKind,
    RepairPhase,
    RepairStop,
    RetryRecent,
    RoomBusy,
    TimelineReset,
)
from gapline.matrix import MatrixClient, SyncResponse
from tests.history.test_engine_support import (
    NO_RETRY,
    HoldingTransport,
    assert_mirror_matches,
    event_ids,
    gap_rows,
    open_engine,
)

pytestmark = pytest.mark.synapse


class Traffic(httpx.AsyncBaseTransport):
    """A real HTTP transport that counts completed requests and can hold one in flight."""

    def __init__(self) -> None:
        self.inner = HoldingTransport(httpx.AsyncHTTPTransport())
        self.hold = self.inner.hold
        self.completed: list[str] = []
        self.messages_started = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/messages"):
            self.messages_started += 1
        response = await self.inner.handle_async_request(request)
        body = await response.aread()
        self.completed.append(request.url.path)
        return httpx.Response(response.status_code, headers=response.headers, content=body)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def server_history(client: MatrixClient, room_id: str) -> list[str]:
    """Every event id of the room, oldest first, as Synapse's ``/messages`` orders them."""
    ids: list[str] = []
    token = None
    while True:
        page = await client.messages(room_id, from_=token, dir="b", limit=100)
        ids.extend(e.event_id for e in page.chunk)
        if page.end is None:
            return ids[::-1]
        token = page.end


async def retain_all(store: Path, client: MatrixClient) -> None:
    async with open_engine(store, client, sync_timeline_limit=500) as h:
        await h.engine.sync_once()


async def settle(h, room: str) -> None:
    assert await h.engine.execute(OpenRoom(room)) == Ok()
    await h.engine.execute(HistoryRepair(RetryRecent(room)))


async def test_reopen_after_300_messages_leaves_one_gap_that_survives_restart(
    tmp_path, synapse_kit
):
    alice = await synapse_kit.user("alice")
    room = await synapse_kit.room(alice, name="history")
    await synapse_kit.send_messages(alice, room, [f"old {i}" for i in range(50)])
    async with synapse_kit.client(alice, retry=NO_RETRY) as client:
        await retain_all(tmp_path, client)
    await synapse_kit.send_messages(alice, room, [f"new {i}" for i in range(300)])
    traffic = Traffic()
    at_reset: list[int] = []
    async with synapse_kit.client(alice, retry=NO_RETRY, transport=traffic) as client:
        truth = await server_history(client, room)
        traffic.completed.clear()
        async with open_engine(tmp_path, client) as h:
            h.recorder.hook = lambda e: (
                at_reset.append(len(traffic.completed)) if isinstance(e, TimelineReset) else None
            )
            await settle(h, room)
            reset = next(e for e in h.recorder.events if isinstance(e, TimelineReset))
            items = h.engine.timeline(room).state.items
            assert h.recorder.recent(room) == [RecentHistoryKind.Loading, RecentHistoryKind.Loaded]
            gaps = gap_rows(items)
            assert len(gaps) == 1
            assert gaps[0].older_boundary == truth[-301]
            assert gaps[0].newer_boundary == truth[-200]
            ids = event_ids(items)
            assert ids[-200:] == truth[-200:]
            assert ids[:-200] == truth[-300 - (len(ids) - 200) : -300]
            assert_mirror_matches(h, room)
            gap_id = gaps[0].id
    assert at_reset == [0]  # the reset was out before any request completed
    assert event_ids(reset.items) == truth[-300 - len(event_ids(reset.items)) : -300]
    async with (
        synapse_kit.client(alice, retry=NO_RETRY) as client,
        open_engine(tmp_path, client) as h,
    ):
        middle = [g for g in await h.engine.store.all_gaps(room) if not g.is_top]
        assert [g.gap_id for g in middle] == [gap_id]
        await h.engine.execute(OpenRoom(room))
        await h.engine.execute(HistoryRepair(Cancel(room)))
        await h.engine.execute(PaginateBackwards(room, 150))
        assert [g.id for g in gap_rows(h.engine.timeline(room).state.items)] == [gap_id]
        # Filling it takes two FillGaps (100 missing, well within 4 pages each).
        assert await h.engine.execute(HistoryRepair(FillGap(room, gap_id))) == Ok()
        report = h.recorder.reports()[-1]
        assert report.phase is RepairPhase.Ready and report.events == 100
        await h.engine.execute(PaginateBackwards(room, 500))
        assert event_ids(h.engine.timeline(room).state.items) == truth


async def test_fewer_new_messages_than_one_recent_load_join_without_gap(tmp_path, synapse_kit):
    alice = await synapse_kit.user("alice")
    room = await synapse_kit.room(alice, name="history")
    await synapse_kit.send_messages(alice, room, [f"old {i}" for i in range(40)])
    async with synapse_kit.client(alice, retry=NO_RETRY) as client:
        await retain_all(tmp_path, client)
        await synapse_kit.send_messages(alice, room, [f"new {i}" for i in range(30)])
        truth = await server_history(client, room)
        async with open_engine(tmp_path, client) as h:
            await settle(h, room)
            items = h.engine.timeline(room).state.items
            assert gap_rows(items) == []
            assert event_ids(items) == truth
            assert_mirror_matches(h, room)


async def test_limited_sync_holes_regressions(tmp_path, synapse_kit):
    """Hole 1: a limited sync for a room with no events in memory (never seen, or retained
    but not open) records a history gap carrying prev_batch. Hole 2: no prev_batch dropped."""
    alice = await synapse_kit.user("alice")
    room = await synapse_kit.room(alice, name="history")
    await synapse_kit.send_messages(alice, room, [f"m {i}" for i in range(30)])
    async with (
        synapse_kit.client(alice, retry=NO_RETRY) as client,
        open_engine(tmp_path, client, sync_timeline_limit=5) as h,
    ):
        first = await h.engine.sync_once()
        timeline = first.rooms.join[room].timeline
        assert timeline.limited and timeline.prev_batch
        [top] = await h.engine.store.all_gaps(room)
        assert top.is_top and top.cursor == timeline.prev_batch
        newest = timeline.events[-1].event_id
        await synapse_kit.send_messages(alice, room, [f"n {i}" for i in range(20)])
        second = await h.engine.sync_once()
        timeline = second.rooms.join[room].timeline
        assert timeline.limited
        middle = [g for g in await h.engine.store.all_gaps(room) if not g.is_top]
        assert len(middle) == 1
        assert middle[0].cursor == timeline.prev_batch
        assert middle[0].older_boundary == newest
        assert middle[0].newer_boundary == timeline.events[0].event_id
        # The recorded cursor really walks the hidden interval: fill it and compare.
        await h.engine.execute(OpenRoom(room))
        await h.engine.execute(HistoryRepair(Cancel(room)))
        assert await h.engine.execute(HistoryRepair(FillGap(room, middle[0].gap_id))) == Ok()
        assert h.recorder.reports()[-1].continuity is Continuity.Verified
        truth = await server_history(client, room)
        assert event_ids(h.engine.timeline(room).state.items) == truth[-25:]


async def make_gap(h, synapse_kit, alice, room: str, missing: int) -> str:
    await synapse_kit.send_messages(alice, room, [f"g {i}" for i in range(missing + 10)])
    await h.engine.sync_once()
    [gap] = gap_rows(h.engine.timeline(room).state.items)
    return gap.id


async def test_fill_gap_of_100_ready_verified_equals_server(tmp_path, synapse_kit):
    alice = await synapse_kit.user("alice")
    room = await synapse_kit.room(alice, name="history")
    async with synapse_kit.client(alice, retry=NO_RETRY) as client:
        await retain_all(tmp_path, client)
        async with open_engine(tmp_path, client) as h:
            await settle(h, room)
            gap_id = await make_gap(h, synapse_kit, alice, room, 100)
            assert await h.engine.execute(HistoryRepair(FillGap(room, gap_id))) == Ok()
            bridging, settled = h.recorder.reports()
            assert bridging.phase is RepairPhase.Bridging and bridging.pages == 0
            assert settled.phase is RepairPhase.Ready
            assert settled.continuity is Continuity.Verified
            assert settled.pages in (2, 3) and settled.events == 100
            items = h.engine.timeline(room).state.items
            assert gap_rows(items) == []
            assert event_ids(items) == await server_history(client, room)
            assert_mirror_matches(h, room)
            assert await h.engine.execute(HistoryRepair(FillGap(room, gap_id))) == EventNotFound()


@pytest.mark.slow
async def test_fill_gap_of_500_pauses_on_budget_then_continues(tmp_path, synapse_kit):
    alice = await synapse_kit.user("alice")
    room = await synapse_kit.room(alice, name="history")
    async with synapse_kit.client(alice, retry=NO_RETRY) as client:
        await retain_all(tmp_path, client)
        async with open_engine(tmp_path, client) as h:
            await settle(h, room)
            gap_id = await make_gap(h, synapse_kit, alice, room, 500)
            assert await h.engine.execute(HistoryRepair(FillGap(room, gap_id))) == Ok()
            first = h.recorder.reports()[-1]
            assert (first.phase, first.stop, first.pages, first.events) == (
                RepairPhase.Paused,
                RepairStop.Budget,
                4,
                200,
            )
            [row] = gap_rows(h.engine.timeline(room).state.items)
            assert (row.id, row.lifecycle) == (gap_id, GapLifecycle.Paused)
            assert await h.engine.execute(HistoryRepair(FillGap(room, gap_id))) == Ok()
            second = h.recorder.reports()[-1]
            assert (second.stop, second.events) == (RepairStop.Budget, 200)
            assert await h.engine.execute(HistoryRepair(FillGap(room, gap_id))) == Ok()
            assert h.recorder.reports()[-1].phase is RepairPhase.Ready
            assert event_ids(h.engine.timeline(room).state.items) == await server_history(
                client, room
            )


async def test_gap_reaching_room_creation_is_unavailable_and_refills_at_once(tmp_path, synapse_kit):
    alice = await synapse_kit.user("alice")
    room = await synapse_kit.room(alice, name="history")
    await synapse_kit.send_messages(alice, room, [f"m {i}" for i in range(30)])
    traffic = Traffic()
    async with (
        synapse_kit.client(alice, retry=NO_RETRY, transport=traffic) as client,
        open_engine(tmp_path, client) as h,
    ):
        # An older section Synapse will never serve: the walk must end at m.room.create.
        ghost = {
            "event_id": "$ghost",
            "type": "m.room.message",
            "sender": alice.user_id,
            "origin_server_ts": 1,
            "content": {"body": "ghost"},
        }
        await h.engine.ingest(
            msgspec.convert(
                {
                    "next_batch": "x",
                    "rooms": {"join": {room: {"timeline": {"events": [ghost]}}}},
                },
                SyncResponse,
            )
        )
        response = await h.engine.sync_once(initial=True)
        assert response.rooms.join[room].timeline.limited
        await h.engine.execute(OpenRoom(room))
        await h.engine.execute(HistoryRepair(Cancel(room)))
        [gap] = gap_rows(h.engine.timeline(room).state.items)
        assert await h.engine.execute(HistoryRepair(FillGap(room, gap.id))) == Ok()
        settled = h.recorder.reports()[-1]
        assert settled.phase is RepairPhase.Paused
        assert settled.stop is RepairStop.HistoryUnavailable
        assert settled.continuity is Continuity.AccessibleStart
        [row] = gap_rows(h.engine.timeline(room).state.items)
        assert row.lifecycle is GapLifecycle.Unavailable
        truth = await server_history(client, room)
        assert event_ids(h.engine.timeline(room).state.items) == ["$ghost", *truth]
        started = traffic.messages_started
        assert await h.engine.execute(HistoryRepair(FillGap(room, gap.id))) == Ok()
        again = h.recorder.reports()[-1]
        assert (again.pages, again.events, again.stop) == (0, 0, RepairStop.HistoryUnavailable)
        assert traffic.messages_started == started


async def test_room_busy_and_cancel_during_fill_keeps_pages_across_restart(tmp_path, synapse_kit):
    alice = await synapse_kit.user("alice")
    room = await synapse_kit.room(alice, name="history")
    traffic = Traffic()
    async with synapse_kit.client(alice, retry=NO_RETRY, transport=traffic) as client:
        await retain_all(tmp_path, client)
        async with open_engine(tmp_path, client) as h:
            await settle(h, room)
            gap_id = await make_gap(h, synapse_kit, alice, room, 300)
            # Overlaps with a running recent load, held on its first page.
            first_page = traffic.hold("/messages")
            recent = asyncio.create_task(h.engine.execute(HistoryRepair(RetryRecent(room))))
            await first_page.arrived.wait()
            assert await h.engine.execute(HistoryRepair(FillGap(room, gap_id))) == RoomBusy()
            assert await h.engine.execute(PaginateBackwards(room)) == RoomBusy()
            # Released, the load goes on only once this task yields: the retry joins it.
            first_page.release()
            assert await h.engine.execute(HistoryRepair(RetryRecent(room))) == await recent
            [gap] = gap_rows(h.engine.timeline(room).state.items)
            # Overlaps with a running fill, then Cancel it after its first page: the
            # second page, asked for while the first commits, is held for good.
            second_page = traffic.hold("/messages", on_call=2)
            fill = asyncio.create_task(h.engine.execute(HistoryRepair(FillGap(room, gap.id))))
            await second_page.arrived.wait()
            assert await h.engine.execute(HistoryRepair(RetryRecent(room))) == RoomBusy()
            assert await h.engine.execute(HistoryRepair(FillGap(room, gap.id))) == RoomBusy()
            assert await h.engine.execute(HistoryRepair(Cancel(room))) == Ok()
            assert await fill == Interrupted()
            report = h.recorder.reports()[-1]
            assert (report.stop, report.pages) == (RepairStop.Cancelled, 1)
            kept = event_ids(h.engine.timeline(room).state.items)
            assert_mirror_matches(h, room)
    async with (
        synapse_kit.client(alice, retry=NO_RETRY) as client,
        open_engine(tmp_path, client) as h,
    ):
        stored = [e.event_id for e in await h.engine.store.all_events(room)]
        assert set(kept) <= set(stored)
        [row] = [g for g in await h.engine.store.all_gaps(room) if not g.is_top]
        assert (row.gap_id, row.lifecycle) == (gap.id, GapLifecycle.Paused)


@pytest.mark.parametrize(("sync_limit", "fresh_older"), [(5, 0), (10, 5)])
async def test_sync_after_recent_load_keeps_prev_batch_and_order(
    tmp_path, synapse_kit, sync_limit, fresh_older
):
    """Regression for the second hole: the recent load already holds the newest events,
    so the first (limited) sync brings only duplicates, or older events followed by
    duplicates. No prev_batch is dropped, and older events go before the shared ones."""
    alice = await synapse_kit.user("alice")
    room = await synapse_kit.room(alice, name="history")
    await synapse_kit.send_messages(alice, room, [f"m {i}" for i in range(80)])
    config = EngineConfig(page_size=5, recent_pages=1)
    async with (
        synapse_kit.client(alice, retry=NO_RETRY) as client,
        open_engine(tmp_path, client, config=config, sync_timeline_limit=sync_limit) as h,
    ):
        truth = await server_history(client, room)
        await settle(h, room)
        assert event_ids(h.engine.timeline(room).state.items) == truth[-5:]
        response = await h.engine.sync_once()
        timeline = response.rooms.join[room].timeline
        assert timeline.limited and timeline.prev_batch
        stored = [e.event_id for e in await h.engine.store.all_events(room)]
        assert stored == truth[-5 - fresh_older :]
        [top] = await h.engine.store.all_gaps(room)
        assert top.is_top and top.newer_boundary == stored[0] and top.cursor
        if fresh_older:
            assert top.cursor == timeline.prev_batch
        # The kept cursor walks back from exactly the oldest retained event.
        assert await h.engine.execute(PaginateBackwards(room, 30)) == Ok()
        ids = event_ids(h.engine.timeline(room).state.items)
        assert ids == truth[-len(ids) :] and len(ids) == len(stored) + 30
        assert_mirror_matches(h, room)
