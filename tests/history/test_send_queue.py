"""The durable send queue against the in-memory fake homeserver: the Pending row before any
request, the echo becoming the server's event in place, backoff while unreachable with one
transaction id, permanent failures with RetrySend/CancelSend, restart, order, bad rows."""

from __future__ import annotations

import logging
import sqlite3
from collections import Counter
from pathlib import Path

from gapline.history import (
    CancelSend,
    EngineConfig,
    EventItem,
    EventNotFound,
    Failed,
    Invalid,
    Ok,
    OpenRoom,
    RetrySend,
    SendMessage,
    SendQueueChanged,
    SendState,
    SendStateKind,
    Set,
    TimelineChanged,
    TimelineReset,
)
from gapline.matrix.testing import FakeHomeserver
from tests.activity import Gate
from tests.history.test_engine_fake import client_for
from tests.history.test_engine_support import open_engine

FAST = EngineConfig(send_backoff_s=(0.01, 0.05))


def items(h, room: str) -> tuple:
    rows = h.mirror.items(room)
    assert rows is not None, f"{room} is not open in the mirror"
    return rows


def events(items) -> list[EventItem]:
    return [i for i in items if isinstance(i, EventItem)]


def texts(items) -> list[str | None]:
    return [i.body for i in events(items) if i.event_type == "m.room.message"]


def echoes(items) -> list[EventItem]:
    return [i for i in events(items) if i.send_state is not None]


def bodies_on_server(fake: FakeHomeserver, room: str) -> list[str]:
    return [
        e.content["body"]
        for e in fake.events(room)
        if e.type == "m.room.message" and "body" in e.content
    ]


def send_txns(fake: FakeHomeserver) -> list[str]:
    return [r.path.rsplit("/", 1)[-1] for r in fake.requests if r.endpoint == "send"]


async def opened(h, room: str) -> None:
    await h.engine.sync_once()
    assert await h.engine.execute(OpenRoom(room)) == Ok()


async def test_pending_row_comes_before_any_request_and_becomes_the_event(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    gate = Gate(fake.transport, "send")
    async with (
        client_for(fake, alice, transport=gate) as client,
        open_engine(tmp_path, client, config=FAST) as h,
    ):
        await opened(h, room)
        assert await h.engine.execute(SendMessage(room, "hello")) == Ok()
        # Answered, and the row is out, while no send reached the homeserver.
        [echo] = echoes(items(h, room))
        assert echo.body == "hello" and echo.send_state == SendState.PENDING
        assert echo.sender == alice.user_id and echo.id.startswith("echo:")
        assert items(h, room)[-1] == echo
        assert bodies_on_server(fake, room) == []
        assert h.mirror.send_queue == SendQueueChanged(pending=1, failed=0)
        await gate.arrived.wait()
        gate.release()
        await h.engine.send_queue.wait_sent(1)
        before = len(h.recorder.events)
        await h.engine.sync_once()
        # The server's event took the echo's row: same id, one Set, no second row.
        rows = events(items(h, room))
        mine = [r for r in rows if r.body == "hello"]
        assert len(mine) == 1 and mine[0].id == echo.id and mine[0].send_state is None
        assert mine[0].event_id == fake.events(room)[-1].event_id
        diffs = [
            d
            for e in h.recorder.events[before:]
            if isinstance(e, TimelineChanged) and e.room_id == room
            for d in e.diffs
        ]
        assert any(isinstance(d, Set) and d.value == mine[0] for d in diffs)
        assert h.mirror.send_queue == SendQueueChanged(pending=0, failed=0)
        assert tuple(items(h, room)) == h.engine.timeline(room).state.items
        # The queue emptied; the next message goes out as the first did.
        assert await h.engine.execute(SendMessage(room, "again")) == Ok()
        await h.engine.send_queue.wait_sent(2)
    assert bodies_on_server(fake, room) == ["hello", "again"]
    assert len(send_txns(fake)) == 2  # each sent once


async def test_unreachable_homeserver_retries_the_same_transaction_in_order(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    fake.disconnect("send", error="read", times=2, after_processing=True)  # answer lost
    fake.fail("send", status=502, on_call=3, times=2)
    async with client_for(fake, alice) as client, open_engine(tmp_path, client, config=FAST) as h:
        await opened(h, room)
        for text in ("one", "two", "three"):
            assert await h.engine.execute(SendMessage(room, text)) == Ok()
        await h.engine.send_queue.wait_sent(3)
        await h.engine.sync_once()
        assert texts(items(h, room))[-3:] == ["one", "two", "three"]
        assert echoes(items(h, room)) == []
    # The first message went out four times (two answers lost, two 502s) under one id,
    # and the homeserver kept it once; the others followed in order.
    txns = send_txns(fake)
    assert len(txns) == 7 and len(set(txns[:5])) == 1 and len(set(txns)) == 3
    assert bodies_on_server(fake, room) == ["one", "two", "three"]


async def test_a_permanent_refusal_fails_the_row_and_retry_or_cancel_follow(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    fake.fail("send", status=413, errcode="M_TOO_LARGE", times=2)
    async with client_for(fake, alice) as client, open_engine(tmp_path, client, config=FAST) as h:
        await opened(h, room)
        assert await h.engine.execute(SendMessage(room, "big")) == Ok()
        assert await h.engine.execute(SendMessage(room, "bigger")) == Ok()
        assert await h.engine.execute(SendMessage(room, "fine")) == Ok()
        await h.engine.send_queue.wait_sent(1)  # the third one, past the two refused
        big, bigger = echoes(items(h, room))[:2]
        for row, text in ((big, "big"), (bigger, "bigger")):
            assert row.body == text  # the text is kept for the user to edit
            assert row.send_state is not None
            assert row.send_state.kind is SendStateKind.Failed
            assert "too large" in (row.send_state.message or "")
        assert h.mirror.send_queue == SendQueueChanged(pending=1, failed=2)
        assert await h.engine.execute(CancelSend(room, bigger.id)) == Ok()
        assert await h.engine.execute(CancelSend(room, bigger.id)) == EventNotFound()
        assert await h.engine.execute(RetrySend(room, big.id)) == Ok()
        assert echoes(items(h, room))[0].send_state == SendState.PENDING
        await h.engine.send_queue.wait_sent(2)
        await h.engine.sync_once()
        assert [(e.body, e.send_state) for e in echoes(items(h, room))] == []
        assert bodies_on_server(fake, room) == ["fine", "big"]
        assert [r.id for r in events(items(h, room)) if r.body == "big"] == [big.id]
        assert h.mirror.send_queue == SendQueueChanged(pending=0, failed=0)
        # Bad ids answer clearly.
        assert isinstance(await h.engine.execute(RetrySend(room, "$not-an-echo")), Invalid)
        assert await h.engine.execute(RetrySend(room, big.id)) == EventNotFound()
    # No message went out more often than its refusals made it: "big" twice (refused, then
    # retried), the others once.
    assert sorted(Counter(send_txns(fake)).values()) == [1, 1, 2]


async def test_retry_of_a_row_that_did_not_fail_is_invalid(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    gate = Gate(fake.transport, "send")
    async with (
        client_for(fake, alice, transport=gate) as client,
        open_engine(tmp_path, client, config=FAST) as h,
    ):
        await opened(h, room)
        await h.engine.execute(SendMessage(room, "a"))
        await h.engine.execute(SendMessage(room, "b"))
        await gate.arrived.wait()
        first, second = echoes(items(h, room))
        assert isinstance(await h.engine.execute(RetrySend(room, second.id)), Invalid)
        # The one in flight cannot be cancelled; the one behind it can.
        assert isinstance(await h.engine.execute(CancelSend(room, first.id)), Failed)
        assert await h.engine.execute(CancelSend(room, second.id)) == Ok()
        gate.release()
        await h.engine.send_queue.wait_sent(1)
        await h.engine.sync_once()
    assert bodies_on_server(fake, room) == ["a"]


async def test_a_message_queued_offline_is_sent_after_the_next_start(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    fake.disconnect("send", times=None)  # the homeserver is unreachable for sends
    async with client_for(fake, alice) as client, open_engine(tmp_path, client, config=FAST) as h:
        await opened(h, room)
        assert await h.engine.execute(SendMessage(room, "offline 1")) == Ok()
        assert await h.engine.execute(SendMessage(room, "offline 2")) == Ok()
        await fake.wait_requests("send", 2)  # tried, and backing off
    assert bodies_on_server(fake, room) == []
    fake.clear_faults()
    async with client_for(fake, alice) as client, open_engine(tmp_path, client, config=FAST) as h:
        assert h.mirror.send_queue == SendQueueChanged(pending=2, failed=0)
        assert await h.engine.execute(OpenRoom(room)) == Ok()
        [reset] = [e for e in h.recorder.events if isinstance(e, TimelineReset)]
        assert [r.body for r in echoes(reset.items)] == ["offline 1", "offline 2"]
        await h.engine.send_queue.wait_sent(2)
        await h.engine.sync_once()
        assert texts(items(h, room)) == ["offline 1", "offline 2"]
        assert echoes(items(h, room)) == []
    assert bodies_on_server(fake, room) == ["offline 1", "offline 2"]
    assert len(set(send_txns(fake))) == 2  # one transaction id per message, every attempt


async def test_an_event_of_someone_else_between_keeps_the_order_of_the_server(
    tmp_path, fake, alice
):
    room = fake.create_room(alice.user_id, name="r")
    bob = fake.register("bob")
    fake.invite(alice.user_id, room, bob.user_id)
    fake.join(bob.user_id, room)
    async with client_for(fake, alice) as client, open_engine(tmp_path, client, config=FAST) as h:
        await opened(h, room)
        fake.send_messages(bob.user_id, room, ["bob first"])
        assert await h.engine.execute(SendMessage(room, "mine")) == Ok()
        await h.engine.send_queue.wait_sent(1)
        fake.send_messages(bob.user_id, room, ["bob after"])
        await h.engine.sync_once()
        tail = texts(items(h, room))[-3:]
        assert tail == ["bob first", "mine", "bob after"]
        assert tuple(items(h, room)) == h.engine.timeline(room).state.items


async def test_a_thread_reply_shows_in_the_open_thread_and_settles(tmp_path, fake, alice):
    from gapline.history import OpenThread

    room = fake.create_room(alice.user_id, name="r")
    [root] = fake.send_messages(alice.user_id, room, ["root"])
    async with client_for(fake, alice) as client, open_engine(tmp_path, client, config=FAST) as h:
        await opened(h, room)
        assert await h.engine.execute(OpenThread(room, root)) == Ok()
        await h.engine.wait_idle(room, root)
        gate_free = await h.engine.execute(SendMessage(room, "in thread", thread_root=root))
        assert gate_free == Ok()
        thread_rows = h.mirror.state.threads[room][root]
        assert [r.body for r in echoes(thread_rows)] == ["in thread"]
        assert echoes(items(h, room)) == []  # a thread reply is not a row of the room
        await h.engine.send_queue.wait_sent(1)
        await h.engine.sync_once()
        assert echoes(h.mirror.state.threads[room][root]) == []
        assert h.mirror.send_queue == SendQueueChanged(pending=0, failed=0)


async def test_an_unreadable_queue_row_is_skipped_reported_and_the_rest_sent(
    tmp_path: Path, fake, alice, caplog
):
    room = fake.create_room(alice.user_id, name="r")
    fake.disconnect("send", times=None)
    async with client_for(fake, alice) as client, open_engine(tmp_path, client, config=FAST) as h:
        await opened(h, room)
        for text in ("first", "second", "third"):
            await h.engine.execute(SendMessage(room, text))
    db = sqlite3.connect(tmp_path / "history.sqlite3")
    with db:
        (value,) = db.execute("SELECT value FROM history_send WHERE seq = 2").fetchone()
        broken = bytes(value[:-1]) + bytes([value[-1] ^ 1])
        db.execute("UPDATE history_send SET value = ? WHERE seq = 2", (broken,))
    db.close()
    fake.clear_faults()
    caplog.set_level(logging.ERROR, logger="gapline.history")
    async with client_for(fake, alice) as client, open_engine(tmp_path, client, config=FAST) as h:
        await h.engine.send_queue.wait_sent(2)
        assert [c.seq for c in h.engine.store.sends.corrupt.values()] == [2]
        assert any("cannot be read" in r.getMessage() for r in caplog.records)
        await opened(h, room)
        await h.engine.sync_once()
        assert texts(items(h, room)) == ["first", "third"]
    assert bodies_on_server(fake, room) == ["first", "third"]


async def test_sending_into_a_room_left_fails_with_a_clear_reason(tmp_path, fake, alice):
    room = fake.create_room(alice.user_id, name="r")
    async with client_for(fake, alice) as client, open_engine(tmp_path, client, config=FAST) as h:
        await opened(h, room)
        fake.leave(alice.user_id, room)
        assert await h.engine.execute(SendMessage(room, "anyone?")) == Ok()
        await h.engine.send_queue.wait_failed(1)
        [row] = echoes(items(h, room))
        assert row.body == "anyone?" and row.send_state is not None
        assert row.send_state.kind is SendStateKind.Failed
        assert "does not let you send" in (row.send_state.message or "")


async def test_reactions_edits_and_redactions_wait_in_the_queue_in_order(tmp_path, fake, alice):
    from gapline.history import EditMessage, RedactEvent, SendReaction

    room = fake.create_room(alice.user_id, name="r")
    mine, other = fake.send_messages(alice.user_id, room, ["tpyo", "delete me"])
    async with client_for(fake, alice) as client, open_engine(tmp_path, client, config=FAST) as h:
        await opened(h, room)
        before = items(h, room)
        fake.disconnect("send", times=None)
        fake.disconnect("redact", times=None)
        assert await h.engine.execute(SendReaction(room, mine, "👍")) == Ok()
        assert await h.engine.execute(EditMessage(room, mine, "typo")) == Ok()
        assert await h.engine.execute(RedactEvent(room, other, reason="oops")) == Ok()
        assert items(h, room) == before  # none of them is a row while it waits
        assert h.mirror.send_queue == SendQueueChanged(pending=3, failed=0)
        await fake.wait_requests("send", 1)
        fake.clear_faults()
        await h.engine.send_queue.wait_sent(3)
        await h.engine.sync_once()
        by_id = {r.event_id: r for r in events(items(h, room))}
        assert by_id[mine].body == "typo" and by_id[mine].edited
        assert [(r.key, r.senders) for r in by_id[mine].reactions] == [("👍", (alice.user_id,))]
        assert by_id[other].redacted
        assert echoes(items(h, room)) == []
        assert h.mirror.send_queue == SendQueueChanged(pending=0, failed=0)


async def test_a_refused_reaction_becomes_a_row_to_retry_or_discard(tmp_path, fake, alice):
    from gapline.history import RedactEvent, SendReaction

    room = fake.create_room(alice.user_id, name="r")
    [target] = fake.send_messages(alice.user_id, room, ["react to me"])
    fake.fail("send", status=403, errcode="M_FORBIDDEN", times=1)
    fake.fail("redact", status=403, errcode="M_FORBIDDEN", times=1)
    async with client_for(fake, alice) as client, open_engine(tmp_path, client, config=FAST) as h:
        await opened(h, room)
        assert await h.engine.execute(SendReaction(room, target, "🎉")) == Ok()
        assert await h.engine.execute(RedactEvent(room, target)) == Ok()
        await h.engine.send_queue.wait_failed(2)
        reaction, redaction = echoes(items(h, room))
        assert reaction.body == "reaction 🎉" and redaction.body == "deletion of a message"
        assert reaction.send_state is not None and reaction.send_state.kind is SendStateKind.Failed
        assert await h.engine.execute(CancelSend(room, redaction.id)) == Ok()
        assert await h.engine.execute(RetrySend(room, reaction.id)) == Ok()
        assert echoes(items(h, room)) == []  # waiting again: not a row
        await h.engine.send_queue.wait_sent(1)
        await h.engine.sync_once()
        [row] = [r for r in events(items(h, room)) if r.event_id == target]
        assert [r.key for r in row.reactions] == ["🎉"] and not row.redacted
