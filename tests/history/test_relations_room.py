"""Names and membership, receipts and unread, typing, and the bounded window (fake
homeserver): display names as of each event, state events in words, the member list,
private receipts, MarkRead, typing in and out, unread counts, dropping rows at the newest
end while scrolling back and the one Reset that reloads the live end."""

from __future__ import annotations

from gapline.history import (
    EngineConfig,
    EventItem,
    HistoryGapItem,
    MarkRead,
    Ok,
    OpenRoom,
    PaginateBackwards,
    ReadMarkerItem,
    Remove,
    Reset,
    SetTyping,
    ShrinkTimeline,
    TimelineChanged,
    TypingChanged,
)
from gapline.history.rooms import RoomDirectory
from tests.history.relations_support import make_world, open_settled, reader, rows
from tests.history.test_engine_support import assert_mirror_matches, gap_rows


async def test_senders_are_named_as_of_each_event_and_clashes_are_disambiguated(tmp_path):
    world = make_world()
    world.fake.set_displayname("bob", "Bob")
    before = world.say("as Bob")
    world.fake.set_displayname("bob", "Robert")
    after = world.say("as Robert")
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        got = rows(h, world.room)
        assert (got[before].sender_name, got[after].sender_name) == ("Bob", "Robert")
        # alice takes the same name: from now on both are told apart by their ids
        world.fake.set_displayname("alice", "Robert")
        clash = world.say("who is who")
        await h.engine.sync_once()
        got = rows(h, world.room)
        assert got[clash].sender_name == f"Robert ({world.bob.user_id})"
        assert got[after].sender_name == "Robert"  # as of its event: no clash then


async def test_names_of_back_paginated_events_come_from_the_membership_they_pass(tmp_path):
    world = make_world()
    world.fake.set_displayname("bob", "Early Bob")
    early = world.say("early")
    world.fake.set_displayname("bob", "Late Bob")
    world.filler(15)
    async with reader(world, tmp_path, limit=3) as h:
        await h.engine.sync_once(initial=True)
        await open_settled(h, world.room)
        await h.engine.execute(PaginateBackwards(world.room, 100))
        got = rows(h, world.room)
        assert got[early].sender_name == "Early Bob"


async def test_state_events_read_in_words_and_the_member_list_is_published(tmp_path):
    world = make_world()
    world.fake.set_displayname("bob", "Bob")
    world.fake.send_event("alice", world.room, "m.room.topic", {"topic": "plans"}, state_key="")
    carol = world.fake.register("carol")
    world.fake.invite("alice", world.room, carol.user_id)
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        bodies = [r.body for r in rows(h, world.room).values() if r.event_type != "m.room.message"]
        for words in (
            "created the room",
            "joined the room",
            "set their name to Bob",
            "changed the topic to “plans”",
            f"invited {carol.user_id}",
        ):
            assert words in bodies, words
        members = {m.user_id: m for m in h.mirror.members(world.room)}
        assert members[world.bob.user_id].display_name == "Bob"
        assert members[carol.user_id].membership == "invite"
        world.fake.leave("bob", world.room)
        await h.engine.sync_once()
        assert world.bob.user_id not in {m.user_id for m in h.mirror.members(world.room)}


async def test_private_receipts_count_only_for_this_account(tmp_path):
    world = make_world()
    first = world.say("one")
    second = world.say("two")
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        async with world.fake.client(world.alice) as alice, world.fake.client(world.bob) as bob:
            await alice.set_read_markers(world.room, read_private=first)
            await bob.set_read_markers(world.room, read_private=second)  # never seen by alice
        await h.engine.sync_once()
        got = rows(h, world.room)
        assert got[first].receipts == (world.alice.user_id,)
        assert got[second].receipts == ()


async def test_mark_read_moves_the_marker_and_the_receipt_and_tells_the_server(tmp_path):
    world = make_world()
    first = world.say("one")
    world.say("two")
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        assert await h.engine.execute(MarkRead(world.room, first)) == Ok()
        items = h.engine.timeline(world.room).state.items
        index = next(i for i, r in enumerate(items) if getattr(r, "event_id", None) == first)
        assert isinstance(items[index + 1], ReadMarkerItem)  # the unread divider
        marked = items[index]
        assert isinstance(marked, EventItem) and marked.receipts == (world.alice.user_id,)
        [call] = [r for r in world.fake.requests if r.endpoint == "read_markers"]
        assert call.body == {"m.fully_read": first, "m.read": first}
        await h.engine.sync_once()  # the server's echo moves nothing more
        assert h.engine.timeline(world.room).state.items == items
        assert_mirror_matches(h, world.room)


async def test_typing_comes_in_as_events_and_goes_out_as_a_command(tmp_path):
    world = make_world()
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        world.fake.set_typing("bob", world.room, True)
        await h.engine.sync_once()
        assert h.mirror.typing(world.room) == (world.bob.user_id,)
        world.fake.set_typing("bob", world.room, False)
        await h.engine.sync_once()
        assert h.mirror.typing(world.room) == ()
        typing = [e for e in h.recorder.events if isinstance(e, TypingChanged)]
        assert [e.user_ids for e in typing] == [(world.bob.user_id,), ()]
        assert await h.engine.execute(SetTyping(world.room, True)) == Ok()
        [call] = [r for r in world.fake.requests if r.endpoint == "typing"]
        assert call.body["typing"] is True


async def test_unread_and_highlight_counts_come_from_the_sync(tmp_path):
    world = make_world()
    world.say("hello everyone")
    world.say("alice, look")
    directory = RoomDirectory()
    async with world.fake.client(world.alice) as client:
        directory.observe(await client.sync())
    summary = directory.get(world.room)
    assert summary is not None and (summary.unread, summary.highlights) == (2, 1)


# -- the bounded window -------------------------------------------------------------------


async def test_scrolling_back_drops_rows_at_the_newest_end_and_shrink_resets_once(tmp_path):
    world = make_world()
    world.filler(400)
    config = EngineConfig(page_size=50, recent_pages=1, open_window=100, timeline_window=150)
    async with reader(world, tmp_path, limit=500, config=config) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        for _ in range(3):
            assert await h.engine.execute(PaginateBackwards(world.room, 100)) == Ok()
        timeline = h.engine.timeline(world.room)
        assert len(timeline.state.items) <= 150
        assert not timeline.at_live_end
        removes = [
            d
            for e in h.recorder.events
            if isinstance(e, TimelineChanged)
            for d in e.diffs
            if isinstance(d, Remove)
        ]
        assert removes  # rows left by diffs, from the newest end
        # A new message is not shown while the window is away from the live end.
        newest = world.say("while you were away")
        await h.engine.sync_once()
        assert newest not in rows(h, world.room)
        seen = len(h.recorder.events)
        assert await h.engine.execute(ShrinkTimeline(world.room)) == Ok()
        published = [e for e in h.recorder.events[seen:] if isinstance(e, TimelineChanged)]
        assert len(published) == 1 and len(published[0].diffs) == 1
        [reset] = published[0].diffs
        assert isinstance(reset, Reset)
        assert timeline.at_live_end
        ids = [i.id for i in reset.values if isinstance(i, EventItem)]
        assert ids[-1] == newest and len(reset.values) == 100
        assert_mirror_matches(h, world.room)  # the mirror equals a replay of the events


async def test_a_reset_keeps_row_ids_and_a_gap_row_keeps_its_id(tmp_path):
    world = make_world()
    world.filler(30)
    config = EngineConfig(page_size=10, recent_pages=1, open_window=100, timeline_window=100)
    async with reader(world, tmp_path, limit=100, config=config) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
    world.filler(40)  # a gap forms for the next session
    async with reader(world, tmp_path, limit=5, config=config) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        before = h.engine.timeline(world.room).state.items
        [gap] = gap_rows(before)
        assert await h.engine.execute(ShrinkTimeline(world.room)) == Ok()
        after = h.engine.timeline(world.room).state.items
        assert [i.id for i in after] == [i.id for i in before]
        assert [g.id for g in after if isinstance(g, HistoryGapItem)] == [gap.id]
        assert_mirror_matches(h, world.room)


async def test_the_live_end_moving_on_drops_the_oldest_rows(tmp_path):
    world = make_world()
    config = EngineConfig(page_size=10, recent_pages=1, open_window=100, timeline_window=120)
    async with reader(world, tmp_path, limit=50, config=config) as h:
        await h.engine.sync_once()
        await h.engine.execute(OpenRoom(world.room))
        for _ in range(4):
            world.filler(40)
            await h.engine.sync_once()
        timeline = h.engine.timeline(world.room)
        assert len(timeline.state.items) <= 120 and timeline.at_live_end
        assert not isinstance(timeline.state.items[0], HistoryGapItem)
        assert_mirror_matches(h, world.room)
        assert await h.engine.execute(PaginateBackwards(world.room, 50)) == Ok()
        assert_mirror_matches(h, world.room)
