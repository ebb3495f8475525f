"""The real-Synapse fixture, and the Synapse behaviours the engines rely on."""

from __future__ import annotations

import pytest

from gapline.matrix import Forbidden, MatrixClient, UnknownToken
from gapline.matrix.devserver import SynapseServer
from tests.fixtures.synapse import SynapseKit


async def test_register_login_reuses_device(synapse_kit: SynapseKit) -> None:
    alice = await synapse_kit.user("alice")
    async with synapse_kit.client() as client:
        again = await client.login(alice.user_id, "password", device_id=alice.device_id)
        assert again.device_id == alice.device_id
        assert again.access_token != alice.access_token
        me = await client.whoami()
        assert (me.user_id, me.device_id) == (alice.user_id, alice.device_id)
        await client.logout()
    async with synapse_kit.client(again) as stale:
        with pytest.raises(UnknownToken):
            await stale.whoami()


async def test_wrong_password_is_forbidden(synapse_kit: SynapseKit) -> None:
    alice = await synapse_kit.user("alice")
    async with synapse_kit.client() as client:
        with pytest.raises(Forbidden) as info:
            await client.login(alice.user_id, "not-the-password")
    assert info.value.errcode == "M_FORBIDDEN"


async def test_messages_backwards_to_room_create(synapse_kit: SynapseKit) -> None:
    """/messages?dir=b still returns `end` on the page holding m.room.create;
    only the next, empty page omits it."""
    alice = await synapse_kit.user("alice")
    bob = await synapse_kit.user("bob")
    room = await synapse_kit.room(alice, bob)
    sent = await synapse_kit.send_messages(alice, room, [f"message {i}" for i in range(120)])

    async with synapse_kit.client(bob) as client:
        pages = []
        token = None
        while True:
            page = await client.messages(room, from_=token, dir="b", limit=50)
            pages.append(page)
            if page.end is None:
                break
            assert page.end != token
            token = page.end
            assert len(pages) < 10, "pagination did not terminate"

    events = [e for page in pages for e in page.chunk]
    create_pages = [
        i for i, p in enumerate(pages) if any(e.type == "m.room.create" for e in p.chunk)
    ]
    assert len(create_pages) == 1
    holding = pages[create_pages[0]]
    assert holding.end is not None, "the page holding m.room.create still carries `end`"
    assert create_pages[0] == len(pages) - 2
    assert pages[-1].chunk == [] and pages[-1].end is None
    # Newest first, and every sent message exactly once, in reverse send order.
    bodies = [e.event_id for e in events if e.type == "m.room.message"]
    assert bodies == list(reversed(sent))
    assert events[-1].type == "m.room.create"


async def test_limited_sync_has_prev_batch(synapse_kit: SynapseKit) -> None:
    alice = await synapse_kit.user("alice")
    room = await synapse_kit.room(alice)
    sent = await synapse_kit.send_messages(alice, room, [f"m{i}" for i in range(12)])
    async with synapse_kit.client(alice) as client:
        answer = await client.sync(timeline_limit=3)
        timeline = answer.rooms.join[room].timeline
        assert timeline.limited is True
        assert timeline.prev_batch
        assert [e.event_id for e in timeline.events] == sent[-3:]
        # prev_batch paginates back into exactly what the limited sync left out.
        page = await client.messages(room, from_=timeline.prev_batch, dir="b", limit=3)
        assert [e.event_id for e in page.chunk] == list(reversed(sent[-6:-3]))
        # An incremental sync with nothing new is not limited.
        quiet = await client.sync(since=answer.next_batch, timeout_ms=0, timeline_limit=3)
        assert room not in quiet.rooms.join or not quiet.rooms.join[room].timeline.limited


async def test_relations_recurse_reports_depth(synapse_kit: SynapseKit) -> None:
    alice = await synapse_kit.user("alice")
    room = await synapse_kit.room(alice)
    async with synapse_kit.client(alice) as client:
        root = await client.send_text(room, "root")
        reply = await client.send_message(
            room,
            {
                "msgtype": "m.text",
                "body": "in thread",
                "m.relates_to": {"rel_type": "m.thread", "event_id": root},
            },
        )
        edit = await client.send_message(
            room,
            {
                "msgtype": "m.text",
                "body": "* edited",
                "m.new_content": {"msgtype": "m.text", "body": "edited"},
                "m.relates_to": {"rel_type": "m.replace", "event_id": reply},
            },
        )
        flat = await client.relations(room, root)
        assert [e.event_id for e in flat.chunk] == [reply]
        assert flat.recursion_depth is None
        deep = await client.relations(room, root, recurse=True)
        assert {e.event_id for e in deep.chunk} == {reply, edit}
        assert deep.recursion_depth == 3  # Synapse reports 3 whatever the depth
        only_threads = await client.relations(room, root, rel_type="m.thread")
        assert [e.event_id for e in only_threads.chunk] == [reply]


async def test_redaction_shape(synapse_kit: SynapseKit) -> None:
    alice = await synapse_kit.user("alice")
    room = await synapse_kit.room(alice)
    async with synapse_kit.client(alice) as client:
        event_id = await client.send_text(room, "secret")
        redaction = await client.redact(room, event_id, reason="oops")
        event = await client.get_event(room, event_id)
    assert event.content == {}
    assert event.redacted_because is not None
    assert event.redacted_because["event_id"] == redaction


async def test_send_is_idempotent_per_txn_id(synapse_kit: SynapseKit) -> None:
    alice = await synapse_kit.user("alice")
    room = await synapse_kit.room(alice)
    async with synapse_kit.client(alice) as client:
        first = await client.send_text(room, "once", txn_id="txn-1")
        second = await client.send_text(room, "once", txn_id="txn-1")
        page = await client.messages(room, dir="b", limit=5)
    assert first == second
    assert [e.event_id for e in page.chunk if e.type == "m.room.message"] == [first]


async def test_ids_with_reserved_characters_round_trip(synapse_kit: SynapseKit) -> None:
    alice = await synapse_kit.user("alice")
    room = await synapse_kit.room(alice)
    async with synapse_kit.client(alice) as client:
        await client.put_state(room, "org.gapline.odd", {"v": 1}, state_key="a/b#c?d")
        assert await client.get_state(room, "org.gapline.odd", "a/b#c?d") == {"v": 1}
        await client.put_account_data("org.gapline.test", {"x": 1}, room_id=room)
        assert await client.account_data("org.gapline.test", room_id=room) == {"x": 1}
        await client.send_text(room, "marker")
        page = await client.messages(room, dir="b", limit=1)
        await client.set_read_markers(
            room, fully_read=page.chunk[0].event_id, read=page.chunk[0].event_id
        )
        answer = await client.sync(timeline_limit=1)
        assert answer.rooms.join[room].fully_read == page.chunk[0].event_id


async def test_media_round_trip(synapse_kit: SynapseKit) -> None:
    alice = await synapse_kit.user("alice")
    async with synapse_kit.client(alice) as client:
        uri = await client.upload(b"hello media", content_type="text/plain", filename="a b.txt")
        assert uri.startswith("mxc://")
        assert await client.download(uri) == b"hello media"


def test_server_is_loopback_and_configured(synapse: SynapseServer) -> None:
    assert synapse.base_url.startswith("http://127.0.0.1:")
    assert synapse.process.poll() is None
    assert synapse.start_seconds > 0
    assert "sync_response_cache_duration" in (synapse.directory / "homeserver.yaml").read_text()


async def test_versions_needs_no_login(synapse: SynapseServer) -> None:
    async with MatrixClient(synapse.base_url) as client:
        versions = await client.versions()
        assert "versions" in versions


async def test_history_visibility_gives_empty_pages_with_end(synapse_kit: SynapseKit) -> None:
    """Synapse filters visibility after fetching a page: hidden spans come back as
    empty chunks that still carry `end` (the fake's hide_history_before models this)."""
    alice = await synapse_kit.user("alice")
    bob = await synapse_kit.user("bob")
    async with synapse_kit.client(alice) as client:
        room = await client.create_room(
            preset="private_chat",
            initial_state=[
                {
                    "type": "m.room.history_visibility",
                    "state_key": "",
                    "content": {"history_visibility": "joined"},
                }
            ],
        )
        hidden = [await client.send_text(room, f"before {i}") for i in range(20)]
        await client.invite(room, bob.user_id)
    async with synapse_kit.client(bob) as client:
        await client.join(room)
        after = await client.send_text(room, "after")
        pages = []
        token = None
        while True:
            page = await client.messages(room, from_=token, dir="b", limit=5)
            pages.append(page)
            if page.end is None:
                break
            token = page.end
            assert len(pages) < 40
    seen = {e.event_id for p in pages for e in p.chunk}
    assert after in seen and not seen & set(hidden)
    assert any(p.chunk == [] and p.end is not None for p in pages[:-1])
    assert pages[-1].chunk == [] and pages[-1].end is None
