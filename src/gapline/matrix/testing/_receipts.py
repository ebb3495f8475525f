"""Where a user has read to: ``read_markers`` and ``receipt``.

A receipt takes a stream position and reaches ``/sync`` as an ephemeral
``m.receipt``; ``m.fully_read`` is room account data.
"""

from __future__ import annotations

from ._model import EndpointFamily, Room
from ._wire import Call, HTTPError, Reply

__all__ = ["ReceiptEndpoints"]


class ReceiptEndpoints(EndpointFamily):
    async def read_markers(self, call: Call, room_id: str) -> Reply:
        user_id, _, _ = self.model._auth(call.request)
        room = self.model._member_room(user_id, room_id)
        body = call.body if isinstance(call.body, dict) else {}
        fully_read = body.get("m.fully_read")
        if isinstance(fully_read, str):
            self.model._set_data(user_id, room_id, "m.fully_read", {"event_id": fully_read})
        for receipt_type in ("m.read", "m.read.private"):
            event_id = body.get(receipt_type)
            if isinstance(event_id, str):
                self._record(room, event_id, receipt_type, user_id)
        return Reply(200, {})

    async def receipt(self, call: Call, room_id: str, receipt_type: str, event_id: str) -> Reply:
        user_id, _, _ = self.model._auth(call.request)
        room = self.model._member_room(user_id, room_id)
        if event_id not in room.by_id:
            raise HTTPError(404, "M_NOT_FOUND", "Event not found")
        self._record(room, event_id, receipt_type, user_id)
        return Reply(200, {})

    def _record(self, room: Room, event_id: str, receipt_type: str, user_id: str) -> None:
        room.receipts.append(
            (self.model._tick(), event_id, receipt_type, user_id, self.model._clock())
        )
