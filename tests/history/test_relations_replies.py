"""Replies and reactions where events enter the cache (fake homeserver): quotes from the
cache or fetched once with /context, quotes that follow the quoted row, unavailable and
looping quotes; reactions per key, redacted reactions, the SendReaction toggle."""

from __future__ import annotations

from gapline.history import Ok, ReplyStatus, SendMessage, SendReaction
from gapline.matrix import ClientEvent
from tests.history.cache_contract import ROOM, open_cache, write
from tests.history.relations_support import (
    edit_of,
    make_world,
    open_settled,
    reaction,
    reader,
    reply_to,
    rows,
)


def context_requests(world) -> list[str]:
    return [r.path for r in world.fake.requests if r.endpoint == "context"]


async def test_a_reply_quotes_the_sender_and_first_line_and_drops_its_fallback(tmp_path):
    world = make_world()
    quoted = world.say("line one\nline two", by="alice")
    reply = world.send("m.room.message", reply_to(quoted, "my answer", fallback="line one"))
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        row = rows(h, world.room)[reply]
        assert row.body == "my answer"
        quote = row.in_reply_to
        assert quote is not None and quote.status is ReplyStatus.Ready
        assert (quote.event_id, quote.sender, quote.body) == (
            quoted,
            world.alice.user_id,
            "line one",
        )
        assert context_requests(world) == []  # the cache held it


async def test_a_quote_follows_its_quoted_row_through_an_edit_and_a_redaction(tmp_path):
    world = make_world()
    quoted = world.say("before")
    reply = world.send("m.room.message", reply_to(quoted, "answer"), by="alice")
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        world.send("m.room.message", edit_of(quoted, "after"))
        await h.engine.sync_once()
        quote = rows(h, world.room)[reply].in_reply_to
        assert quote is not None and quote.body == "after"
        world.fake.redact("bob", world.room, quoted)
        await h.engine.sync_once()
        quote = rows(h, world.room)[reply].in_reply_to
        assert quote is not None and (quote.redacted, quote.body) == (True, None)


async def test_a_quote_of_an_event_not_held_is_fetched_once_and_kept(tmp_path):
    world = make_world()
    quoted = world.say("old news")
    world.filler(30)
    reply = world.send("m.room.message", reply_to(quoted, "re: old news"))
    async with reader(world, tmp_path, limit=5) as h:
        await h.engine.sync_once(initial=True)
        await open_settled(h, world.room)
        await h.engine.wait_quotes()
        quote = rows(h, world.room)[reply].in_reply_to
        assert quote is not None and quote.status is ReplyStatus.Ready
        assert quote.body == "old news"
        assert len(context_requests(world)) == 1
    async with reader(world, tmp_path, limit=5) as h:
        await open_settled(h, world.room)
        quote = rows(h, world.room)[reply].in_reply_to
        assert quote is not None and quote.status is ReplyStatus.Ready
        assert len(context_requests(world)) == 1  # kept: never asked again


async def test_a_quote_of_an_event_the_server_will_not_return_says_so(tmp_path):
    world = make_world()
    reply = world.send("m.room.message", reply_to("$gone:example.org", "answering a ghost"))
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        await h.engine.wait_quotes()
        quote = rows(h, world.room)[reply].in_reply_to
        assert quote is not None and quote.status is ReplyStatus.Unavailable
        assert quote.body is None


async def test_a_reply_to_an_event_of_another_room_shows_nothing_of_it(tmp_path):
    world = make_world()
    other = world.fake.create_room("bob", name="other", members=[world.alice.user_id])
    elsewhere = world.fake.send_text("bob", other, "another room's text")
    reply = world.send("m.room.message", reply_to(elsewhere, "cross-room"))
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        await h.engine.wait_quotes()
        quote = rows(h, world.room)[reply].in_reply_to
        assert quote is not None and quote.status is ReplyStatus.Unavailable


async def test_a_reply_chain_loop_ends_at_one_level(tmp_path):
    """a quotes b and b quotes a (a server can hold that: ids are chosen by senders' servers
    in older room versions), c quotes itself: each row quotes one level, no recursion."""
    store = await open_cache(str(tmp_path / "history.sqlite3"))

    def message(n: str, quotes: str) -> ClientEvent:
        return ClientEvent(
            event_id=f"${n}", type="m.room.message", sender="@b:x", origin_server_ts=1,
            content=reply_to(f"${quotes}", f"text {n}"),
        )  # fmt: skip

    events = [message("a", "b"), message("b", "a"), message("c", "c")]
    await write(store, lambda s: s.ingest_sync(events, limited=True, prev_batch="p"))
    window = await store.load_window(ROOM, 10)
    assert window.items is not None
    quotes = {i.event_id: i.in_reply_to for i in window.items}
    assert {k: (q.event_id, q.body) for k, q in quotes.items() if q} == {
        "$a": ("$b", "text b"),
        "$b": ("$a", "text a"),
        "$c": ("$c", "text c"),
    }
    await store.backend.close()


async def test_sending_a_reply_quotes_the_event(tmp_path):
    world = make_world()
    quoted = world.say("question")
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        assert await h.engine.execute(SendMessage(world.room, "answer", in_reply_to=quoted)) == Ok()
        await h.engine.send_queue.wait_sent(1)
        await h.engine.sync_once()
        [mine] = [r for r in rows(h, world.room).values() if r.body == "answer"]
        assert mine.in_reply_to is not None and mine.in_reply_to.body == "question"


# -- reactions ----------------------------------------------------------------------------


async def test_reactions_aggregate_per_key_and_a_redacted_one_goes(tmp_path):
    world = make_world()
    target = world.say("react to me")
    world.send("m.reaction", reaction(target, "👍"))
    world.send("m.reaction", reaction(target, "👍"), by="alice")
    heart = world.send("m.reaction", reaction(target, "❤️"))
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        row = rows(h, world.room)[target]
        assert [(r.key, r.senders) for r in row.reactions] == [
            ("👍", (world.bob.user_id, world.alice.user_id)),
            ("❤️", (world.bob.user_id,)),
        ]
        assert heart not in rows(h, world.room)
        world.fake.redact("bob", world.room, heart)
        await h.engine.sync_once()
        assert [r.key for r in rows(h, world.room)[target].reactions] == ["👍"]


async def test_an_annotation_without_a_key_is_ignored(tmp_path):
    world = make_world()
    target = world.say("no key")
    bad = [
        world.send("m.reaction", reaction(target, None)),
        world.send("m.reaction", reaction(target, "")),
        world.send("m.reaction", {"m.relates_to": {"rel_type": "m.annotation", "key": "x"}}),
    ]
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        got = rows(h, world.room)
        assert got[target].reactions == ()
        assert not any(b in got for b in bad)


async def test_send_reaction_toggles_this_accounts_reaction(tmp_path):
    world = make_world()
    target = world.say("toggle")
    async with reader(world, tmp_path) as h:
        await h.engine.sync_once()
        await open_settled(h, world.room)
        assert await h.engine.execute(SendReaction(world.room, target, "🎉")) == Ok()
        await h.engine.send_queue.wait_sent(1)
        await h.engine.sync_once()
        row = rows(h, world.room)[target]
        assert [(r.key, r.senders) for r in row.reactions] == [("🎉", (world.alice.user_id,))]
        assert await h.engine.execute(SendReaction(world.room, target, "🎉")) == Ok()
        await h.engine.send_queue.wait_sent(2)
        await h.engine.sync_once()
        assert rows(h, world.room)[target].reactions == ()
