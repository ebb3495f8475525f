"""Joining and leaving against a real Synapse: by alias, an alias that does not resolve, an
invite-only room, a room that does not exist; leaving closes the room; an invite accepted
and one declined; a direct, encrypted room created for another user."""

from __future__ import annotations

import secrets

import pytest

from gapline.history import (
    AcceptInvite,
    CreateRoom,
    DeclineInvite,
    Failed,
    JoinRoom,
    LeaveRoom,
    Ok,
    OpenRoom,
    RecentHistoryKind,
    RoomCreated,
)
from tests.history.test_engine_support import NO_RETRY, open_engine

pytestmark = [pytest.mark.synapse]


async def test_join_by_alias_leave_and_the_joins_synapse_refuses(tmp_path, synapse_kit):
    alice = await synapse_kit.user("alice")
    bob = await synapse_kit.user("bob")
    alias_name = f"public{secrets.token_hex(4)}"
    server = synapse_kit.server.server_name
    async with synapse_kit.client(bob, retry=NO_RETRY) as owner:
        public = await owner.create_room(
            name="public", preset="public_chat", extra={"room_alias_name": alias_name}
        )
        private = await owner.create_room(name="private", preset="private_chat")
        async with (
            synapse_kit.client(alice, retry=NO_RETRY) as client,
            open_engine(tmp_path, client) as h,
        ):
            await h.engine.sync_once()
            assert await h.engine.execute(JoinRoom(f"#{alias_name}:{server}")) == Ok()
            assert await h.engine.execute(OpenRoom(public)) == Ok()
            assert alice.user_id in await owner.joined_members(public)
            assert await h.engine.execute(LeaveRoom(public)) == Ok()
            assert not h.engine.is_open(public)
            assert h.recorder.recent(public)[-1] is RecentHistoryKind.Idle
            assert alice.user_id not in await owner.joined_members(public)

            nowhere = await h.engine.execute(JoinRoom(f"#nowhere{alias_name}:{server}"))
            assert isinstance(nowhere, Failed) and "no such alias" in nowhere.message
            invite_only = await h.engine.execute(JoinRoom(private))
            assert isinstance(invite_only, Failed) and "does not allow it" in invite_only.message
            gone = await h.engine.execute(JoinRoom(f"!doesnotexist:{server}"))
            assert isinstance(gone, Failed) and gone.message.startswith("cannot join")


async def test_invites_accepted_and_declined_and_a_direct_room(tmp_path, synapse_kit):
    alice = await synapse_kit.user("alice")
    bob = await synapse_kit.user("bob")
    async with synapse_kit.client(bob, retry=NO_RETRY) as owner:
        yes = await owner.create_room(name="yes", invite=[alice.user_id])
        no = await owner.create_room(name="no", invite=[alice.user_id])
        async with (
            synapse_kit.client(alice, retry=NO_RETRY) as client,
            open_engine(tmp_path, client) as h,
        ):
            await h.engine.sync_once()
            assert await h.engine.execute(AcceptInvite(yes)) == Ok()
            assert await h.engine.execute(DeclineInvite(no)) == Ok()
            assert alice.user_id in await owner.joined_members(yes)
            created = await h.engine.execute(
                CreateRoom(name="us", invitees=(bob.user_id,), encrypted=True, direct=True)
            )
            assert isinstance(created, RoomCreated)
            [direct] = (await client.account_data("m.direct"))[bob.user_id]
            assert created.room_id == direct
            assert await h.engine.execute(OpenRoom(direct)) == Ok()
            state = await client.room_state(direct)
            assert any(e.type == "m.room.encryption" for e in state)
            assert await owner.join(direct) == direct  # bob was invited
