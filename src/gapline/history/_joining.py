"""Commands that change which rooms the account is in (join by id or alias, leave,
accept or decline an invite, create a room) and who else is, and what a room says of
itself (invite a user, set the topic).

Each answers once the homeserver made the change (a join is then durable on
the server, and the room can be opened at once: the engine counts it as joined
before the next sync says so). A refusal answers ``Failed`` with what to do
about it: a room or alias the server does not know, a room that needs an
invite, one the account is banned from. Leaving closes the room if it is open
(its ``Idle`` is published first).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gapline.history._commands import (
    AcceptInvite,
    CreateRoom,
    DeclineInvite,
    InviteUser,
    JoinRoom,
    LeaveRoom,
    SetTopic,
)
from gapline.history._failures import describe
from gapline.history._types import Answer, Failed, Invalid, Ok, RoomCreated
from gapline.history._walks import OFFLINE
from gapline.matrix import Forbidden, MatrixClient, MatrixError, NotFound

__all__ = ["Joining", "MembershipCommand", "room_problem"]

MembershipCommand = (
    JoinRoom | AcceptInvite | LeaveRoom | DeclineInvite | CreateRoom | InviteUser | SetTopic
)
"""The commands :meth:`Joining.execute` answers."""


def room_problem(room: str, *, alias: bool) -> str | None:
    """Why ``room`` is not a room id (or, with ``alias``, an alias either); ``None`` if it is."""
    if isinstance(room, str) and len(room) >= 2 and room[0] == "!":
        return None
    if alias and isinstance(room, str) and len(room) >= 4 and room[0] == "#" and ":" in room:
        return None
    wanted = "a room id (!opaque or !opaque:server) or an alias (#name:server)"
    return f"not {wanted if alias else 'a room id (!opaque or !opaque:server)'}: {room!r}"


def _user_problem(user: str) -> str | None:
    if isinstance(user, str) and user.startswith("@") and ":" in user:
        return None
    return f"not a Matrix user id: {user!r} (expected @name:server)"


def _refusal(action: str, room: str, exc: MatrixError) -> str:
    if isinstance(exc, NotFound):
        what = "alias" if room.startswith("#") else "room"
        return f"cannot {action} {room}: the homeserver knows no such {what} ({exc})"
    if isinstance(exc, Forbidden):
        return (
            f"cannot {action} {room}: the homeserver does not allow it"
            f" (invite-only, or you are banned: {exc.error or exc})"
        )
    return f"cannot {action} {room}: {describe(exc)}"


class Joining:
    """Room membership commands of one account.

    ``joined``/``left`` tell the engine's sync bookkeeping at once; ``close``
    closes an open room (a no-op for one that is not open).
    """

    def __init__(
        self,
        client: MatrixClient | None,
        *,
        joined: Callable[[str], None],
        left: Callable[[str], None],
        close: Callable[[str], Awaitable[None]],
    ) -> None:
        self._client = client
        self._joined = joined
        self._left = left
        self._close = close

    async def execute(self, command: MembershipCommand) -> Answer:
        """Answer one membership command (the engine hands each of them here)."""
        match command:
            case JoinRoom(room=room):
                return await self.join(room)
            case AcceptInvite(room_id=room_id):
                return await self.join(room_id, action="accept the invite to")
            case LeaveRoom(room_id=room_id):
                return await self.leave(room_id)
            case DeclineInvite(room_id=room_id):
                return await self.leave(room_id, action="decline the invite to")
            case CreateRoom(name=name, topic=topic, invitees=invitees, encrypted=enc, direct=d):
                return await self.create(
                    name=name, topic=topic, invitees=invitees, encrypted=enc, direct=d
                )
            case InviteUser(room_id=room_id, user_id=user_id):
                return await self.invite(room_id, user_id)
            case SetTopic(room_id=room_id, topic=topic):
                return await self.set_topic(room_id, topic)

    async def join(self, room: str, *, action: str = "join") -> Answer:
        problem = room_problem(room, alias=True)
        if problem is not None:
            return Invalid(problem)
        if self._client is None:
            return Failed(OFFLINE)
        try:
            room_id = await self._client.join(room)
        except MatrixError as exc:
            return Failed(_refusal(action, room, exc))
        self._joined(room_id)
        return Ok()

    async def leave(self, room_id: str, *, action: str = "leave") -> Answer:
        problem = room_problem(room_id, alias=False)
        if problem is not None:
            return Invalid(problem)
        if self._client is None:
            return Failed(OFFLINE)
        try:
            await self._client.leave(room_id)
        except MatrixError as exc:
            return Failed(_refusal(action, room_id, exc))
        await self._close(room_id)
        self._left(room_id)
        return Ok()

    async def create(
        self,
        *,
        name: str | None,
        topic: str | None,
        invitees: tuple[str, ...],
        encrypted: bool,
        direct: bool,
    ) -> Answer:
        for user in invitees:
            problem = _user_problem(user)
            if problem is not None:
                return Invalid(problem)
        if self._client is None:
            return Failed(OFFLINE)
        state: list[dict[str, Any]] = []
        if encrypted:
            state.append(
                {
                    "type": "m.room.encryption",
                    "state_key": "",
                    "content": {"algorithm": "m.megolm.v1.aes-sha2"},
                }
            )
        try:
            room_id = await self._client.create_room(
                name=name,
                topic=topic,
                preset="trusted_private_chat" if direct else "private_chat",
                invite=invitees,
                is_direct=direct or None,
                initial_state=state,
            )
            if direct and invitees:
                await self._mark_direct(room_id, invitees)
        except MatrixError as exc:
            return Failed(f"cannot create the room: {describe(exc)}")
        self._joined(room_id)
        return RoomCreated(room_id)

    async def invite(self, room_id: str, user_id: str) -> Answer:
        problem = room_problem(room_id, alias=False) or _user_problem(user_id)
        if problem is not None:
            return Invalid(problem)
        if self._client is None:
            return Failed(OFFLINE)
        try:
            await self._client.invite(room_id, user_id)
        except Forbidden as exc:
            return Failed(
                f"cannot invite {user_id} to {room_id}: the homeserver does not allow it"
                f" (not in the room, not allowed to invite, or they are banned: {exc.error or exc})"
            )
        except MatrixError as exc:
            return Failed(f"cannot invite {user_id} to {room_id}: {describe(exc)}")
        return Ok()

    async def set_topic(self, room_id: str, topic: str) -> Answer:
        problem = room_problem(room_id, alias=False)
        if problem is not None:
            return Invalid(problem)
        if self._client is None:
            return Failed(OFFLINE)
        try:
            await self._client.put_state(room_id, "m.room.topic", {"topic": topic})
        except Forbidden as exc:
            return Failed(
                f"cannot set the topic of {room_id}: the homeserver does not allow it"
                f" (not in the room, or not allowed to change it: {exc.error or exc})"
            )
        except MatrixError as exc:
            return Failed(f"cannot set the topic of {room_id}: {describe(exc)}")
        return Ok()

    async def _mark_direct(self, room_id: str, invitees: tuple[str, ...]) -> None:
        """Record the room in this account's ``m.direct`` (user id -> direct rooms)."""
        assert self._client is not None
        try:
            current = await self._client.account_data("m.direct")
        except NotFound:
            current = {}
        rooms: dict[str, list[str]] = {
            user: [r for r in ids if isinstance(r, str)]
            for user, ids in current.items()
            if isinstance(user, str) and isinstance(ids, list)
        }
        for user in invitees:
            if room_id not in rooms.setdefault(user, []):
                rooms[user].append(room_id)
        await self._client.put_account_data("m.direct", rooms)
