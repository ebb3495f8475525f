"""Threads (fake homeserver): replies stay out of the room's timeline, the root's summary,
the thread view (its own timeline filled with /relations, its own durable gaps, live
replies, the same diff vocabulary), and sending into a thread."""

from __future__ import annotations

from gapline.history import (
    EngineConfig,
    EventItem,
    FillGap,
    HistoryGapItem,
    HistoryRepair,
    Ok,
    OpenThread,
    PaginateBackwards,
    SendMessage,
    TimelineChanged,
    TimelineReset,
)
from tests.history.relations_support import (
    edit_of,
    make_world,
    open_settled,
    reader,
    rows,
    thread_reply,
)


def thread_rows(h, room: str, root: str) -> list:
    items = h.engine.thread(room, root).state.items
    assert tuple(h.mirror.state.threads[room][root]) == items  # the mirror equals the engine
    return list(items)


def thread_ids(h, room: str, root: str) -> list[str]:
    return [i.event_id for i in thread_rows(h, room, root) if isinstance(i, EventItem)]


async def test_thread_replies_are_not_room_rows_and_the_root_sums_them_up(tmp_path):
    world = make_world()
    root = world.say("root", by="alice")
    replies = [world.send("m.room.message", thread_reply(root, f"reply {i}")) for i in range(3)]
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        got = rows(h, world.room)
        assert not any(r in got for r in replies)
        summary = got[root].thread_summary
        assert summary is not None
        assert (summary.count, summary.participated) == (3, True)  # alice sent the root
        assert summary.latest is not None
        assert (summary.latest.event_id, summary.latest.body) == (replies[-1], "reply 2")
        world.send("m.room.message", edit_of(replies[-1], "reply 2, edited"))
        await h.engine.sync_once()
        summary = rows(h, world.room)[root].thread_summary
        assert summary is not None and summary.latest is not None
        assert summary.latest.body == "reply 2, edited"
        world.fake.redact("bob", world.room, replies[-1])
        await h.engine.sync_once()
        summary = rows(h, world.room)[root].thread_summary
        assert summary is not None and summary.latest is not None
        assert (summary.count, summary.latest.redacted, summary.latest.body) == (3, True, None)


async def test_a_root_fetched_with_its_bundled_summary_shows_it(tmp_path):
    world = make_world()
    root = world.say("old root")
    for i in range(4):
        world.send("m.room.message", thread_reply(root, f"r{i}"))
    world.filler(15)
    async with reader(world, tmp_path, limit=3) as h:
        await h.engine.sync_once(initial=True)
        await open_settled(h, world.room)
        await h.engine.execute(PaginateBackwards(world.room, 100))
        summary = rows(h, world.room)[root].thread_summary
        assert summary is not None and summary.count == 4
        assert summary.participated is False


async def test_the_thread_view_is_a_timeline_of_its_own_filled_with_relations(tmp_path):
    world = make_world()
    root = world.say("thread root")
    replies = [world.send("m.room.message", thread_reply(root, f"reply {i}")) for i in range(25)]
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        assert await h.engine.execute(OpenThread(world.room, root)) == Ok()
        reset = [e for e in h.recorder.events if isinstance(e, TimelineReset) and e.thread_root]
        assert reset and reset[0].items == ()  # nothing retained for the thread yet
        await h.engine.wait_idle(world.room, root)
        # The recent load walked /relations (pages of 10): one page, then a gap to... none
        # retained below, so the top of the thread has a cursor and scroll-back continues.
        await h.engine.execute(PaginateBackwards(world.room, 100, thread_root=root))
        assert thread_ids(h, world.room, root) == [root, *replies]
        assert any(r.endpoint == "relations" for r in world.fake.requests)
        # A live reply extends the thread: the room's own history proves nothing between.
        live = world.send("m.room.message", thread_reply(root, "live"))
        await h.engine.sync_once()
        assert thread_ids(h, world.room, root)[-1] == live
        assert live not in rows(h, world.room)
        changes = [
            e for e in h.recorder.events if isinstance(e, TimelineChanged) and e.thread_root == root
        ]
        assert changes  # the same diff vocabulary, tagged with the thread


async def test_a_thread_keeps_its_own_durable_gap_and_fills_it(tmp_path):
    world = make_world()
    root = world.say("root")
    first = [world.send("m.room.message", thread_reply(root, f"early {i}")) for i in range(3)]
    async with reader(world, tmp_path, limit=5) as h:
        await h.engine.sync_once(initial=True)
        await open_settled(h, world.room)
        await h.engine.execute(OpenThread(world.room, root))
        await h.engine.wait_idle(world.room, root)
        assert thread_ids(h, world.room, root) == [root, *first]
        # Away: many room events, a few thread replies among them; the sync is limited.
        world.filler(10)
        later = [world.send("m.room.message", thread_reply(root, f"later {i}")) for i in range(2)]
        world.filler(10)
        last = world.send("m.room.message", thread_reply(root, "last"))
        await h.engine.sync_once()
    small = EngineConfig(page_size=2, recent_pages=1, page_budget=10)
    async with reader(world, tmp_path, limit=5, config=small) as h:
        await open_settled(h, world.room)
        await h.engine.execute(OpenThread(world.room, root))
        await h.engine.wait_idle(world.room, root)
        items = thread_rows(h, world.room, root)
        [gap] = [i for i in items if isinstance(i, HistoryGapItem)]  # one page did not close it
        assert await h.engine.execute(HistoryRepair(FillGap(world.room, gap.id))) == Ok()
        report = h.recorder.reports()[-1]
        assert (report.gap_id, report.phase.value) == (gap.id, "Ready")
        assert thread_ids(h, world.room, root) == [root, *first, *later, last]
        assert not [i for i in thread_rows(h, world.room, root) if isinstance(i, HistoryGapItem)]


async def test_sending_into_a_thread_quotes_its_newest_event(tmp_path):
    world = make_world()
    root = world.say("root")
    reply = world.send("m.room.message", thread_reply(root, "one"))
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        assert await h.engine.execute(SendMessage(world.room, "two", thread_root=root)) == Ok()
        await h.engine.send_queue.wait_sent(1)
        sent = world.fake.events(world.room)[-1]
        assert sent.content["m.relates_to"] == {
            "rel_type": "m.thread",
            "event_id": root,
            "is_falling_back": True,
            "m.in_reply_to": {"event_id": reply},
        }
        await h.engine.sync_once()
        summary = rows(h, world.room)[root].thread_summary
        assert summary is not None and summary.count == 2 and summary.participated
