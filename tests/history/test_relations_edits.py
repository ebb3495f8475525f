"""Edits and redactions where events enter the cache (fake homeserver): each rule, in the
live timeline and across a gap filled later, in either arrival order; and bad input.

Orders Synapse will not produce are made by hand here: a sync limited to a few events
brings a relation while its target stays in a gap, then a fill brings the target.
"""

from __future__ import annotations

import msgspec

from gapline.history import OpenRoom, Set, TimelineChanged
from gapline.history._updates import RowChanged
from gapline.matrix import ClientEvent
from tests.history.cache_contract import ROOM, open_cache, write
from tests.history.relations_support import (
    edit_of,
    every_row_ever,
    fill_all,
    make_world,
    open_settled,
    reader,
    rows,
)


async def test_live_edit_by_the_sender_replaces_the_row_with_a_set_and_is_no_row(tmp_path):
    world = make_world()
    original = world.say("first text")
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        before = len(h.engine.timeline(world.room).state.items)
        edit = world.send("m.room.message", edit_of(original, "second text"))
        await h.engine.sync_once()
        row = rows(h, world.room)[original]
        assert (row.body, row.edited) == ("second text", True)
        assert edit not in rows(h, world.room)
        assert len(h.engine.timeline(world.room).state.items) == before
        last = [e for e in h.recorder.events if isinstance(e, TimelineChanged)][-1]
        assert [type(d) for d in last.diffs] == [Set]
        [diff] = last.diffs
        assert isinstance(diff, Set) and diff.value.id == row.id  # the original's row, same id


async def test_newest_edit_wins_by_timestamp_then_id_whatever_the_arrival_order(tmp_path):
    world = make_world()
    original = world.say("v0")
    async with reader(world, tmp_path, limit=3) as h:
        await h.engine.sync_once(initial=True)
        world.send("m.room.message", edit_of(original, "v1"))
        world.filler(12)
        world.send("m.room.message", edit_of(original, "v2"))
        # The newest edit comes with the sync, the older one only with the fill.
        await h.engine.sync_once()
        await open_settled(h, world.room)
        await fill_all(h, world.room)
        assert rows(h, world.room)[original].body == "v2"
        assert "v1" not in [r.body for r in every_row_ever(h, world.room)]
    async with reader(world, tmp_path, limit=3) as h:
        await h.engine.execute(OpenRoom(world.room))
        row = rows(h, world.room)[original]  # read back from the store after a restart
        assert (row.body, row.edited) == ("v2", True)


async def test_an_edit_arriving_before_its_original_is_held_and_applied_on_arrival(tmp_path):
    world = make_world()
    async with reader(world, tmp_path, limit=3) as h:
        await h.engine.sync_once(initial=True)
        original = world.say("draft")
        world.filler(12)
        world.send("m.room.message", edit_of(original, "final"))
        await h.engine.sync_once()  # the edit, with the original in the gap below
        await open_settled(h, world.room)
        await fill_all(h, world.room)
        row = rows(h, world.room)[original]
        assert (row.body, row.edited) == ("final", True)
        # The original's row never showed its draft text: it arrived edited.
        assert "draft" not in [r.body for r in every_row_ever(h, world.room)]


async def test_another_senders_edit_never_changes_a_row_even_arriving_first(tmp_path):
    world = make_world()
    async with reader(world, tmp_path, limit=3) as h:
        await h.engine.sync_once(initial=True)
        original = world.say("mine", by="alice")
        world.filler(12)
        world.send("m.room.message", edit_of(original, "forged"))  # bob edits alice's
        await h.engine.sync_once()
        await open_settled(h, world.room)
        await fill_all(h, world.room)
        live = world.send("m.room.message", edit_of(original, "forged again"))
        await h.engine.sync_once()
        row = rows(h, world.room)[original]
        assert (row.body, row.edited) == ("mine", False)
        assert live not in rows(h, world.room)
        assert not any(r.body and "forged" in r.body for r in every_row_ever(h, world.room)), (
            "another sender's edit showed"
        )
        aggregate = await h.engine.store.aggregate(world.room, original)
        assert aggregate is None or not aggregate.edits  # not even held once the original came


async def test_bad_edits_change_nothing_and_are_not_rows(tmp_path):
    world = make_world()
    original = world.say("plain")
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        first_edit = world.send("m.room.message", edit_of(original, "edited once"))
        sent = [
            # an edit of an edit
            world.send("m.room.message", edit_of(first_edit, "edit of the edit")),
            # an edit that changes the event type
            world.send("m.sticker", {**edit_of(original, "a sticker"), "url": "mxc://x/y"}),
            # an m.new_content that is not an object
            world.send(
                "m.room.message",
                {**edit_of(original, "x"), "m.new_content": "not an object"},
            ),
            # a state event pretending to be an edit
            world.fake.send_event(
                "bob", world.room, "m.room.topic", edit_of(original, "topic edit"), state_key=""
            ),
        ]
        await h.engine.sync_once()
        got = rows(h, world.room)
        assert (got[original].body, got[original].edited) == ("edited once", True)
        assert not any(e in got for e in sent[:3])
        assert got[sent[3]].event_type == "m.room.topic"  # a state event stays a state row


async def test_an_edit_in_another_room_never_touches_this_rooms_row(tmp_path):
    world = make_world()
    other = world.fake.create_room("bob", name="other", members=[world.alice.user_id])
    original = world.say("here")
    world.fake.send_event("bob", other, "m.room.message", edit_of(original, "from elsewhere"))
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        await h.engine.execute(OpenRoom(other))
        row = rows(h, world.room)[original]
        assert (row.body, row.edited) == ("here", False)
        assert original not in rows(h, other)


# -- redactions ---------------------------------------------------------------------------


async def test_a_redaction_in_a_sync_clears_the_row_and_the_stored_content(tmp_path):
    world = make_world()
    secret = world.say("a secret")
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        world.fake.redact("bob", world.room, secret)
        await h.engine.sync_once()
        row = rows(h, world.room)[secret]
        assert (row.body, row.redacted, row.id) == (None, True, secret)
        stored = await h.engine.store.event(world.room, secret)
        assert stored is not None and stored.event.content == {}  # purged at rest too


async def test_a_redaction_arriving_before_its_target_means_the_target_never_shows(tmp_path):
    world = make_world()
    async with reader(world, tmp_path, limit=3) as h:
        await h.engine.sync_once(initial=True)
        secret = world.say("never shown")
        world.filler(12)
        # The fake empties the event when it redacts; serve the original content by
        # redacting only once the reader retained the redaction... so model the order
        # Synapse cannot produce: the redaction event alone, its target untouched.
        world.send("m.room.redaction", {"redacts": secret})
        await h.engine.sync_once()
        await open_settled(h, world.room)
        await fill_all(h, world.room)
        row = rows(h, world.room)[secret]
        assert (row.body, row.redacted) == (None, True)
        assert "never shown" not in [r.body for r in every_row_ever(h, world.room)]
        stored = await h.engine.store.event(world.room, secret)
        assert stored is not None and "body" not in stored.event.content


async def test_redacting_the_shown_edit_reverts_to_the_previous_revision(tmp_path):
    world = make_world()
    original = world.say("v0")
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        world.send("m.room.message", edit_of(original, "v1"))
        v2 = world.send("m.room.message", edit_of(original, "v2"))
        await h.engine.sync_once()
        assert rows(h, world.room)[original].body == "v2"
        world.fake.redact("bob", world.room, v2)
        await h.engine.sync_once()
        row = rows(h, world.room)[original]
        assert (row.body, row.edited, row.redacted) == ("v1", True, False)


async def test_redacting_the_only_edit_shows_the_original_unedited(tmp_path):
    world = make_world()
    original = world.say("v0")
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        edit = world.send("m.room.message", edit_of(original, "v1"))
        await h.engine.sync_once()
        world.fake.redact("bob", world.room, edit)
        await h.engine.sync_once()
        row = rows(h, world.room)[original]
        assert (row.body, row.edited, row.redacted) == ("v0", False, False)


async def test_redacting_a_bundled_edit_without_earlier_revisions_invents_nothing(tmp_path):
    """The original came with the server's bundled newest edit (as ``/relations`` or a
    back-pagination can bring it) and no edit event; the bundled edit is then redacted:
    earlier revisions may exist that the cache does not hold, so it shows none."""
    store = await open_cache(str(tmp_path / "history.sqlite3"))
    v2 = ClientEvent(
        event_id="$v2", type="m.room.message", sender="@b:x", origin_server_ts=3,
        content=edit_of("$o", "v2"),
    )  # fmt: skip
    original = ClientEvent(
        event_id="$o", type="m.room.message", sender="@b:x", origin_server_ts=1,
        content={"msgtype": "m.text", "body": "v0"},
        unsigned={"m.relations": {"m.replace": msgspec.to_builtins(v2)}},
    )  # fmt: skip
    await write(store, lambda s: s.ingest_sync([original], limited=True, prev_batch="p"))
    window = await store.load_window(ROOM, 10)
    assert window.items is not None and window.items[0].body == "v2"
    redaction = ClientEvent(
        event_id="$r", type="m.room.redaction", sender="@b:x", origin_server_ts=4,
        content={"redacts": "$v2"},
    )  # fmt: skip
    _, updates = await write(
        store, lambda s: s.ingest_sync([redaction], limited=False, prev_batch=None)
    )
    [changed] = [u for u in updates if isinstance(u, RowChanged)]
    assert (changed.item.body, changed.item.edited, changed.item.redacted) == (None, True, True)
    await store.backend.close()


async def test_a_redaction_of_an_unknown_event_shows_nothing_and_is_kept(tmp_path):
    world = make_world()
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        before = h.engine.timeline(world.room).state.items
        redaction = world.send("m.room.redaction", {"redacts": "$nowhere:example.org"})
        await h.engine.sync_once()
        assert h.engine.timeline(world.room).state.items == before
        assert redaction not in rows(h, world.room)
        tombstone = await h.engine.store.aggregate(world.room, "$nowhere:example.org")
        assert tombstone is not None and tombstone.redacted_by == redaction
