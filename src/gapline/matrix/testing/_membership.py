"""Room creation and membership over HTTP: createRoom, join, leave, invite, kick, joined_members.

Each handler checks what Synapse checks and then makes the same change the
seeding API makes, so a room built by seeding and one built by a client are
the same room.
"""

from __future__ import annotations

from ._model import EndpointFamily
from ._wire import Call, HTTPError, Reply

__all__ = ["MembershipEndpoints"]


class MembershipEndpoints(EndpointFamily):
    async def create_room(self, call: Call) -> Reply:
        user_id, _, _ = self.model._auth(call.request)
        body = call.body if isinstance(call.body, dict) else {}
        room_id = self.model.create_room(user_id, name=body.get("name"))
        for invitee in body.get("invite", []):
            self.model.invite(user_id, room_id, invitee)
        for state in body.get("initial_state", []):
            self.model._append(
                room_id,
                user_id,
                state["type"],
                state.get("content", {}),
                state.get("state_key", ""),
            )
        return Reply(200, {"room_id": room_id})

    async def join(self, call: Call, room_id: str) -> Reply:
        user_id, _, _ = self.model._auth(call.request)
        room = self.model._room(room_id)
        if room.membership(user_id) not in ("invite", "join"):
            raise HTTPError(403, "M_FORBIDDEN", "You are not invited to this room.")
        if room.membership(user_id) != "join":
            self.model.join(user_id, room_id)
        return Reply(200, {"room_id": room_id})

    async def leave(self, call: Call, room_id: str) -> Reply:
        user_id, _, _ = self.model._auth(call.request)
        room = self.model._room(room_id)
        if room.membership(user_id) in ("join", "invite"):
            self.model.leave(user_id, room_id)
        return Reply(200, {})

    async def invite(self, call: Call, room_id: str) -> Reply:
        user_id, _, _ = self.model._auth(call.request)
        room = self.model._member_room(user_id, room_id)
        invitee = self._target(call)
        if room.membership(invitee) == "join":
            raise HTTPError(403, "M_FORBIDDEN", f"{invitee} is already in the room.")
        self.model.invite(user_id, room_id, invitee)
        return Reply(200, {})

    async def kick(self, call: Call, room_id: str) -> Reply:
        user_id, _, _ = self.model._auth(call.request)
        room = self.model._member_room(user_id, room_id)
        target = self._target(call)
        if room.membership(target) not in ("join", "invite"):
            raise HTTPError(403, "M_FORBIDDEN", f"{target} is not in the room.")
        reason = call.body.get("reason")
        self.model.kick(
            user_id, room_id, target, reason=reason if isinstance(reason, str) else None
        )
        return Reply(200, {})

    async def joined_members(self, call: Call, room_id: str) -> Reply:
        user_id, _, _ = self.model._auth(call.request)
        room = self.model._member_room(user_id, room_id)
        joined = {
            key: {"display_name": None, "avatar_url": None}
            for (etype, key), ev in room.state.items()
            if etype == "m.room.member" and ev.content.get("membership") == "join"
        }
        return Reply(200, {"joined": joined})

    @staticmethod
    def _target(call: Call) -> str:
        """The body's ``user_id`` (400 ``M_MISSING_PARAM`` without one)."""
        target = call.body.get("user_id") if isinstance(call.body, dict) else None
        if not isinstance(target, str):
            raise HTTPError(400, "M_MISSING_PARAM", "Missing user_id")
        return target
