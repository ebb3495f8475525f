"""One set of behaviour checks, run against the fake homeserver AND real Synapse.

This is what keeps `gapline.matrix.testing.FakeHomeserver` honest: every
scenario here passes on both, so engines tested on the fake meet the same
pagination, sync and relations behaviour on a real server.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, Protocol

import pytest

from gapline.matrix import MatrixClient, MatrixHTTPError, MessagesResponse, Session
from gapline.matrix.testing import FakeHomeserver


class Harness(Protocol):
    async def user(self, name: str = "user") -> Session: ...
    async def room(self, owner: Session, *members: Session, name: str | None = None) -> str: ...
    def client(self, session: Session | None = None, **kwargs: Any) -> MatrixClient: ...
    async def send_messages(
        self, session: Session, room_id: str, bodies: list[str]
    ) -> list[str]: ...


class FakeKit:
    """The `SynapseKit` interface over a `FakeHomeserver`, going through HTTP like it."""

    def __init__(self, fake: FakeHomeserver) -> None:
        self.fake = fake
        self._n = itertools.count(1)

    async def user(self, name: str = "user") -> Session:
        async with self.fake.client() as client:
            return await client.register(f"{name}_{next(self._n)}", "password")

    async def room(self, owner: Session, *members: Session, name: str | None = None) -> str:
        async with self.fake.client(owner) as client:
            room_id = await client.create_room(name=name, preset="private_chat")
            for member in members:
                await client.invite(room_id, member.user_id)
        for member in members:
            async with self.fake.client(member) as client:
                await client.join(room_id)
        return room_id

    def client(self, session: Session | None = None, **kwargs: Any) -> MatrixClient:
        return self.fake.client(session, **kwargs)

    async def send_messages(self, session: Session, room_id: str, bodies: list[str]) -> list[str]:
        async with self.fake.client(session) as client:
            return [await client.send_text(room_id, body) for body in bodies]


@pytest.fixture(params=["fake", pytest.param("synapse", marks=pytest.mark.synapse)])
def hs(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "fake":
        yield FakeKit(FakeHomeserver())
    else:
        yield request.getfixturevalue("synapse_kit")


async def _page_back(client: MatrixClient, room: str, limit: int) -> list[MessagesResponse]:
    pages: list[MessagesResponse] = []
    token = None
    while True:
        page = await client.messages(room, from_=token, dir="b", limit=limit)
        pages.append(page)
        if page.end is None:
            return pages
        assert len(pages) < 60
        token = page.end


async def test_backward_pagination_end_semantics(hs: Harness) -> None:
    alice = await hs.user("alice")
    room = await hs.room(alice)
    sent = await hs.send_messages(alice, room, [f"m{i}" for i in range(23)])
    async with hs.client(alice) as client:
        pages = await _page_back(client, room, limit=10)
    holding = [i for i, p in enumerate(pages) if any(e.type == "m.room.create" for e in p.chunk)]
    assert holding == [len(pages) - 2]
    assert pages[-2].end is not None
    assert pages[-1].chunk == [] and pages[-1].end is None
    messages = [e.event_id for p in pages for e in p.chunk if e.type == "m.room.message"]
    assert messages == list(reversed(sent))
    assert all(len(p.chunk) == 10 for p in pages[:2])


async def test_forward_pagination_ends_without_end(hs: Harness) -> None:
    alice = await hs.user("alice")
    room = await hs.room(alice)
    sent = await hs.send_messages(alice, room, [f"m{i}" for i in range(7)])
    async with hs.client(alice) as client:
        seen: list[str] = []
        token = None
        for _ in range(20):
            page = await client.messages(room, from_=token, dir="f", limit=4)
            seen += [e.event_id for e in page.chunk]
            if page.end is None:
                break
            token = page.end
        else:
            pytest.fail("forward pagination never ended")
    assert page.chunk == []
    assert seen[-7:] == sent


async def test_limited_sync_and_prev_batch(hs: Harness) -> None:
    alice = await hs.user("alice")
    room = await hs.room(alice)
    async with hs.client(alice) as client:
        base = await client.sync(timeline_limit=2)
        sent = await hs.send_messages(alice, room, [f"m{i}" for i in range(9)])
        answer = await client.sync(since=base.next_batch, timeline_limit=4)
        timeline = answer.rooms.join[room].timeline
        assert timeline.limited and timeline.prev_batch
        assert [e.event_id for e in timeline.events] == sent[-4:]
        page = await client.messages(room, from_=timeline.prev_batch, dir="b", limit=5)
        assert [e.event_id for e in page.chunk] == list(reversed(sent[:5]))
        quiet = await client.sync(since=answer.next_batch, timeout_ms=0, timeline_limit=4)
        assert room not in quiet.rooms.join


async def test_own_echo_carries_transaction_id_for_the_sending_device_only(hs: Harness) -> None:
    alice = await hs.user("alice")
    room = await hs.room(alice)
    async with hs.client(alice) as client:
        base = await client.sync(timeline_limit=1)
        event_id = await client.send_text(room, "mine", txn_id="gapline-txn-1")
        answer = await client.sync(since=base.next_batch, timeline_limit=5)
        (echo,) = [e for e in answer.rooms.join[room].timeline.events if e.event_id == event_id]
        assert echo.transaction_id == "gapline-txn-1"
    async with hs.client() as other_device:
        await other_device.login(alice.user_id, "password")
        seen = await other_device.get_event(room, event_id)
        assert seen.transaction_id is None


async def test_relations_and_recursion_depth(hs: Harness) -> None:
    alice = await hs.user("alice")
    room = await hs.room(alice)
    async with hs.client(alice) as client:
        root = await client.send_text(room, "root")
        reply = await client.send_message(
            room,
            {
                "msgtype": "m.text",
                "body": "r",
                "m.relates_to": {"rel_type": "m.thread", "event_id": root},
            },
        )
        edit = await client.send_message(
            room,
            {
                "msgtype": "m.text",
                "body": "* r2",
                "m.new_content": {"msgtype": "m.text", "body": "r2"},
                "m.relates_to": {"rel_type": "m.replace", "event_id": reply},
            },
        )
        flat = await client.relations(room, root)
        deep = await client.relations(room, root, recurse=True)
    assert [e.event_id for e in flat.chunk] == [reply] and flat.recursion_depth is None
    assert {e.event_id for e in deep.chunk} == {reply, edit} and deep.recursion_depth == 3


async def test_redaction_and_txn_dedupe(hs: Harness) -> None:
    alice = await hs.user("alice")
    room = await hs.room(alice)
    async with hs.client(alice) as client:
        first = await client.send_text(room, "x", txn_id="same")
        assert await client.send_text(room, "x", txn_id="same") == first
        redaction = await client.redact(room, first)
        event = await client.get_event(room, first)
    assert event.content == {}
    assert event.redacted_because is not None and event.redacted_because["event_id"] == redaction


async def test_membership_in_sync(hs: Harness) -> None:
    alice = await hs.user("alice")
    bob = await hs.user("bob")
    room = await hs.room(alice)
    async with hs.client(bob) as client, hs.client(alice) as owner:
        base = await client.sync(timeline_limit=1)
        await owner.invite(room, bob.user_id)
        invited = await client.sync(since=base.next_batch)
        states = invited.rooms.invite[room].invite_state.events
        assert any(e.type == "m.room.member" and e.sender == alice.user_id for e in states)
        await client.join(room)
        joined = await client.sync(since=invited.next_batch)
        assert room in joined.rooms.join
        await owner.kick(room, bob.user_id, reason="bye")
        kicked = await client.sync(since=joined.next_batch)
        last = kicked.rooms.leave[room].timeline.events[-1]
        assert (last.type, last.state_key, last.sender) == (
            "m.room.member",
            bob.user_id,
            alice.user_id,
        )
        assert last.content["membership"] == "leave"
        after_kick = await owner.send_text(room, "after bob left")
        # A departed member still reads history, clamped at its departure.
        page = await client.messages(room, dir="b", limit=5)
        assert page.chunk[0].event_id == last.event_id
        assert after_kick not in {e.event_id for e in page.chunk}
    stranger = await hs.user("stranger")
    async with hs.client(stranger) as client:
        with pytest.raises(MatrixHTTPError) as info:
            await client.messages(room, dir="b", limit=5)
        assert info.value.status == 403


async def test_bad_pagination_token_is_400(hs: Harness) -> None:
    alice = await hs.user("alice")
    room = await hs.room(alice)
    async with hs.client(alice) as client:
        with pytest.raises(MatrixHTTPError) as info:
            await client.messages(room, from_="not-a-token")
    assert info.value.status == 400
