"""Composing against a real Synapse: a room created (its id in the answer), a user invited
and a topic set by command, markdown and an emote sent; the other user joins and reads
them back through their own engine's sync, with the HTML, msgtypes and topic intact."""

from __future__ import annotations

import pytest

from gapline.history import (
    CreateRoom,
    EventItem,
    Failed,
    InviteUser,
    JoinRoom,
    Ok,
    OpenRoom,
    RoomCreated,
    SendMessage,
    SetTopic,
)
from gapline.history._markdown import HTML_FORMAT
from tests.history.test_engine_support import NO_RETRY, open_engine

pytestmark = [pytest.mark.synapse]


def rows(h, room_id: str) -> list[EventItem]:
    return [i for i in h.mirror.items(room_id) or () if isinstance(i, EventItem)]


async def test_markdown_emote_invite_and_topic_read_back_through_sync(tmp_path, synapse_kit):
    alice = await synapse_kit.user("alice")
    bob = await synapse_kit.user("bob")
    carol = await synapse_kit.user("carol")
    async with (
        synapse_kit.client(alice, retry=NO_RETRY) as client,
        open_engine(tmp_path / "alice", client) as h,
    ):
        await h.engine.sync_once()
        created = await h.engine.execute(CreateRoom(name="plans"))
        assert isinstance(created, RoomCreated)
        room = created.room_id
        assert await h.engine.execute(OpenRoom(room)) == Ok()
        assert await h.engine.execute(InviteUser(room, bob.user_id)) == Ok()
        assert await h.engine.execute(SetTopic(room, "lunch on *Friday*")) == Ok()
        for command in (
            SendMessage(room, "**bold** and `code`", markdown=True),
            SendMessage(room, "waves *hard*", msgtype="m.emote", markdown=True),
            SendMessage(room, "just words", markdown=True),
            SendMessage(room, "beep", msgtype="m.notice"),
        ):
            assert await h.engine.execute(command) == Ok()
        await h.engine.send_queue.wait_sent(4)
        await h.engine.sync_once()
        mine = [r for r in rows(h, room) if r.event_type == "m.room.message"]
        assert [(r.body, r.msgtype, r.formatted_body, r.send_state) for r in mine] == [
            ("**bold** and `code`", "m.text", "<p><strong>bold</strong> and <code>code</code></p>", None),
            ("waves *hard*", "m.emote", "<p>waves <em>hard</em></p>", None),
            ("just words", "m.text", None, None),
            ("beep", "m.notice", None, None),
        ]  # fmt: skip
        assert any(r.body == "changed the topic to “lunch on *Friday*”" for r in rows(h, room))
        # Refusals say why: carol's room is not alice's to change.
        async with synapse_kit.client(carol, retry=NO_RETRY) as other:
            theirs = await other.create_room(name="carol's", preset="private_chat")
        refused = await h.engine.execute(SetTopic(theirs, "mine"))
        assert isinstance(refused, Failed) and "cannot set the topic" in refused.message
        refused = await h.engine.execute(InviteUser(theirs, bob.user_id))
        assert isinstance(refused, Failed) and "cannot invite" in refused.message

    async with (
        synapse_kit.client(bob, retry=NO_RETRY) as client,
        open_engine(tmp_path / "bob", client) as b,
    ):
        await b.engine.sync_once()
        assert await b.engine.execute(JoinRoom(room)) == Ok()  # the invite is there
        await b.engine.sync_once()
        assert await b.engine.execute(OpenRoom(room)) == Ok()
        await b.engine.wait_idle(room)
        theirs = [r for r in rows(b, room) if r.event_type == "m.room.message"]
        assert [(r.sender, r.body, r.msgtype, r.formatted_body) for r in theirs] == [
            (alice.user_id, r.body, r.msgtype, r.formatted_body) for r in mine
        ]
        page = await client.messages(room, dir="b", limit=50)
        content = {
            e.content.get("body"): e.content for e in page.chunk if e.type == "m.room.message"
        }
        assert content["**bold** and `code`"]["format"] == HTML_FORMAT
        assert content["waves *hard*"]["msgtype"] == "m.emote"
        assert "format" not in content["just words"]
        topic = await client.get_state(room, "m.room.topic")
        assert topic == {"topic": "lunch on *Friday*"}
