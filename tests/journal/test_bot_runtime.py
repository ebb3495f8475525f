"""The whole bot in-process on the fake homeserver and a real SQLite journal."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gapline.journal import (
    SIDECAR_KEY,
    STREAM_STATUS_KEY,
    Bot,
    BotConfig,
    Conversation,
    ConversationKey,
    Final,
    Handler,
    HandlerStream,
    Progress,
    TriggerMessage,
    TurnState,
    echo,
)
from gapline.matrix import ClientEvent, UnknownToken
from gapline.matrix.testing import FakeHomeserver
from gapline.storage import open_backend
from tests.activity import Activity
from tests.journal.bots import bot_running

T = TypeVar("T")


async def eventually(probe: Callable[[], Awaitable[T]], what: str, within: float = 20) -> T:
    """Wait until ``probe`` holds, re-checked whenever the bot (wired by :func:`bot_on`)
    answered a request or committed a write."""
    return await Activity.current().until(probe, what=what, within=within)


@contextlib.asynccontextmanager
async def bot_on(
    fake: FakeHomeserver, store: Path, *, handler: Handler = echo, **config: Any
) -> AsyncGenerator[Bot]:
    fake.register("bot")
    backend = await open_backend(str(store))
    try:
        async with bot_running(
            fake, backend, store=str(store), handler=handler, within=20, **config
        ) as bot:
            yield bot
    finally:
        await backend.close()


def bot_events(fake: FakeHomeserver, room: str) -> list[ClientEvent]:
    return [
        e
        for e in fake.events(room)
        if e.sender == fake.user_id("bot") and e.type == "m.room.message"
    ]


async def test_echo_streams_and_answers_in_the_thread(tmp_path: Path) -> None:
    fake = FakeHomeserver()
    fake.register("alice")
    alice = fake.user_id("alice")
    room = fake.create_room(alice)
    async with bot_on(fake, tmp_path / "j.sqlite3", allow_inviters=frozenset({alice})) as bot:
        fake.invite(alice, room, fake.user_id("bot"))
        await eventually(lambda: _joined(fake, room), "the bot to join")
        root = fake.send_text(alice, room, "root")
        reply = fake.send_event(
            alice,
            room,
            "m.room.message",
            {
                "msgtype": "m.text",
                "body": "in thread",
                "m.relates_to": {"rel_type": "m.thread", "event_id": root},
            },
        )
        assert bot.journal is not None
        journal = bot.journal

        async def done() -> bool:
            turns = [await journal.turn(root), await journal.turn(reply)]
            return all(t is not None and t.state is TurnState.DELIVERED for t in turns)

        await eventually(done, "both answers delivered")
        events = bot_events(fake, room)
        originals = [e for e in events if "m.new_content" not in e.content]
        by_source = {e.content["m.relates_to"]["m.in_reply_to"]["event_id"]: e for e in originals}
        assert set(by_source) == {root, reply}
        assert "rel_type" not in by_source[root].content["m.relates_to"]
        assert by_source[reply].content["m.relates_to"]["rel_type"] == "m.thread"
        assert by_source[reply].content["m.relates_to"]["event_id"] == root
        for source, body in ((root, "root"), (reply, "in thread")):
            placeholder = by_source[source].event_id
            edits = [
                e.content["m.new_content"]
                for e in events
                if e.content.get("m.relates_to", {}).get("event_id") == placeholder
                and e.content["m.relates_to"].get("rel_type") == "m.replace"
            ]
            statuses = [c[STREAM_STATUS_KEY] for c in edits]
            assert statuses.count("streaming") >= 2
            assert statuses[-1] == "complete"
            assert edits[-1]["body"] == f"echo: {body}"

        # Progress edits never reach the projection; the final body does.
        async def projected() -> bool:
            page = await journal.read_conversation(room, root, 10)
            return [r.body for r in page.rows] == ["in thread", "echo: in thread"]

        await eventually(projected, "the thread projected at final bodies")


async def _joined(fake: FakeHomeserver, room: str) -> bool:
    return any(
        e.type == "m.room.member"
        and e.state_key == fake.user_id("bot")
        and e.content.get("membership") == "join"
        for e in fake.events(room)
    )


async def test_invites_from_other_inviters_are_rejected(tmp_path: Path) -> None:
    fake = FakeHomeserver()
    for name in ("alice", "mallory"):
        fake.register(name)
    alice, mallory = fake.user_id("alice"), fake.user_id("mallory")
    bad = fake.create_room(mallory)
    good = fake.create_room(alice)
    async with bot_on(fake, tmp_path / "j.sqlite3", allow_inviters=frozenset({alice})):
        fake.invite(mallory, bad, fake.user_id("bot"))
        fake.invite(alice, good, fake.user_id("bot"))
        await eventually(lambda: _joined(fake, good), "the allowed invite joined")

        async def rejected() -> bool:
            return any(
                e.type == "m.room.member"
                and e.state_key == fake.user_id("bot")
                and e.content.get("membership") == "leave"
                for e in fake.events(bad)
            )

        await eventually(rejected, "the other invite rejected")
        assert not await _joined(fake, bad)


async def test_a_long_answer_is_a_preview_plus_a_resolved_sidecar(tmp_path: Path) -> None:
    fake = FakeHomeserver()
    fake.register("alice")
    alice = fake.user_id("alice")
    room = fake.create_room(alice)
    long_text = "word " * 400

    async def verbose(conversation: Conversation, message: TriggerMessage) -> HandlerStream:
        yield Progress("thinking")
        yield Final(long_text)

    async with bot_on(fake, tmp_path / "j.sqlite3", handler=verbose, sidecar_limit=100) as bot:
        fake.invite(alice, room, fake.user_id("bot"))
        await eventually(lambda: _joined(fake, room), "the bot to join")
        source = fake.send_text(alice, room, "tell me everything")
        assert bot.journal is not None and bot.reader is not None
        journal, reader = bot.journal, bot.reader

        async def done() -> bool:
            turn = await journal.turn(source)
            return turn is not None and turn.state is TurnState.DELIVERED

        await eventually(done, "the answer delivered")
        final = [
            e
            for e in bot_events(fake, room)
            if e.content.get("m.new_content", {}).get(STREAM_STATUS_KEY) == "complete"
        ]
        assert len(final) == 1
        visible = final[0].content["m.new_content"]
        assert len(visible["body"]) < len(long_text)
        assert visible[SIDECAR_KEY]["size"] == len(long_text.encode())

        # The projection holds the resolved full text, never the preview.
        async def resolved() -> bool:
            page = await reader.read(ConversationKey(room), limit=10)
            return any(r.body == long_text for r in page.rows)

        await eventually(resolved, "the full text projected")
        page = await reader.read(ConversationKey(room), limit=10)
        assert all(r.body != visible["body"] for r in page.rows)


async def test_a_failing_handler_leaves_the_event_pending(tmp_path: Path) -> None:
    fake = FakeHomeserver()
    fake.register("alice")
    alice = fake.user_id("alice")
    room = fake.create_room(alice)
    calls = 0

    async def broken(conversation: Conversation, message: TriggerMessage) -> HandlerStream:
        nonlocal calls
        calls += 1
        yield Progress("about to fail")
        raise RuntimeError("model unavailable")

    async with bot_on(fake, tmp_path / "j.sqlite3", handler=broken) as bot:
        fake.invite(alice, room, fake.user_id("bot"))
        await eventually(lambda: _joined(fake, room), "the bot to join")
        source = fake.send_text(alice, room, "hello")
        assert bot.journal is not None
        journal = bot.journal

        async def tried() -> bool:
            return calls >= 1

        await eventually(tried, "the handler to run")
        pending = [p.event.event_id for p in await journal.pending(10)]
        assert source in pending
        turn = await journal.turn(source)
        assert turn is not None and turn.state is TurnState.OPEN


async def test_a_handler_reads_the_conversation_of_its_message(tmp_path: Path) -> None:
    fake = FakeHomeserver()
    fake.register("alice")
    alice = fake.user_id("alice")
    room = fake.create_room(alice)
    seen: list[list[str]] = []

    async def recall(conversation: Conversation, message: TriggerMessage) -> HandlerStream:
        rows = await conversation.read(limit=10, strict=True)
        seen.append([r.body for r in rows])
        yield Progress("counting")
        yield Final(f"{len(rows)} messages")

    async with bot_on(fake, tmp_path / "j.sqlite3", handler=recall) as bot:
        fake.invite(alice, room, fake.user_id("bot"))
        await eventually(lambda: _joined(fake, room), "the bot to join")
        first = fake.send_text(alice, room, "first")
        assert bot.journal is not None
        journal = bot.journal

        async def answered(source: str) -> bool:
            turn = await journal.turn(source)
            return turn is not None and turn.state is TurnState.DELIVERED

        await eventually(lambda: answered(first), "the first answer")
        second = fake.send_text(alice, room, "second")
        await eventually(lambda: answered(second), "the second answer")
    # The conversation is the room's, oldest first, including the triggering message.
    # (It also holds this turn's own placeholder reply: its logical identity is
    # persisted from the start; only progress edits are transport.)
    assert "first" in seen[0]
    # By the second turn the first answer is projected at its final body, and no
    # progress text was ever in the projection.
    assert seen[1].index("first") < seen[1].index("second")
    assert f"{len(seen[0])} messages" in seen[1]
    assert all("counting" not in b for rows in seen for b in rows)


async def test_a_dead_login_stops_the_bot_with_that_error(tmp_path: Path) -> None:
    fake = FakeHomeserver()
    fake.register("bot")
    fake.unknown_token("sync", times=None)
    bot = Bot(
        BotConfig(
            homeserver=fake.base_url,
            user=fake.user_id("bot"),
            password="password",
            store=str(tmp_path / "j.sqlite3"),
            handler=echo,
        ),
        transport=fake.transport,
    )
    with pytest.raises(UnknownToken):
        await asyncio.wait_for(bot.run(), 20)


async def test_messages_from_before_the_join_are_context_not_turns(tmp_path: Path) -> None:
    fake = FakeHomeserver()
    fake.register("alice")
    alice = fake.user_id("alice")
    room = fake.create_room(alice)
    earlier = fake.send_messages(alice, room, [f"before {i}" for i in range(3)])
    async with bot_on(fake, tmp_path / "j.sqlite3") as bot:
        fake.invite(alice, room, fake.user_id("bot"))
        await eventually(lambda: _joined(fake, room), "the bot to join")
        after = fake.send_text(alice, room, "after")
        assert bot.journal is not None
        journal = bot.journal

        async def answered() -> bool:
            turn = await journal.turn(after)
            return turn is not None and turn.state is TurnState.DELIVERED

        await eventually(answered, "the message after the join answered")
        assert [await journal.turn(e) for e in earlier] == [None, None, None]
        # They are still part of the conversation: a read hydrates the cold room.
        assert bot.reader is not None
        page = await bot.reader.read(ConversationKey(room), limit=20)
        assert [r.body for r in page.rows if r.sender == alice] == [
            *(f"before {i}" for i in range(3)),
            "after",
        ]
        assert [await journal.turn(e) for e in earlier] == [None, None, None]
