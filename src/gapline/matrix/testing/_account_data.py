"""Account data, global and per room (``/user/{userId}[/rooms/{roomId}]/account_data/{type}``).

What is set here reaches ``/sync`` (``account_data``, or the room's
``account_data``) from the stream position it was set at.
"""

from __future__ import annotations

from ._model import EndpointFamily
from ._wire import Call, HTTPError, Reply

__all__ = ["AccountDataEndpoints"]


class AccountDataEndpoints(EndpointFamily):
    async def account_data(
        self, call: Call, user: str, room_id: str | None, data_type: str
    ) -> Reply:
        user_id, _, _ = self.model._auth(call.request)
        if user != user_id:
            raise HTTPError(403, "M_FORBIDDEN", "Cannot access another user's account data")
        if call.request.method == "PUT":
            content = call.body if isinstance(call.body, dict) else {}
            self.model._set_data(user_id, room_id, data_type, content)
            return Reply(200, {})
        store = (
            self.model._global_data.get(user_id, {})
            if room_id is None
            else self.model._room_data.get((user_id, room_id), {})
        )
        if data_type not in store:
            raise HTTPError(404, "M_NOT_FOUND", "Account data not found")
        return Reply(200, store[data_type][1])
