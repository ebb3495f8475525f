"""The timeline rules against a real Synapse: edits, redactions, reactions, replies,
threads, names, receipts, typing and unread counts, each sent by other accounts with raw
client-server calls, in the live timeline and across a gap filled later.

The reader is alice (her engine); bob writes; carol is the account whose edits must
never change bob's rows. Synapse serves the events of a gap in its own order (a fill walks
them newest first), so "the relation arrives before its target" is what every gap fill
here does; orders Synapse never produces are in tests/history.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gapline.history import (
    EngineConfig,
    EventItem,
    FillGap,
    HistoryGapItem,
    HistoryRepair,
    MarkRead,
    Ok,
    OpenRoom,
    OpenThread,
    PaginateBackwards,
    ReadMarkerItem,
    ReplyStatus,
    RetryRecent,
    SendReaction,
    SetTyping,
)
from gapline.history.rooms import RoomDirectory
from tests.history.relations_support import edit_of, reaction, reply_to, thread_reply
from tests.history.test_engine_support import NO_RETRY, assert_mirror_matches, open_engine

pytestmark = pytest.mark.synapse

CONFIG = EngineConfig(page_size=10, recent_pages=1, page_budget=20)


class Cast:
    """alice reads; bob and carol write with raw client-server calls."""

    def __init__(self, kit, alice, bob, carol, room: str) -> None:
        self.kit, self.alice, self.bob, self.carol, self.room = kit, alice, bob, carol, room

    async def send(self, who, event_type: str, content: dict) -> str:
        async with self.kit.client(who) as client:
            return await client.send_event(self.room, event_type, content)

    async def say(self, who, body: str) -> str:
        async with self.kit.client(who) as client:
            return await client.send_text(self.room, body)

    async def filler(self, n: int) -> None:
        await self.kit.send_messages(self.bob, self.room, [f"filler {i}" for i in range(n)])

    async def redact(self, who, event_id: str) -> str:
        async with self.kit.client(who) as client:
            return await client.redact(self.room, event_id)


@pytest.fixture
async def cast(synapse_kit) -> Cast:
    alice = await synapse_kit.user("alice")
    bob = await synapse_kit.user("bob")
    carol = await synapse_kit.user("carol")
    room = await synapse_kit.room(alice, bob, carol, name="timeline")
    return Cast(synapse_kit, alice, bob, carol, room)


def open_reader(cast: Cast, store: Path, *, limit: int = 50):
    client = cast.kit.client(cast.alice, retry=NO_RETRY)
    return client, open_engine(store, client, config=CONFIG, sync_timeline_limit=limit)


async def settle(h, room: str) -> None:
    assert await h.engine.execute(OpenRoom(room)) == Ok()
    await h.engine.execute(HistoryRepair(RetryRecent(room)))


async def fill_all(h, room: str) -> None:
    for _ in range(30):
        gaps = [i for i in h.engine.timeline(room).state.items if isinstance(i, HistoryGapItem)]
        if not gaps:
            return
        assert await h.engine.execute(HistoryRepair(FillGap(room, gaps[0].id))) == Ok()
    raise AssertionError("the gaps never closed")


def rows(h, room: str) -> dict[str, EventItem]:
    assert_mirror_matches(h, room)
    items = h.engine.timeline(room).state.items
    return {i.event_id: i for i in items if isinstance(i, EventItem)}


async def test_edits_live_and_across_a_gap_and_never_anothers(tmp_path, cast):
    live = await cast.say(cast.bob, "live v0")
    client, engine = open_reader(cast, tmp_path, limit=5)
    async with client, engine as h:
        await h.engine.sync_once()
        await settle(h, cast.room)
        await cast.send(cast.bob, "m.room.message", edit_of(live, "live v1"))
        await cast.send(cast.carol, "m.room.message", edit_of(live, "carol's forgery"))
        await h.engine.sync_once()
        row = rows(h, cast.room)[live]
        assert (row.body, row.edited) == ("live v1", True)
        # Away: an original, a long stretch, then its edit and a forgery of it.
        original = await cast.say(cast.bob, "gap v0")
        await cast.filler(25)
        await cast.send(cast.bob, "m.room.message", edit_of(original, "gap v1"))
        await cast.send(cast.carol, "m.room.message", edit_of(original, "forged"))
        await h.engine.sync_once()  # limited: the edits came, the original is in the gap
        await fill_all(h, cast.room)
        row = rows(h, cast.room)[original]
        assert (row.body, row.edited) == ("gap v1", True)
        bodies = [r.body or "" for r in rows(h, cast.room).values()]
        assert not any("forg" in b for b in bodies)
        assert not any(b.startswith("* ") for b in bodies)  # an edit is never a row


async def test_redactions_live_and_of_an_event_inside_a_gap(tmp_path, cast):
    first = await cast.say(cast.bob, "first secret")
    client, engine = open_reader(cast, tmp_path, limit=5)
    async with client, engine as h:
        await h.engine.sync_once()
        await settle(h, cast.room)
        await cast.redact(cast.bob, first)
        await h.engine.sync_once()
        row = rows(h, cast.room)[first]
        assert (row.body, row.redacted) == (None, True)
        second = await cast.say(cast.bob, "second secret")
        await cast.filler(25)
        await cast.redact(cast.bob, second)  # the redaction arrives before its target
        await h.engine.sync_once()
        await fill_all(h, cast.room)
        row = rows(h, cast.room)[second]
        assert (row.body, row.redacted) == (None, True)
        stored = await h.engine.store.event(cast.room, second)
        assert stored is not None and "body" not in stored.event.content


async def test_reactions_live_redacted_and_toggled(tmp_path, cast):
    target = await cast.say(cast.bob, "react")
    client, engine = open_reader(cast, tmp_path)
    async with client, engine as h:
        await h.engine.sync_once()
        await settle(h, cast.room)
        thumbs = await cast.send(cast.bob, "m.reaction", reaction(target, "👍"))
        await cast.send(cast.carol, "m.reaction", reaction(target, "👍"))
        await h.engine.sync_once()
        row = rows(h, cast.room)[target]
        assert [(r.key, r.senders) for r in row.reactions] == [
            ("👍", (cast.bob.user_id, cast.carol.user_id))
        ]
        await cast.redact(cast.bob, thumbs)
        assert await h.engine.execute(SendReaction(cast.room, target, "🎉")) == Ok()
        await h.engine.send_queue.wait_sent(1)
        await h.engine.sync_once()
        row = rows(h, cast.room)[target]
        assert [(r.key, r.senders) for r in row.reactions] == [
            ("👍", (cast.carol.user_id,)),
            ("🎉", (cast.alice.user_id,)),
        ]
        assert await h.engine.execute(SendReaction(cast.room, target, "🎉")) == Ok()
        await h.engine.send_queue.wait_sent(2)
        await h.engine.sync_once()
        assert [r.key for r in rows(h, cast.room)[target].reactions] == ["👍"]


async def test_replies_quote_from_the_cache_or_from_context(tmp_path, cast):
    old = await cast.say(cast.carol, "an old question")
    await cast.filler(25)
    client, engine = open_reader(cast, tmp_path, limit=5)
    async with client, engine as h:
        await h.engine.sync_once(initial=True)
        near = await cast.say(cast.carol, "a near question")
        reply_near = await cast.send(cast.bob, "m.room.message", reply_to(near, "near answer"))
        reply_old = await cast.send(cast.bob, "m.room.message", reply_to(old, "old answer"))
        await h.engine.sync_once()
        await settle(h, cast.room)
        await h.engine.wait_quotes()
        got = rows(h, cast.room)
        quote = got[reply_near].in_reply_to
        assert quote is not None and (quote.status, quote.body) == (
            ReplyStatus.Ready,
            "a near question",
        )
        quote = got[reply_old].in_reply_to  # not retained: fetched once with /context
        assert quote is not None and (quote.status, quote.body) == (
            ReplyStatus.Ready,
            "an old question",
        )


async def test_threads_summary_view_and_live_replies(tmp_path, cast):
    root = await cast.say(cast.bob, "thread root")
    replies = [
        await cast.send(cast.carol, "m.room.message", thread_reply(root, f"reply {i}"))
        for i in range(12)
    ]
    client, engine = open_reader(cast, tmp_path)
    async with client, engine as h:
        await h.engine.sync_once()
        await settle(h, cast.room)
        got = rows(h, cast.room)
        assert not any(r in got for r in replies)
        summary = got[root].thread_summary
        assert summary is not None and summary.count == 12 and not summary.participated
        assert await h.engine.execute(OpenThread(cast.room, root)) == Ok()
        await h.engine.wait_idle(cast.room, root)
        assert await h.engine.execute(PaginateBackwards(cast.room, 50, thread_root=root)) == Ok()
        thread = h.engine.thread(cast.room, root).state.items
        assert tuple(h.mirror.state.threads[cast.room][root]) == thread
        assert [i.event_id for i in thread if isinstance(i, EventItem)] == [root, *replies]
        live = await cast.send(cast.carol, "m.room.message", thread_reply(root, "live reply"))
        await h.engine.sync_once()
        thread = h.engine.thread(cast.room, root).state.items
        assert [i.event_id for i in thread if isinstance(i, EventItem)][-1] == live
        summary = rows(h, cast.room)[root].thread_summary
        assert summary is not None and summary.count == 13


async def test_names_receipts_typing_and_unread(tmp_path, cast):
    async with cast.kit.client(cast.bob) as bob:
        await bob.set_displayname("Bobby")
    named = await cast.say(cast.bob, "from Bobby")
    async with cast.kit.client(cast.bob) as bob:
        await bob.set_displayname("Robert")
    renamed = await cast.say(cast.bob, "from Robert")
    await cast.say(cast.bob, f"{cast.alice.user_id.split(':')[0][1:]}: ping")
    client, engine = open_reader(cast, tmp_path)
    directory = RoomDirectory()
    async with client, engine as h:
        directory.observe(await h.engine.sync_once())
        summary = directory.get(cast.room)
        assert summary is not None and summary.unread == 3 and summary.highlights == 1
        await settle(h, cast.room)
        got = rows(h, cast.room)
        assert (got[named].sender_name, got[renamed].sender_name) == ("Bobby", "Robert")
        assert "changed their name to Robert" in [r.body for r in got.values()]
        members = {m.user_id for m in h.mirror.members(cast.room)}
        assert {cast.alice.user_id, cast.bob.user_id, cast.carol.user_id} <= members
        assert await h.engine.execute(MarkRead(cast.room, named)) == Ok()
        directory.observe(await h.engine.sync_once())
        items = h.engine.timeline(cast.room).state.items
        index = next(i for i, r in enumerate(items) if getattr(r, "event_id", "") == named)
        assert isinstance(items[index + 1], ReadMarkerItem)
        summary = directory.get(cast.room)
        assert summary is not None and summary.unread == 2
        async with cast.kit.client(cast.bob) as bob:
            await bob.set_typing(cast.room, typing=True)
        await h.engine.sync_once()
        assert h.mirror.typing(cast.room) == (cast.bob.user_id,)
        assert await h.engine.execute(SetTyping(cast.room, True)) == Ok()
        async with cast.kit.client(cast.bob) as bob:
            typing = (await bob.sync(timeline_limit=1)).rooms.join[cast.room].ephemeral
        assert any(cast.alice.user_id in e.content.get("user_ids", []) for e in typing.events)
