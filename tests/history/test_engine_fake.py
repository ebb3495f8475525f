"""The engine against the in-memory fake homeserver: opening, recent loads, fills,
one operation per room, cancellation, faults, and the limited-sync holes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from gapline.history import Cancel as CancelCmd
from gapline.history import (
    CloseRoom,
    Continuity,
    EventItem,
    EventNotFound,
    Failed,
    FillGap,
    GapLifecycle,
    HistoryRepair,
    Interrupted,
    Invalid,
    Ok,
    OpenRoom,
    PaginateBackwards,
    RecentHistoryKind,
    RepairPhase,
    RepairStop,
    RetryRecent,
    RoomBusy,
    RoomNotOpen,
    SendMessage,
    Shutdown,
    TimelineReset,
)
from gapline.history._cache_store import CacheStore
from gapline.matrix import SyncResponse
from gapline.matrix.testing import FakeHomeserver
from gapline.storage import KdfParams, WrongPassphrase, open_backend, open_cipher
from tests.history.test_engine_support import (
    NO_RETRY,
    PASSPHRASE,
    HoldingTransport,
    assert_mirror_matches,
    event_ids,
    gap_rows,
    no_sleep,
    open_engine,
)


def client_for(fake: FakeHomeserver, session, **kwargs):
    return fake.client(session, retry=NO_RETRY, sleep=no_sleep, **kwargs)


@pytest.fixture
def held(fake: FakeHomeserver) -> HoldingTransport:
    """The fake's transport behind one that can hold a request in flight."""
    return HoldingTransport(fake.transport)


async def retain_all(store: Path, fake: FakeHomeserver, session, room: str) -> None:
    """One sync large enough to retain every event of the room."""
    async with (
        client_for(fake, session) as client,
        open_engine(store, client, sync_timeline_limit=5000) as h,
    ):
        await h.engine.sync_once()


def messages_requests(fake: FakeHomeserver) -> int:
    return sum(1 for r in fake.requests if r.endpoint == "messages")


async def open_settled(h, room: str) -> None:
    """OpenRoom and wait for its recent load (RetryRecent joins a running one)."""
    assert await h.engine.execute(OpenRoom(room)) == Ok()
    await h.engine.execute(HistoryRepair(RetryRecent(room)))


# -- opening ------------------------------------------------------------------------------


async def test_open_publishes_retained_items_before_any_request(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    fake.send_messages(alice.user_id, room, [f"m{i}" for i in range(150)])
    await retain_all(tmp_path, fake, alice, room)
    fake.send_messages(alice.user_id, room, [f"n{i}" for i in range(300)])
    seen_at_reset: list[int] = []
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        before = len(fake.requests)
        h.recorder.hook = lambda e: (
            seen_at_reset.append(len(fake.requests)) if isinstance(e, TimelineReset) else None
        )
        await open_settled(h, room)
        reset = next(e for e in h.recorder.events if isinstance(e, TimelineReset))
    assert seen_at_reset == [before]  # nothing touched the network before the reset
    assert len(reset.items) >= 100
    assert event_ids(reset.items) == fake.event_ids(room)[-len(event_ids(reset.items)) - 300 : -300]


async def test_recent_load_leaves_one_gap_between_fresh_window_and_retained(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    fake.send_messages(alice.user_id, room, [f"m{i}" for i in range(50)])
    await retain_all(tmp_path, fake, alice, room)
    retained_newest = fake.event_ids(room)[-1]
    fake.send_messages(alice.user_id, room, [f"n{i}" for i in range(300)])
    server = fake.event_ids(room)
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        await open_settled(h, room)
        items = h.engine.timeline(room).state.items
        assert h.recorder.recent(room) == [RecentHistoryKind.Loading, RecentHistoryKind.Loaded]
        gaps = gap_rows(items)
        assert len(gaps) == 1
        assert gaps[0].older_boundary == retained_newest
        assert gaps[0].newer_boundary == server[-200]
        ids = event_ids(items)
        assert ids[-200:] == server[-200:]
        assert ids[:-200] == server[: len(ids) - 200]
        assert items.index(gaps[0]) == len(ids) - 200  # between the sections it separates
        assert_mirror_matches(h, room)
        gap_id = gaps[0].id
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        middle = [g for g in await h.engine.store.all_gaps(room) if not g.is_top]
        assert [g.gap_id for g in middle] == [gap_id]
        await h.engine.execute(OpenRoom(room))
        await h.engine.execute(HistoryRepair(CancelCmd(room)))
        # Scrolling back past the fresh window shows the same row again.
        await h.engine.execute(PaginateBackwards(room, 150))
        assert [g.id for g in gap_rows(h.engine.timeline(room).state.items)] == [gap_id]
        assert_mirror_matches(h, room)


async def test_recent_load_joins_when_fewer_new_than_one_load(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    fake.send_messages(alice.user_id, room, [f"m{i}" for i in range(60)])
    await retain_all(tmp_path, fake, alice, room)
    fake.send_messages(alice.user_id, room, [f"n{i}" for i in range(30)])
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        await open_settled(h, room)
        items = h.engine.timeline(room).state.items
        assert gap_rows(items) == []
        ids = event_ids(items)
        assert ids == fake.event_ids(room)[-len(ids) :]
        assert len(ids) == len(set(ids))
        assert_mirror_matches(h, room)


async def test_failed_recent_load_is_reported_and_stays_until_retry(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    fake.send_messages(alice.user_id, room, [f"m{i}" for i in range(20)])
    fake.fail("messages", status=502, times=None)
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        await h.engine.execute(OpenRoom(room))
        answer = await h.engine.execute(HistoryRepair(RetryRecent(room)))
        assert isinstance(answer, Failed)  # joined the failing load
        state = h.mirror.state.recent(room)
        assert state.kind is RecentHistoryKind.Failed and "502" in (state.message or "")
        fake.clear_faults()
        assert await h.engine.execute(HistoryRepair(RetryRecent(room))) == Ok()
        assert h.mirror.state.recent(room).kind is RecentHistoryKind.Loaded
        ids = event_ids(h.engine.timeline(room).state.items)
        assert ids == fake.event_ids(room)
        assert await h.engine.execute(CloseRoom(room)) == Ok()
        assert h.recorder.recent(room)[-1] is RecentHistoryKind.Idle
        assert h.mirror.state.recent(room).kind is RecentHistoryKind.Idle


async def test_failed_recent_load_on_empty_room_falls_back_to_initial_history(
    tmp_path, fake, alice
):
    room = fake.create_room(alice.user_id, name="r")
    fake.send_messages(alice.user_id, room, [f"m{i}" for i in range(40)])
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        fake.fail("messages", status=500, on_call=1, times=1)
        await h.engine.execute(OpenRoom(room))
        answer = await h.engine.execute(HistoryRepair(RetryRecent(room)))
        assert isinstance(answer, Failed)
        ids = event_ids(h.engine.timeline(room).state.items)
        assert ids == fake.event_ids(room)[-h.engine.config.initial_history_limit :]
        assert h.mirror.state.recent(room).kind is RecentHistoryKind.Failed


# -- limited syncs: the reference implementation's known holes ------------------------------


async def test_limited_sync_for_never_seen_room_keeps_prev_batch(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    fake.send_messages(alice.user_id, room, [f"m{i}" for i in range(40)])
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        response = await h.engine.sync_once()
        timeline = response.rooms.join[room].timeline
        assert timeline.limited and timeline.prev_batch
        gaps = await h.engine.store.all_gaps(room)
        assert [(g.is_top, g.cursor) for g in gaps] == [(True, timeline.prev_batch)]
        # ... and paginating the top from it reaches exactly the events before.
        await h.engine.execute(OpenRoom(room))
        await h.engine.execute(HistoryRepair(RetryRecent(room)))
        await h.engine.execute(PaginateBackwards(room, 50))
        assert event_ids(h.engine.timeline(room).state.items) == fake.event_ids(room)[-60:]


async def test_limited_sync_for_room_with_no_events_in_memory_records_history_gap(
    tmp_path, fake, alice
):
    room = fake.create_room(alice.user_id, name="r")
    fake.send_messages(alice.user_id, room, [f"m{i}" for i in range(30)])
    await retain_all(tmp_path, fake, alice, room)
    retained_newest = fake.event_ids(room)[-1]
    fake.send_messages(alice.user_id, room, [f"n{i}" for i in range(50)])
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        # The room is not open: nothing of it is in memory.
        response = await h.engine.sync_once()
        timeline = response.rooms.join[room].timeline
        assert timeline.limited
        middle = [g for g in await h.engine.store.all_gaps(room) if not g.is_top]
        assert len(middle) == 1
        assert middle[0].cursor == timeline.prev_batch
        assert middle[0].older_boundary == retained_newest
        assert middle[0].newer_boundary == timeline.events[0].event_id


async def test_limited_sync_of_only_duplicates_does_not_drop_prev_batch(tmp_path):
    def sync(events: list[str], *, limited: bool, prev_batch: str | None, token: str):
        return msgspec.convert(
            {
                "next_batch": token,
                "rooms": {
                    "join": {
                        "!r:x": {
                            "timeline": {
                                "events": [
                                    {
                                        "event_id": e,
                                        "type": "m.room.message",
                                        "sender": "@a:x",
                                        "origin_server_ts": 1,
                                        "content": {"body": e},
                                    }
                                    for e in events
                                ],
                                "limited": limited,
                                "prev_batch": prev_batch,
                            }
                        }
                    }
                },
            },
            SyncResponse,
        )

    async with open_engine(tmp_path, None) as h:
        await h.engine.ingest(sync(["$a", "$b"], limited=False, prev_batch=None, token="s1"))
        [top] = await h.engine.store.all_gaps("!r:x")
        assert top.cursor is None
        await h.engine.ingest(sync(["$a", "$b"], limited=True, prev_batch="t-keep", token="s2"))
        [top] = await h.engine.store.all_gaps("!r:x")
        assert top.cursor == "t-keep"
        assert await h.engine.store.sync_token() == "s2"
        assert [e.event_id for e in await h.engine.store.all_events("!r:x")] == ["$a", "$b"]


# -- filling gaps -------------------------------------------------------------------------


async def make_gap(h, fake, alice, room: str, missing: int) -> str:
    """With the room open and settled, send ``missing + 10`` messages; a limited sync
    (limit 10) leaves a gap of ``missing`` events. Returns its id."""
    fake.send_messages(alice.user_id, room, [f"g{i}" for i in range(missing + 10)])
    await h.engine.sync_once()
    [gap] = gap_rows(h.engine.timeline(room).state.items)
    return gap.id


async def test_fill_gap_of_100_is_ready_and_verified(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    fake.send_messages(alice.user_id, room, [f"m{i}" for i in range(20)])
    await retain_all(tmp_path, fake, alice, room)
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        await open_settled(h, room)
        gap_id = await make_gap(h, fake, alice, room, 100)
        answer = await h.engine.execute(HistoryRepair(FillGap(room, gap_id)))
        assert answer == Ok()
        bridging, settled = h.recorder.reports()
        assert bridging.phase is RepairPhase.Bridging
        assert settled.phase is RepairPhase.Ready and settled.continuity is Continuity.Verified
        assert settled.pages in (2, 3) and settled.events == 100
        items = h.engine.timeline(room).state.items
        assert gap_rows(items) == []
        assert event_ids(items) == fake.event_ids(room)
        assert_mirror_matches(h, room)
        assert h.mirror.state.repairs[room] == settled
        # A joined gap is gone for good.
        assert await h.engine.execute(HistoryRepair(FillGap(room, gap_id))) == EventNotFound()


async def test_fill_gap_of_500_pauses_on_budget_and_continues(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    await retain_all(tmp_path, fake, alice, room)
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        await open_settled(h, room)
        gap_id = await make_gap(h, fake, alice, room, 500)
        assert await h.engine.execute(HistoryRepair(FillGap(room, gap_id))) == Ok()
        settled = h.recorder.reports()[-1]
        assert (settled.phase, settled.stop, settled.pages, settled.events) == (
            RepairPhase.Paused,
            RepairStop.Budget,
            4,
            200,
        )
        [row] = gap_rows(h.engine.timeline(room).state.items)
        assert row.id == gap_id and row.lifecycle is GapLifecycle.Paused
        assert await h.engine.execute(HistoryRepair(FillGap(room, gap_id))) == Ok()
        assert h.recorder.reports()[-1].events == 200
        assert await h.engine.execute(HistoryRepair(FillGap(room, gap_id))) == Ok()
        last = h.recorder.reports()[-1]
        assert last.phase is RepairPhase.Ready and last.events == 100
        assert event_ids(h.engine.timeline(room).state.items) == fake.event_ids(room)
        assert_mirror_matches(h, room)


async def test_fill_reaching_room_creation_is_unavailable(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    fake.send_messages(alice.user_id, room, [f"m{i}" for i in range(30)])
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        # An older section the server no longer shows (history before it is inaccessible).
        older = msgspec.convert(
            {
                "next_batch": "s-older",
                "rooms": {
                    "join": {
                        room: {
                            "timeline": {
                                "events": [
                                    {
                                        "event_id": "$ghost",
                                        "type": "m.room.message",
                                        "sender": alice.user_id,
                                        "origin_server_ts": 1,
                                        "content": {"body": "ghost"},
                                    }
                                ]
                            }
                        }
                    }
                },
            },
            SyncResponse,
        )
        await h.engine.ingest(older)
        await h.engine.sync_once(since="s0_0_0_0_0_0_0_0_0")
        await h.engine.execute(OpenRoom(room))
        await h.engine.execute(HistoryRepair(CancelCmd(room)))
        [gap] = gap_rows(h.engine.timeline(room).state.items)
        assert await h.engine.execute(HistoryRepair(FillGap(room, gap.id))) == Ok()
        settled = h.recorder.reports()[-1]
        assert settled.phase is RepairPhase.Paused
        assert settled.stop is RepairStop.HistoryUnavailable
        assert settled.continuity is Continuity.AccessibleStart
        [row] = gap_rows(h.engine.timeline(room).state.items)
        assert row.lifecycle is GapLifecycle.Unavailable
        assert event_ids(h.engine.timeline(room).state.items) == ["$ghost", *fake.event_ids(room)]
        # Filling it again answers at once: zero pages, no request.
        before = messages_requests(fake)
        assert await h.engine.execute(HistoryRepair(FillGap(room, gap.id))) == Ok()
        bridging, again = h.recorder.reports()[-2:]
        assert bridging.phase is RepairPhase.Bridging
        assert (again.pages, again.stop) == (0, RepairStop.HistoryUnavailable)
        assert messages_requests(fake) == before
        assert_mirror_matches(h, room)


# -- one operation per room, cancel -------------------------------------------------------


async def test_room_busy_for_every_overlap_and_retry_joins(tmp_path, fake, alice, held):
    room = fake.create_room(alice.user_id, name="r")
    await retain_all(tmp_path, fake, alice, room)
    async with (
        client_for(fake, alice, transport=held) as client,
        open_engine(tmp_path, client) as h,
    ):
        await open_settled(h, room)
        gap_id = await make_gap(h, fake, alice, room, 300)
        # A recent load held on its first page.
        first_page = held.hold("/messages")
        retry = asyncio.create_task(h.engine.execute(HistoryRepair(RetryRecent(room))))
        await first_page.arrived.wait()
        assert await h.engine.execute(HistoryRepair(FillGap(room, gap_id))) == RoomBusy()
        assert await h.engine.execute(PaginateBackwards(room)) == RoomBusy()
        # Released, the load can only go on once this task yields: the retry below
        # finds it still running, and joins it.
        first_page.release()
        joined = await h.engine.execute(HistoryRepair(RetryRecent(room)))
        assert joined == await retry == Ok()
        # A fill held on its first page: a recent load, and a second fill, are busy.
        [gap] = gap_rows(h.engine.timeline(room).state.items)
        first_page = held.hold("/messages")
        fill = asyncio.create_task(h.engine.execute(HistoryRepair(FillGap(room, gap.id))))
        await first_page.arrived.wait()
        assert await h.engine.execute(HistoryRepair(RetryRecent(room))) == RoomBusy()
        assert await h.engine.execute(HistoryRepair(FillGap(room, gap.id))) == RoomBusy()
        first_page.release()
        assert await fill == Ok()


async def test_cancel_during_fill_keeps_committed_pages_after_restart(tmp_path, fake, alice, held):
    room = fake.create_room(alice.user_id, name="r")
    await retain_all(tmp_path, fake, alice, room)
    async with (
        client_for(fake, alice, transport=held) as client,
        open_engine(tmp_path, client) as h,
    ):
        await open_settled(h, room)
        gap_id = await make_gap(h, fake, alice, room, 300)
        second_page = held.hold("/messages", on_call=2)
        fill = asyncio.create_task(h.engine.execute(HistoryRepair(FillGap(room, gap_id))))
        # Page 1 is answered; page 2, asked for while page 1 commits, is held for good.
        await second_page.arrived.wait()
        assert await h.engine.execute(HistoryRepair(CancelCmd(room))) == Ok()
        assert await fill == Interrupted()
        settled = h.recorder.reports()[-1]
        assert (settled.phase, settled.stop, settled.pages, settled.events) == (
            RepairPhase.Paused,
            RepairStop.Cancelled,
            1,
            50,
        )
        shown = event_ids(h.engine.timeline(room).state.items)
        assert_mirror_matches(h, room)
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        await h.engine.execute(OpenRoom(room))
        await h.engine.execute(HistoryRepair(CancelCmd(room)))
        stored = [e.event_id for e in await h.engine.store.all_events(room)]
        assert set(shown) <= set(stored)
        [row] = gap_rows(h.engine.timeline(room).state.items)
        assert row.id == gap_id and row.lifecycle is GapLifecycle.Paused
        # The fill resumes from the committed cursor and finishes the gap.
        for _ in range(3):
            await h.engine.execute(HistoryRepair(FillGap(room, gap_id)))
        assert h.recorder.reports()[-1].phase is RepairPhase.Ready
        stored = [e.event_id for e in await h.engine.store.all_events(room)]
        assert stored == fake.event_ids(room)


async def test_close_room_interrupts_and_publishes_idle(tmp_path, fake, alice, held):
    room = fake.create_room(alice.user_id, name="r")
    fake.send_messages(alice.user_id, room, [f"m{i}" for i in range(20)])
    async with (
        client_for(fake, alice, transport=held) as client,
        open_engine(tmp_path, client) as h,
    ):
        first_page = held.hold("/messages")  # never released: CloseRoom stops the load
        await h.engine.execute(OpenRoom(room))
        retry = asyncio.create_task(h.engine.execute(HistoryRepair(RetryRecent(room))))
        await first_page.arrived.wait()
        assert await h.engine.execute(CloseRoom(room)) == Ok()
        assert await retry == Interrupted()
        assert h.recorder.recent(room)[-1] is RecentHistoryKind.Idle
        assert room not in h.mirror.state.timelines
        assert await h.engine.execute(CloseRoom(room)) == RoomNotOpen()


async def test_answers_for_rooms_not_open_unknown_and_invalid(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        for command in (
            HistoryRepair(FillGap(room, "gap-x")),
            HistoryRepair(RetryRecent(room)),
            HistoryRepair(CancelCmd(room)),
            PaginateBackwards(room),
            SendMessage(room, "hi"),
            CloseRoom(room),
        ):
            assert await h.engine.execute(command) == RoomNotOpen()
        assert isinstance(await h.engine.execute(OpenRoom("not-a-room")), Invalid)
        await h.engine.sync_once()
        unknown = await h.engine.execute(OpenRoom("!nope:example.org"))
        assert isinstance(unknown, Failed) and "unknown room" in unknown.message
        await open_settled(h, room)
        assert await h.engine.execute(HistoryRepair(FillGap(room, "gap-x"))) == EventNotFound()
        assert await h.engine.execute(SendMessage(room, "hello")) == Ok()
        await h.engine.send_queue.wait_sent(1)
        await h.engine.sync_once()
        last = h.engine.timeline(room).state.items[-1]
        assert isinstance(last, EventItem) and last.body == "hello"
        assert await h.engine.execute(Shutdown()) == Ok()
        assert h.recorder.recent(room)[-1] is RecentHistoryKind.Idle


async def test_commands_after_shutdown_answer_interrupted(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        await h.engine.sync_once()
        await open_settled(h, room)
        assert await h.engine.execute(Shutdown()) == Ok()
        published = len(h.recorder.events)
        requests = len(fake.requests)
        for command in (
            OpenRoom(room),
            CloseRoom(room),
            HistoryRepair(FillGap(room, "gap-x")),
            HistoryRepair(RetryRecent(room)),
            HistoryRepair(CancelCmd(room)),
            PaginateBackwards(room),
            SendMessage(room, "too late"),
        ):
            assert await h.engine.execute(command) == Interrupted(), command
        assert await h.engine.execute(Shutdown()) == Ok()  # nothing left to stop
        assert len(h.recorder.events) == published  # nothing ran: nothing published
        assert len(fake.requests) == requests  # and nothing reached the homeserver
        assert not h.engine.is_open(room)


# -- faults -------------------------------------------------------------------------------


async def fill_with_fault(tmp_path, fake, alice, install) -> tuple:
    room = fake.create_room(alice.user_id, name="r")
    await retain_all(tmp_path, fake, alice, room)
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        await open_settled(h, room)
        gap_id = await make_gap(h, fake, alice, room, 300)
        install(fake)
        answer = await h.engine.execute(HistoryRepair(FillGap(room, gap_id)))
        [row] = gap_rows(h.engine.timeline(room).state.items)
        assert_mirror_matches(h, room)
        stored = await h.engine.store.all_events(room)
        return answer, h.recorder.reports()[-1], row, len(stored)


async def test_repeated_cursor_pauses_cursor_stalled(tmp_path, fake, alice):
    answer, report, row, _ = await fill_with_fault(
        tmp_path, fake, alice, lambda f: f.repeat_cursor("messages", on_call=2)
    )
    assert answer == Ok()
    assert (report.phase, report.stop, report.pages) == (
        RepairPhase.Paused,
        RepairStop.CursorStalled,
        1,
    )
    assert row.lifecycle is GapLifecycle.Paused


@pytest.mark.parametrize(
    "install",
    [
        pytest.param(lambda f: f.fail("messages", status=502, on_call=3), id="5xx"),
        pytest.param(lambda f: f.timeout("messages", on_call=3), id="timeout"),
        pytest.param(lambda f: f.disconnect("messages", on_call=3), id="connection-closed"),
        pytest.param(lambda f: f.malformed("messages", on_call=3), id="malformed"),
        pytest.param(lambda f: f.truncate("messages", on_call=3), id="truncated"),
        pytest.param(lambda f: f.unknown_token("messages", on_call=3), id="unknown-token"),
    ],
)
async def test_server_fault_on_page_n_fails_with_pages_kept(tmp_path, fake, alice, install):
    answer, report, row, stored = await fill_with_fault(tmp_path, fake, alice, install)
    assert isinstance(answer, Failed) and answer.message
    assert report.phase is RepairPhase.Paused and report.failure == answer.message
    assert (report.pages, report.events) == (2, 100)
    assert row.lifecycle is GapLifecycle.Failed and row.failure == answer.message
    assert stored >= 100


async def test_wrong_passphrase_is_a_clear_error_before_anything_else(tmp_path, fake, alice):
    async with open_engine(tmp_path, None):
        pass
    async with client_for(fake, alice) as client:
        with pytest.raises(WrongPassphrase):
            async with open_engine(tmp_path, client, passphrase="wrong", sync=True):
                pass
    assert fake.requests == []


async def test_store_is_encrypted_at_rest(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    fake.send_messages(alice.user_id, room, ["a very recognisable body"])
    await retain_all(tmp_path, fake, alice, room)
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert b"recognisable" not in raw and room.encode() not in raw
    backend = await open_backend(str(tmp_path / "history.sqlite3"))
    try:
        cipher = await open_cipher(backend, PASSPHRASE, kdf_cost=KdfParams.cheap())
        store = await CacheStore.open(backend, cipher)
        bodies = [e.event.content.get("body") for e in await store.all_events(room)]
        assert "a very recognisable body" in bodies
    finally:
        await backend.close()


@pytest.mark.parametrize(
    ("install", "words"),
    [
        pytest.param(lambda f: f.fail("messages", status=503, times=None), "unavailable", id="5xx"),
        pytest.param(lambda f: f.timeout("messages", times=None), "unavailable", id="timeout"),
        pytest.param(lambda f: f.malformed("messages", times=None), "cannot read", id="malformed"),
        pytest.param(lambda f: f.unknown_token("messages", times=None), "log in", id="token"),
    ],
)
async def test_recent_load_faults_are_readable_and_lose_nothing(
    tmp_path, fake, alice, install, words
):
    room = fake.create_room(alice.user_id, name="r")
    fake.send_messages(alice.user_id, room, [f"m{i}" for i in range(30)])
    await retain_all(tmp_path, fake, alice, room)
    fake.send_messages(alice.user_id, room, [f"n{i}" for i in range(30)])
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        install(fake)
        await h.engine.execute(OpenRoom(room))
        answer = await h.engine.execute(HistoryRepair(RetryRecent(room)))
        assert isinstance(answer, Failed) and words in answer.message
        state = h.mirror.state.recent(room)
        assert state.kind is RecentHistoryKind.Failed and state.message == answer.message
        retained = event_ids(h.engine.timeline(room).state.items)
        assert retained == fake.event_ids(room)[-30 - len(retained) : -30]
        fake.clear_faults()
        assert await h.engine.execute(HistoryRepair(RetryRecent(room))) == Ok()
        assert event_ids(h.engine.timeline(room).state.items)[-30:] == fake.event_ids(room)[-30:]


async def test_simultaneous_commands_never_run_two_operations(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    await retain_all(tmp_path, fake, alice, room)
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        await open_settled(h, room)
        gap_id = await make_gap(h, fake, alice, room, 300)
        fill = HistoryRepair(FillGap(room, gap_id))
        answers = await asyncio.gather(h.engine.execute(fill), h.engine.execute(fill))
        assert sorted(map(repr, answers)) == ["Ok()", "RoomBusy()"]
        assert len(h.recorder.reports()) == 2
        answers = await asyncio.gather(
            h.engine.execute(PaginateBackwards(room)), h.engine.execute(fill)
        )
        assert answers == [Ok(), RoomBusy()]  # the first to claim the room runs
        # A Cancel issued in the same breath as the fill still yields one settled report.
        answers = await asyncio.gather(
            h.engine.execute(fill), h.engine.execute(HistoryRepair(CancelCmd(room)))
        )
        assert answers[1] == Ok() and answers[0] in (Interrupted(), Ok())
        bridging, settled = h.recorder.reports()[2:]
        assert bridging.phase is RepairPhase.Bridging and settled.phase is not RepairPhase.Bridging
        assert_mirror_matches(h, room)


async def test_engine_on_both_backends(backend, fake, alice):
    """The engine over an open Backend (SQLite and PostgreSQL): sync, gap, fill, reopen."""
    room = fake.create_room(alice.user_id, name="r")
    fake.send_messages(alice.user_id, room, [f"m{i}" for i in range(20)])
    async with client_for(fake, alice) as client:
        async with open_engine(backend, client, sync_timeline_limit=500) as h:
            await h.engine.sync_once()
        fake.send_messages(alice.user_id, room, [f"g{i}" for i in range(70)])
        async with open_engine(backend, client, sync_timeline_limit=10) as h:
            await h.engine.execute(OpenRoom(room))
            await h.engine.execute(HistoryRepair(CancelCmd(room)))
            await h.engine.sync_once()
            [gap] = gap_rows(h.engine.timeline(room).state.items)
            assert await h.engine.execute(HistoryRepair(FillGap(room, gap.id))) == Ok()
            assert h.recorder.reports()[-1].continuity is Continuity.Verified
        async with open_engine(backend, client) as h:
            await h.engine.execute(OpenRoom(room))
            await h.engine.execute(HistoryRepair(CancelCmd(room)))
            assert event_ids(h.engine.timeline(room).state.items) == fake.event_ids(room)[-100:]
