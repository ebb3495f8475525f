"""The sync loop: live events land as diffs, receipts and the read marker attach to rows,
and a restart resumes from the committed token without duplicates (fake homeserver)."""

from __future__ import annotations

from gapline.history import (
    EventItem,
    HistoryRepair,
    OpenRoom,
    ReadMarkerItem,
    Reset,
    RetryRecent,
    TimelineChanged,
)
from gapline.matrix.testing import FakeHomeserver
from tests.history.test_engine_support import (
    NO_RETRY,
    assert_mirror_matches,
    event_ids,
    no_sleep,
    open_engine,
)


async def test_sync_loop_delivers_live_events_receipts_and_read_marker(tmp_path):
    fake = FakeHomeserver()
    alice, bob = fake.register("alice"), fake.register("bob")
    room = fake.create_room(alice.user_id, name="live")
    fake.invite(alice.user_id, room, bob.user_id)
    fake.join(bob.user_id, room)
    fake.send_messages(alice.user_id, room, [f"m{i}" for i in range(5)])
    async with (
        fake.client(alice, retry=NO_RETRY, sleep=no_sleep) as client,
        fake.client(bob, retry=NO_RETRY, sleep=no_sleep) as bob_client,
    ):
        async with open_engine(tmp_path, client, sync=True, sync_timeout_ms=200) as h:
            await h.engine.wait_synced(1)
            await h.engine.execute(OpenRoom(room))
            await h.engine.execute(HistoryRepair(RetryRecent(room)))
            count = h.engine.sync_count
            [target] = fake.send_messages(bob.user_id, room, ["live one"])
            await bob_client.send_receipt(room, target)
            await client.set_read_markers(room, fully_read=target)
            while True:
                items = h.engine.timeline(room).state.items
                row = items[-2]
                if (
                    isinstance(items[-1], ReadMarkerItem)
                    and isinstance(row, EventItem)
                    and row.receipts
                ):
                    break
                await h.engine.wait_synced(count + 1)
                count = h.engine.sync_count
            row = items[-2]
            assert isinstance(row, EventItem) and row.event_id == target
            assert bob.user_id in row.receipts
            ids = event_ids(items)
            assert ids == fake.event_ids(room)[-len(ids) :]
            changes = [e for e in h.recorder.events if isinstance(e, TimelineChanged)]
            assert changes and not any(isinstance(d, Reset) for c in changes for d in c.diffs)
            assert_mirror_matches(h, room)
        fake.send_messages(alice.user_id, room, ["after restart"])
        async with open_engine(tmp_path, client) as h:
            response = await h.engine.sync_once()
            assert [e.content.get("body") for e in response.rooms.join[room].timeline.events] == [
                "after restart"
            ]
            stored = [e.event_id for e in await h.engine.store.all_events(room)]
            assert stored == fake.event_ids(room)[-len(stored) :]
            assert stored[-2:] == [target, response.rooms.join[room].timeline.events[0].event_id]
            # Receipts and the read marker survive the restart too.
            await h.engine.execute(OpenRoom(room))
            items = h.engine.timeline(room).state.items
            assert any(isinstance(i, ReadMarkerItem) for i in items)
            assert any(isinstance(i, EventItem) and i.receipts for i in items)
