"""Joining, leaving, invites and creating rooms against the fake homeserver: each answers
once the server made the change, a joined room opens at once, leaving closes it, and bad
input (a bad id, a room one is not invited to, an unknown room) answers clearly."""

from __future__ import annotations

from gapline.history import (
    AcceptInvite,
    CreateRoom,
    DeclineInvite,
    Failed,
    Invalid,
    InviteUser,
    JoinRoom,
    LeaveRoom,
    Ok,
    OpenRoom,
    RecentHistoryKind,
    RoomCreated,
    SetTopic,
    answer_from_wire,
    command_from_wire,
    to_wire,
)
from gapline.history._wire import WireError
from tests.history.test_engine_fake import client_for
from tests.history.test_engine_support import open_engine


def membership(fake, room: str, user: str) -> str | None:
    return fake._room(room).membership(user)


async def test_join_by_id_opens_at_once_and_leave_closes(tmp_path, fake, alice):
    bob = fake.register("bob")
    room = fake.create_room(bob.user_id, name="r")
    fake.invite(bob.user_id, room, alice.user_id)
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        await h.engine.sync_once()
        assert await h.engine.execute(JoinRoom(room)) == Ok()
        assert membership(fake, room, alice.user_id) == "join"
        assert await h.engine.execute(OpenRoom(room)) == Ok()  # before any sync says so
        assert await h.engine.execute(LeaveRoom(room)) == Ok()
        assert membership(fake, room, alice.user_id) == "leave"
        assert not h.engine.is_open(room)
        assert h.recorder.recent(room)[-1] is RecentHistoryKind.Idle


async def test_accept_and_decline_invites(tmp_path, fake, alice):
    bob = fake.register("bob")
    first = fake.create_room(bob.user_id, name="yes")
    second = fake.create_room(bob.user_id, name="no")
    for room in (first, second):
        fake.invite(bob.user_id, room, alice.user_id)
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        await h.engine.sync_once()
        assert await h.engine.execute(AcceptInvite(first)) == Ok()
        assert await h.engine.execute(DeclineInvite(second)) == Ok()
    assert membership(fake, first, alice.user_id) == "join"
    assert membership(fake, second, alice.user_id) == "leave"


async def test_joins_that_cannot_happen_say_why(tmp_path, fake, alice):
    bob = fake.register("bob")
    private = fake.create_room(bob.user_id, name="invite only")
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        refused = await h.engine.execute(JoinRoom(private))
        assert isinstance(refused, Failed) and "does not allow it" in refused.message
        unknown = await h.engine.execute(JoinRoom("!nowhere:example.org"))
        assert isinstance(unknown, Failed) and "knows no such room" in unknown.message
        for bad in ("general", "#nocolon", ""):
            assert isinstance(await h.engine.execute(JoinRoom(bad)), Invalid), bad
        assert isinstance(await h.engine.execute(LeaveRoom("#alias:x")), Invalid)
        bad_invitee = await h.engine.execute(CreateRoom(invitees=("bob",)))
        assert isinstance(bad_invitee, Invalid)
    assert membership(fake, private, alice.user_id) is None


async def test_create_a_direct_encrypted_room(tmp_path, fake, alice):
    bob = fake.register("bob")
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        await h.engine.sync_once()
        answer = await h.engine.execute(
            CreateRoom(name="us", invitees=(bob.user_id,), encrypted=True, direct=True)
        )
        assert isinstance(answer, RoomCreated)
        direct = await client.account_data("m.direct")
        [room] = direct[bob.user_id]
        assert answer == RoomCreated(room)
        assert await h.engine.execute(OpenRoom(room)) == Ok()
    assert membership(fake, room, bob.user_id) == "invite"
    state = fake._room(room).state
    assert state[("m.room.encryption", "")].content["algorithm"] == "m.megolm.v1.aes-sha2"


async def test_invite_and_set_topic(tmp_path, fake, alice):
    bob = fake.register("bob")
    carol = fake.register("carol")
    async with client_for(fake, alice) as client, open_engine(tmp_path, client) as h:
        await h.engine.sync_once()
        created = await h.engine.execute(CreateRoom(name="plans"))
        assert isinstance(created, RoomCreated)
        room = created.room_id
        assert await h.engine.execute(InviteUser(room, bob.user_id)) == Ok()
        assert await h.engine.execute(SetTopic(room, "lunch at noon")) == Ok()
        assert isinstance(await h.engine.execute(InviteUser(room, "carol")), Invalid)
        assert isinstance(await h.engine.execute(SetTopic("#a:x", "t")), Invalid)
        elsewhere = fake.create_room(carol.user_id, name="not mine")
        refused = await h.engine.execute(SetTopic(elsewhere, "mine now"))
        assert isinstance(refused, Failed) and "cannot set the topic" in refused.message
        refused = await h.engine.execute(InviteUser(elsewhere, bob.user_id))
        assert isinstance(refused, Failed) and f"cannot invite {bob.user_id}" in refused.message
    assert membership(fake, room, bob.user_id) == "invite"
    assert fake._room(room).state[("m.room.topic", "")].content == {"topic": "lunch at noon"}
    assert membership(fake, elsewhere, bob.user_id) is None


def test_wire_shapes() -> None:
    cases = [
        ({"JoinRoom": {"room": "!r:example.org"}}, JoinRoom("!r:example.org")),
        ({"JoinRoom": {"room": "#general:example.org"}}, JoinRoom("#general:example.org")),
        ({"LeaveRoom": {"room_id": "!r:example.org"}}, LeaveRoom("!r:example.org")),
        ({"AcceptInvite": {"room_id": "!r:example.org"}}, AcceptInvite("!r:example.org")),
        ({"DeclineInvite": {"room_id": "!r:example.org"}}, DeclineInvite("!r:example.org")),
        ({"CreateRoom": {}}, CreateRoom()),
        (
            {
                "CreateRoom": {
                    "name": "n",
                    "topic": "t",
                    "invitees": ["@b:example.org"],
                    "encrypted": True,
                    "direct": True,
                }
            },
            CreateRoom("n", "t", ("@b:example.org",), encrypted=True, direct=True),
        ),
        (
            {"InviteUser": {"room_id": "!r:example.org", "user_id": "@b:example.org"}},
            InviteUser("!r:example.org", "@b:example.org"),
        ),
        (
            {"SetTopic": {"room_id": "!r:example.org", "topic": ""}},
            SetTopic("!r:example.org", ""),
        ),
    ]
    for data, command in cases:
        assert command_from_wire(data) == command
        assert to_wire(command) == data
    for bad in (
        {"JoinRoom": {"room": "general"}},
        {"JoinRoom": {"room_id": "!r:x"}},
        {"LeaveRoom": {"room_id": "#a:x"}},
        {"CreateRoom": {"invitees": ["bob"]}},
        {"CreateRoom": {"encrypted": "yes"}},
        {"InviteUser": {"room_id": "!r:x", "user_id": "bob"}},
        {"InviteUser": {"room_id": "!r:x"}},
        {"SetTopic": {"room_id": "!r:x", "topic": 3}},
        {"SetTopic": {"room_id": "r", "topic": "t"}},
    ):
        try:
            command_from_wire(bad)
        except WireError:
            continue
        raise AssertionError(f"accepted {bad}")


def test_room_created_answer_on_the_wire() -> None:
    answer = RoomCreated("!new:example.org")
    assert to_wire(answer) == {"RoomCreated": {"room_id": "!new:example.org"}}
    assert answer_from_wire(to_wire(answer)) == answer
    for bad in ({"RoomCreated": {}}, {"RoomCreated": {"room_id": "x"}}, "RoomCreated"):
        try:
            answer_from_wire(bad)
        except WireError:
            continue
        raise AssertionError(f"accepted {bad}")
