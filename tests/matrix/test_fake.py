"""The fake homeserver: its Synapse-like model and its fault knobs."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

import pytest

from gapline.matrix import (
    MatrixClient,
    MatrixHTTPError,
    MatrixProtocolError,
    MatrixUnavailable,
    MessagesResponse,
    NotFound,
    RetryPolicy,
    Session,
    UnknownToken,
)
from gapline.matrix.testing import FakeHomeserver, Fault, FaultKind

NO_RETRY = RetryPolicy(attempts=1, rate_limit_attempts=1)
World = tuple[Session, Session, str, list[str]]


@pytest.fixture
def fake() -> FakeHomeserver:
    return FakeHomeserver()


@pytest.fixture
def world(fake: FakeHomeserver) -> World:
    alice = fake.register("alice")
    bob = fake.register("bob")
    room = fake.create_room(alice.user_id, name="demo", members=[bob.user_id])
    sent = fake.send_messages(alice.user_id, room, [f"m{i}" for i in range(120)])
    return alice, bob, room, sent


async def page_back(client: MatrixClient, room: str, limit: int = 50) -> list[MessagesResponse]:
    pages = []
    token = None
    while True:
        page = await client.messages(room, from_=token, dir="b", limit=limit)
        pages.append(page)
        if page.end is None:
            return pages
        assert len(pages) < 100
        token = page.end


async def test_backward_pagination_matches_synapse(fake: FakeHomeserver, world: World) -> None:
    _, bob, room, sent = world
    async with fake.client(bob) as client:
        pages = await page_back(client, room)
    create_at = [i for i, p in enumerate(pages) if any(e.type == "m.room.create" for e in p.chunk)]
    assert create_at == [len(pages) - 2]
    assert pages[-2].end is not None  # the page holding m.room.create still has `end`
    assert pages[-1].chunk == [] and pages[-1].end is None
    events = [e for p in pages for e in p.chunk]
    assert [e.event_id for e in events] == list(reversed(fake.event_ids(room)))
    assert [e.event_id for e in events if e.type == "m.room.message"] == list(reversed(sent))
    for page in pages:
        assert re.fullmatch(r"t\d+-\d+(_0)+", page.start)


async def test_forward_pagination_and_to(fake: FakeHomeserver, world: World) -> None:
    alice, _, room, _ = world
    async with fake.client(alice) as client:
        first = await client.messages(room, dir="f", limit=30)
        second = await client.messages(room, dir="f", from_=first.end, limit=30)
        assert [e.event_id for e in first.chunk + second.chunk] == fake.event_ids(room)[:60]
        bounded = await client.messages(room, dir="b", from_=second.end, to=first.end, limit=100)
        assert [e.event_id for e in bounded.chunk] == list(reversed(fake.event_ids(room)[30:60]))


async def test_limited_sync_prev_batch_leads_into_the_gap(
    fake: FakeHomeserver, world: World
) -> None:
    alice, bob, room, _ = world
    async with fake.client(bob) as client:
        first = await client.sync(timeline_limit=5)
        joined = first.rooms.join[room]
        assert joined.timeline.limited and joined.timeline.prev_batch
        assert any(e.type == "m.room.create" for e in joined.state.events)
        assert [e.event_id for e in joined.timeline.events] == fake.event_ids(room)[-5:]
        more = fake.send_messages(alice.user_id, room, [f"n{i}" for i in range(8)])
        later = await client.sync(since=first.next_batch, timeline_limit=3)
        timeline = later.rooms.join[room].timeline
        assert timeline.limited
        assert [e.event_id for e in timeline.events] == more[-3:]
        page = await client.messages(room, from_=timeline.prev_batch, limit=5)
        assert [e.event_id for e in page.chunk] == list(reversed(more[:5]))
        quiet = fake.send_text(alice.user_id, room, "one more")
        small = await client.sync(since=later.next_batch, timeline_limit=3)
        assert not small.rooms.join[room].timeline.limited
        assert [e.event_id for e in small.rooms.join[room].timeline.events] == [quiet]
        nothing = await client.sync(since=small.next_batch, timeout_ms=0)
        assert nothing.rooms.join == {}


async def test_sync_long_poll_wakes_on_new_event(fake: FakeHomeserver, world: World) -> None:
    alice, bob, room, _ = world
    async with fake.client(bob) as client, fake.client(alice) as sender:
        first = await client.sync(timeline_limit=1)
        waiting = asyncio.create_task(client.sync(since=first.next_batch, timeout_ms=60_000))
        await fake.wait_requests("sync", 2)  # the long-poll has arrived and is waiting
        event_id = await sender.send_text(room, "wake up")
        answer = await asyncio.wait_for(waiting, 30)
    assert [e.event_id for e in answer.rooms.join[room].timeline.events] == [event_id]


async def test_receipts_markers_invites_and_leaves_in_sync(
    fake: FakeHomeserver, world: World
) -> None:
    alice, bob, room, sent = world
    carol = fake.register("carol")
    async with fake.client(bob) as client:
        base = await client.sync(timeline_limit=1)
        await client.set_read_markers(room, fully_read=sent[10], read=sent[11])
        await client.send_receipt(room, sent[12])
        answer = await client.sync(since=base.next_batch)
        joined = answer.rooms.join[room]
        assert joined.fully_read == sent[10]
        assert set(joined.receipts) == {sent[11], sent[12]}
        assert await client.account_data("m.fully_read", room_id=room) == {"event_id": sent[10]}
    async with fake.client(carol) as client:
        base = await client.sync()
        fake.invite(alice.user_id, room, carol.user_id)
        invited = await client.sync(since=base.next_batch)
        assert room in invited.rooms.invite
        await client.join(room)
        await client.leave(room)
        left = await client.sync(since=invited.next_batch)
        assert room in left.rooms.leave
        assert left.rooms.leave[room].timeline.events[-1].content["membership"] == "leave"
    async with fake.client(bob) as client:
        base = await client.sync(timeline_limit=1)
        kick = fake.kick(alice.user_id, room, bob.user_id, reason="bye")
        kicked = await client.sync(since=base.next_batch)
        (last,) = kicked.rooms.leave[room].timeline.events[-1:]
        assert last.event_id == kick and last.sender == alice.user_id
        assert last.state_key == bob.user_id
        later = fake.send_text(alice.user_id, room, "after the kick")
        page = await client.messages(room, limit=3)
        assert page.chunk[0].event_id == kick  # reading is clamped at the departure
        assert later not in {e.event_id for e in page.chunk}


async def test_relations_recurse_and_paging(fake: FakeHomeserver, world: World) -> None:
    alice, _, room, _ = world
    root = fake.send_text(alice.user_id, room, "root")
    thread = [
        fake.send_event(
            alice.user_id,
            room,
            "m.room.message",
            {"body": f"t{i}", "m.relates_to": {"rel_type": "m.thread", "event_id": root}},
        )
        for i in range(7)
    ]
    edit = fake.send_event(
        alice.user_id,
        room,
        "m.room.message",
        {"body": "* e", "m.relates_to": {"rel_type": "m.replace", "event_id": thread[0]}},
    )
    async with fake.client(alice) as client:
        first = await client.relations(room, root)
        assert [e.event_id for e in first.chunk] == list(reversed(thread))[:5]
        assert first.next_batch is not None and first.recursion_depth is None
        second = await client.relations(room, root, from_=first.next_batch)
        assert [e.event_id for e in second.chunk] == list(reversed(thread))[5:]
        assert second.next_batch is None
        deep = await client.relations(room, root, recurse=True, limit=50)
        assert {e.event_id for e in deep.chunk} == {*thread, edit}
        assert deep.recursion_depth == 3
        edits = await client.relations(room, thread[0], rel_type="m.replace")
        assert [e.event_id for e in edits.chunk] == [edit]
        with pytest.raises(NotFound):
            await client.relations(room, "$missing")


async def test_redaction_and_idempotent_send(fake: FakeHomeserver, world: World) -> None:
    alice, _, room, sent = world
    async with fake.client(alice) as client:
        redaction = await client.redact(room, sent[0], reason="x")
        event = await client.get_event(room, sent[0])
        assert event.content == {} and event.redacted_because is not None
        assert event.redacted_because["event_id"] == redaction
        again = await client.get_event(room, redaction)
        assert again.redacted_event_id == sent[0]
        one = await client.send_text(room, "once", txn_id="t1")
        two = await client.send_text(room, "once", txn_id="t1")
        assert one == two
        assert fake.event_ids(room).count(one) == 1


async def test_history_visibility_gives_empty_pages_with_end(
    fake: FakeHomeserver, world: World
) -> None:
    _, bob, room, sent = world
    fake.hide_history_before(room, sent[100])
    async with fake.client(bob) as client:
        pages = await page_back(client, room, limit=5)
    visible = [e.event_id for p in pages for e in p.chunk]
    assert visible == list(reversed(sent[100:]))
    hidden_pages = pages[4:-1]
    assert hidden_pages and all(p.chunk == [] and p.end is not None for p in hidden_pages)
    assert pages[-1].end is None


async def test_ids_with_reserved_characters(fake: FakeHomeserver) -> None:
    alice = fake.register("alice")
    room = fake.create_room(alice.user_id, room_id="!we/ird#id?x:example.org")
    async with fake.client(alice) as client:
        event_id = await client.send_text(room, "ok")
        assert (await client.get_event(room, event_id)).room_id == room
        await client.put_state(room, "org.x", {"a": 1}, state_key="k/e#y")
        assert await client.get_state(room, "org.x", "k/e#y") == {"a": 1}
    assert fake.requests[0].path.startswith("/_matrix/client/v3/rooms/%21we%2Fird%23id%3Fx")
    assert fake.requests[0].room_id == room and fake.requests[0].authorized


async def test_bad_tokens_and_auth(fake: FakeHomeserver, world: World) -> None:
    alice, _, room, _ = world
    async with fake.client(alice) as client:
        with pytest.raises(MatrixHTTPError) as info:
            await client.messages(room, from_="garbage")
        assert info.value.errcode == "M_INVALID_PARAM"
        fake.revoke(alice)
        with pytest.raises(UnknownToken):
            await client.whoami()
    stranger = fake.register("stranger")
    async with fake.client(stranger) as client:
        with pytest.raises(MatrixHTTPError) as info:
            await client.messages(room)
        assert info.value.status == 403


async def test_token_in_url_is_refused(fake: FakeHomeserver) -> None:
    import httpx

    alice = fake.register("alice")
    async with httpx.AsyncClient(transport=fake.transport, base_url=fake.base_url) as http:
        answer = await http.get(
            "/_matrix/client/v3/account/whoami", params={"access_token": alice.access_token}
        )
    assert answer.status_code == 400


async def test_login_register_and_device_reuse(fake: FakeHomeserver) -> None:
    async with fake.client() as client:
        session = await client.register("dave", "pw")
        again = await client.login("dave", "pw", device_id=session.device_id)
        assert again.device_id == session.device_id and again.user_id == "@dave:example.org"
        assert (await client.whoami()).device_id == session.device_id
        with pytest.raises(MatrixHTTPError) as info:
            await client.login("dave", "wrong")
        assert info.value.status == 403


# -- faults -------------------------------------------------------------------------------


async def test_fail_page_n(fake: FakeHomeserver, world: World) -> None:
    alice, _, room, _ = world
    fault = fake.fail("messages", 502, on_call=2)
    async with fake.client(alice, retry=NO_RETRY) as client:
        first = await client.messages(room, limit=10)
        with pytest.raises(MatrixUnavailable) as info:
            await client.messages(room, from_=first.end, limit=10)
        assert info.value.status == 502
        retried = await client.messages(room, from_=first.end, limit=10)
    assert len(retried.chunk) == 10 and fault.fired == 1 and fault.seen == 3


async def test_client_retries_through_a_transient_fault(fake: FakeHomeserver, world: World) -> None:
    alice, _, room, _ = world
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    fake.fail("messages", 500, times=2)
    fake.rate_limit("sync", retry_after_ms=250)
    async with fake.client(alice, sleep=sleep) as client:
        page = await client.messages(room, limit=3)
        await client.sync(timeline_limit=1)
    assert len(page.chunk) == 3
    assert len(sleeps) == 3 and sleeps[-1] == 0.25


async def test_repeat_cursor(fake: FakeHomeserver, world: World) -> None:
    alice, _, room, _ = world
    async with fake.client(alice) as client:
        first = await client.messages(room, limit=10)
        fake.repeat_cursor("messages")
        stuck = await client.messages(room, from_=first.end, limit=10)
        assert stuck.end == first.end
        fake.repeat_cursor("messages")
        top = await client.messages(room, limit=10)
        assert top.end == top.start
        base = await client.sync()
        fake.repeat_cursor("sync")
        fake.send_text(alice.user_id, room, "x")
        again = await client.sync(since=base.next_batch)
        assert again.next_batch == base.next_batch


@pytest.mark.parametrize(
    ("install", "error"),
    [
        (lambda f: f.timeout("messages"), MatrixUnavailable),
        (lambda f: f.disconnect("messages"), MatrixUnavailable),
        (lambda f: f.disconnect("messages", error="read"), MatrixUnavailable),
        (lambda f: f.truncate("messages"), MatrixProtocolError),
        (lambda f: f.malformed("messages"), MatrixProtocolError),
        (lambda f: f.unknown_token("messages"), UnknownToken),
    ],
)
async def test_fault_kinds_surface_as_typed_errors(
    fake: FakeHomeserver,
    world: World,
    install: Callable[[FakeHomeserver], Fault],
    error: type[Exception],
) -> None:
    alice, _, room, _ = world
    fault = install(fake)
    async with fake.client(alice, retry=NO_RETRY) as client:
        with pytest.raises(error):
            await client.messages(room, limit=5)
        page = await client.messages(room, limit=5)  # one-shot: the next call is fine
    assert len(page.chunk) == 5 and fault.fired == 1


async def test_malformed_and_truncated_sync(fake: FakeHomeserver, world: World) -> None:
    _, bob, _, _ = world
    fake.truncate("sync")
    fake.malformed("sync", on_call=2)
    async with fake.client(bob, retry=NO_RETRY) as client:
        with pytest.raises(MatrixProtocolError):
            await client.sync()
        with pytest.raises(MatrixProtocolError):
            await client.sync()


async def test_stall_can_be_cancelled(fake: FakeHomeserver, world: World) -> None:
    alice, _, room, _ = world
    stalled = fake.stall("messages", 3600)
    async with fake.client(alice) as client:
        task = asyncio.create_task(client.messages(room))
        await stalled.struck.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    short = fake.stall("messages", 0.001)
    async with fake.client(alice) as client:
        assert len((await client.messages(room, limit=2)).chunk) == 2
    assert short.fired == 1


async def test_struck_is_set_when_the_fault_first_strikes(
    fake: FakeHomeserver, world: World
) -> None:
    alice, _, room, _ = world
    stalled = fake.stall("messages", 3600, on_call=2)
    failed = fake.fail("sync")
    assert not stalled.struck.is_set() and not failed.struck.is_set()
    async with fake.client(alice, retry=NO_RETRY) as client:
        await client.messages(room, limit=1)  # counted, not due
        assert stalled.seen == 1 and not stalled.struck.is_set()
        task = asyncio.create_task(client.messages(room, limit=1))
        await asyncio.wait_for(stalled.struck.wait(), 30)
        assert stalled.fired == 1 and not task.done()  # arrived, and still stalling
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(MatrixUnavailable):
            await client.sync()
    assert failed.struck.is_set() and failed.fired == 1


async def test_wait_requests_counts_arrivals_per_endpoint_and_room(
    fake: FakeHomeserver, world: World
) -> None:
    alice, _, room, _ = world
    other = fake.create_room(alice.user_id)
    fake.stall("messages", 3600, times=None)  # every /messages request hangs once it arrives
    async with fake.client(alice) as client:
        in_room = asyncio.create_task(fake.wait_requests("messages", 2, room_id=room))
        pending = [
            asyncio.create_task(client.messages(room)),
            asyncio.create_task(client.messages(other)),
        ]
        await asyncio.wait_for(fake.wait_requests("messages", 2), 30)
        assert not in_room.done()  # one of the two went to the other room
        pending.append(asyncio.create_task(client.messages(room)))
        await asyncio.wait_for(in_room, 30)
        await fake.wait_requests("*", 3)  # already true: returns at once
        assert [r.room_id for r in fake.requests].count(room) == 2
        assert not any(task.done() for task in pending)  # all three are still stalled
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    with pytest.raises(ValueError, match="unknown endpoint"):
        await fake.wait_requests("mesages")


async def test_fault_scoping(fake: FakeHomeserver, world: World) -> None:
    alice, _, room, _ = world
    other = fake.create_room(alice.user_id)
    forever = fake.fail("messages", 503, times=None, room_id=room)
    async with fake.client(alice, retry=NO_RETRY) as client:
        for _ in range(3):
            with pytest.raises(MatrixUnavailable):
                await client.messages(room)
        assert (await client.messages(other)).start
        assert forever.fired == 3
        fake.clear_faults()
        assert (await client.messages(room)).chunk
    with pytest.raises(ValueError):
        fake.fail("no-such-endpoint")
    wildcard = fake.add_fault(Fault(FaultKind.FAIL, "*", status=500))
    async with fake.client(alice, retry=NO_RETRY) as client:
        with pytest.raises(MatrixUnavailable):
            await client.whoami()
    assert wildcard.fired == 1


async def test_request_log(fake: FakeHomeserver, world: World) -> None:
    alice, _, room, _ = world
    async with fake.client(alice) as client:
        await client.messages(room, limit=7)
        await client.versions()
    messages, versions = fake.requests[-2:]
    assert messages.endpoint == "messages" and messages.query["limit"] == "7"
    assert messages.authorized and not versions.authorized
    assert all("access_token" not in r.query for r in fake.requests)


async def test_answer_lost_after_processing_then_txn_retry_dedupes(
    fake: FakeHomeserver, world: World
) -> None:
    alice, _, room, _ = world
    before = len(fake.event_ids(room))
    lost = fake.timeout("send", after_processing=True)
    fake.disconnect("send", after_processing=True, on_call=2)
    async with fake.client(alice, retry=NO_RETRY) as client:
        with pytest.raises(MatrixUnavailable):
            await client.send_text(room, "landed", txn_id="t-1")
        assert len(fake.event_ids(room)) == before + 1  # it landed; only the answer was lost
        with pytest.raises(MatrixUnavailable):
            await client.send_text(room, "landed", txn_id="t-1")
        event_id = await client.send_text(room, "landed", txn_id="t-1")
    assert fake.event_ids(room)[-1] == event_id
    assert len(fake.event_ids(room)) == before + 1 and lost.fired == 1
    async with fake.client(alice) as client:  # with retries, the client hides it entirely
        fake.fail("send", 502, after_processing=True)
        again = await client.send_text(room, "twice?", txn_id="t-2")
    assert fake.event_ids(room)[-1] == again and len(fake.event_ids(room)) == before + 2
