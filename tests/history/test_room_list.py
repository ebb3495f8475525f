"""The room list from sync answers: invites first with who invited, joined rooms by recent
activity with encryption, last message and direct chats (``m.direct``), left rooms only on
request, and a letter or two for each room's avatar."""

from __future__ import annotations

from typing import Any

import msgspec

from gapline.history.rooms import RoomDirectory, RoomSummary
from gapline.matrix import SyncResponse

ME = "@me:x"


def event(kind: str, content: dict, *, ts: int, sender: str = "@a:x", state_key=None) -> dict:
    out: dict[str, Any] = {
        "event_id": f"${kind}{ts}",
        "type": kind,
        "sender": sender,
        "origin_server_ts": ts,
        "content": content,
    }
    if state_key is not None:
        out["state_key"] = state_key
    return out


def sync(join=None, invite=None, leave=None, direct=None, ignored=None) -> SyncResponse:
    body: dict[str, Any] = {
        "next_batch": "s",
        "rooms": {"join": join or {}, "invite": invite or {}, "leave": leave or {}},
    }
    account: list[dict] = []
    if direct is not None:
        account.append({"type": "m.direct", "content": direct})
    if ignored is not None:
        content = {"ignored_users": {user: {} for user in ignored}}
        account.append({"type": "m.ignored_user_list", "content": content})
    if account:
        body["account_data"] = {"events": account}
    return msgspec.json.decode(msgspec.json.encode(body), type=SyncResponse)


def joined(*events: dict, state=()) -> dict:
    return {"timeline": {"events": list(events)}, "state": {"events": list(state)}}


def test_invites_first_then_joined_rooms_by_recent_activity() -> None:
    directory = RoomDirectory()
    directory.observe(
        sync(
            join={
                "!old:x": joined(
                    event("m.room.message", {"body": "long ago"}, ts=10),
                    state=[event("m.room.name", {"name": "Old"}, ts=1, state_key="")],
                ),
                "!new:x": joined(
                    event("m.room.message", {"body": "first line\nsecond"}, ts=50),
                    event("m.reaction", {}, ts=60),
                    state=[
                        event("m.room.name", {"name": "New"}, ts=1, state_key=""),
                        event("m.room.encryption", {"algorithm": "x"}, ts=1, state_key=""),
                    ],
                ),
                "!secret:x": joined(event("m.room.encrypted", {}, ts=30, sender="@b:x")),
            },
            invite={
                "!inv:x": {
                    "invite_state": {
                        "events": [
                            {
                                "type": "m.room.name",
                                "state_key": "",
                                "sender": "@c:x",
                                "content": {"name": "Party"},
                            },
                            {
                                "type": "m.room.member",
                                "state_key": ME,
                                "sender": "@c:x",
                                "content": {"membership": "invite", "is_direct": True},
                            },
                        ]
                    }
                }
            },
        )
    )
    rooms = directory.room_list()
    assert [r.room_id for r in rooms] == ["!inv:x", "!new:x", "!secret:x", "!old:x"]
    invite, new, secret, _ = rooms
    assert (invite.membership, invite.label, invite.inviter, invite.direct) == (
        "invite",
        "Party",
        "@c:x",
        True,
    )
    assert (new.encrypted, new.last_message, new.last_sender, new.last_ts) == (
        True,
        "first line",
        "@a:x",
        60,
    )
    assert (secret.last_message, secret.last_sender) == ("encrypted message", "@b:x")
    # Joined-room names for the room pane stay as they were: joined rooms, by name.
    assert [s.label for s in directory.summaries()] == ["!secret:x", "New", "Old"]

    # Accepting the invite moves it among the joined rooms; a newer message reorders.
    directory.observe(sync(join={"!inv:x": joined(event("m.room.message", {"body": "hi"}, ts=70))}))
    directory.observe(sync(join={"!old:x": joined(event("m.room.message", {"body": "up"}, ts=80))}))
    rooms = directory.room_list()
    assert [r.room_id for r in rooms] == ["!old:x", "!inv:x", "!new:x", "!secret:x"]
    assert rooms[1].membership == "join" and rooms[1].label == "Party" and rooms[1].inviter is None


def test_left_rooms_only_on_request_and_direct_chats_from_m_direct() -> None:
    directory = RoomDirectory()
    directory.observe(
        sync(
            join={
                "!a:x": joined(event("m.room.message", {"body": "a"}, ts=5)),
                "!b:x": joined(event("m.room.message", {"body": "b"}, ts=6)),
            },
            direct={"@friend:x": ["!a:x"]},
        )
    )
    assert [(r.room_id, r.direct) for r in directory.room_list()] == [
        ("!b:x", False),
        ("!a:x", True),
    ]
    calls: list[None] = []
    directory.subscribe(lambda: calls.append(None))
    directory.observe(sync(leave={"!b:x": {}}))
    directory.observe(sync(leave={"!b:x": {}}))  # the same again: no change
    assert len(calls) == 1
    assert [r.room_id for r in directory.room_list()] == ["!a:x"]
    left = directory.room_list(include_left=True)
    assert [(r.room_id, r.membership, r.last_message) for r in left] == [
        ("!a:x", "join", "a"),
        ("!b:x", "leave", "b"),
    ]
    directory.observe(sync(direct={}))
    assert directory.room_list()[0].direct is False


def test_initials_stand_in_for_avatars() -> None:
    assert RoomSummary("!r:x", name="design review").initials == "DR"
    assert RoomSummary("!r:x", name="Bob").initials == "B"
    assert RoomSummary("!r:x", alias="#general:example.org").initials == "GE"
    assert RoomSummary("!abc:x").initials == "AX"
    assert RoomSummary("!r:x", name="🎉 party").initials == "P"


def invite_from(sender: str) -> dict:
    member = {
        "type": "m.room.member",
        "state_key": ME,
        "sender": sender,
        "content": {"membership": "invite"},
    }
    return {"invite_state": {"events": [member]}}


def test_invites_from_ignored_users_are_not_offered() -> None:
    directory = RoomDirectory()
    directory.observe(sync(invite={"!spam:x": invite_from("@spammer:x")}, ignored=[]))
    assert [r.room_id for r in directory.room_list()] == ["!spam:x"]
    directory.observe(sync(ignored=["@spammer:x"]))  # ignored later: the invite goes
    assert directory.room_list() == ()
    directory.observe(sync(invite={"!again:x": invite_from("@spammer:x")}))
    assert directory.room_list() == ()
    directory.observe(sync(invite={"!ok:x": invite_from("@friend:x")}))
    assert [r.room_id for r in directory.room_list()] == ["!ok:x"]
