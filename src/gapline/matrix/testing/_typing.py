"""Typing notifications and profiles: ``PUT /rooms/{roomId}/typing/{userId}`` and
``PUT /profile/{userId}/displayname``.

Typing reaches ``/sync`` as the room's ephemeral ``m.typing`` (who types now)
from the stream position it changed at; the fake has no timeouts (a client
stops typing explicitly). A display name change writes a member event in
every room the user has joined, as Synapse does.
"""

from __future__ import annotations

from ._model import EndpointFamily
from ._wire import Call, HTTPError, Reply

__all__ = ["TypingEndpoints"]


class TypingEndpoints(EndpointFamily):
    async def typing(self, call: Call, room_id: str, user: str) -> Reply:
        user_id, _, _ = self.model._auth(call.request)
        if user != user_id:
            raise HTTPError(403, "M_FORBIDDEN", "Cannot set another user's typing state")
        self.model._member_room(user_id, room_id)
        body = call.body if isinstance(call.body, dict) else {}
        typing = body.get("typing")
        if not isinstance(typing, bool):
            raise HTTPError(400, "M_BAD_JSON", "typing must be a boolean")
        self.model.set_typing(user_id, room_id, typing)
        return Reply(200, {})

    async def displayname(self, call: Call, user: str) -> Reply:
        user_id, _, _ = self.model._auth(call.request)
        if user != user_id:
            raise HTTPError(403, "M_FORBIDDEN", "Cannot set another user's display name")
        body = call.body if isinstance(call.body, dict) else {}
        name = body.get("displayname")
        if not isinstance(name, str):
            raise HTTPError(400, "M_BAD_JSON", "displayname must be a string")
        self.model.set_displayname(user_id, name)
        return Reply(200, {})
