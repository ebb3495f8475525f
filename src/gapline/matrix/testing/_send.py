"""Writing to a room: ``send``, ``redact`` and room state.

``PUT .../send/{type}/{txnId}`` and ``PUT .../redact/{eventId}/{txnId}`` are
idempotent per device, room and transaction ID: a retry with the same ID
answers the first event ID and writes nothing. The sending device's own echo
carries ``unsigned.transaction_id``.
"""

from __future__ import annotations

from ._model import EndpointFamily, HomeserverModel
from ._wire import Call, HTTPError, Reply

__all__ = ["SendEndpoints"]


class SendEndpoints(EndpointFamily):
    def __init__(self, model: HomeserverModel) -> None:
        super().__init__(model)
        # (device_id, room_id, txn_id) -> event_id; a redaction's txn_id is prefixed "redact:"
        self._txns: dict[tuple[str, str, str], str] = {}

    async def send(self, call: Call, room_id: str, event_type: str, txn: str) -> Reply:
        user_id, device_id, _ = self.model._auth(call.request)
        self.model._member_room(user_id, room_id)
        key = (device_id, room_id, txn)
        if key in self._txns:
            return Reply(200, {"event_id": self._txns[key]})
        content = call.body if isinstance(call.body, dict) else {}
        if event_type == "m.reaction":
            self._refuse_duplicate(room_id, user_id, content)
        event = self.model._append(room_id, user_id, event_type, content)
        event.sent_with = (user_id, device_id, txn)
        self._txns[key] = event.event_id
        return Reply(200, {"event_id": event.event_id})

    def _refuse_duplicate(self, room_id: str, user_id: str, content: dict) -> None:
        """Synapse refuses a second identical reaction by one user (400)."""
        rel = content.get("m.relates_to")
        if not isinstance(rel, dict) or rel.get("rel_type") != "m.annotation":
            return
        room = self.model._room(room_id)
        for child in room.children.get(rel.get("event_id", ""), ()):
            crel = child.content.get("m.relates_to")
            if (
                child.sender == user_id
                and child.type == "m.reaction"
                and child.redacted_because is None
                and isinstance(crel, dict)
                and crel.get("key") == rel.get("key")
            ):
                raise HTTPError(400, "M_DUPLICATE_ANNOTATION", "Can't send same reaction twice")

    async def redact(self, call: Call, room_id: str, event_id: str, txn: str) -> Reply:
        user_id, device_id, _ = self.model._auth(call.request)
        self.model._member_room(user_id, room_id)
        key = (device_id, room_id, "redact:" + txn)
        if key in self._txns:
            return Reply(200, {"event_id": self._txns[key]})
        reason = call.body.get("reason") if isinstance(call.body, dict) else None
        event = self.model._redact(room_id, user_id, event_id, reason)
        self._txns[key] = event.event_id
        return Reply(200, {"event_id": event.event_id})

    async def state(
        self, call: Call, room_id: str, event_type: str | None, state_key: str | None
    ) -> Reply:
        """All current state (``event_type=None``), or one state event's content (GET/PUT)."""
        user_id, _, _ = self.model._auth(call.request)
        room = self.model._member_room(user_id, room_id)
        if event_type is None:
            return Reply(200, [ev.to_json() for ev in room.state.values()])
        assert state_key is not None
        if call.request.method == "PUT":
            content = call.body if isinstance(call.body, dict) else {}
            event = self.model._append(room_id, user_id, event_type, content, state_key)
            return Reply(200, {"event_id": event.event_id})
        found = room.state.get((event_type, state_key))
        if found is None:
            raise HTTPError(404, "M_NOT_FOUND", "Event not found.")
        return Reply(200, found.content)
