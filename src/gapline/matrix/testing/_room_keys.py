"""Server-side key backup (``/room_keys/version``, ``/room_keys/keys[/{roomId}[/{sessionId}]]``).

Each user has backup versions; the newest not deleted is the current one. Keys
are stored per version, room and session as the client sent them (the server
never reads ``session_data``); a session is replaced only by a better copy (a
lower ``first_message_index``), as Synapse does. Writing to a version other than
the current one answers 403 ``M_WRONG_ROOM_KEYS_VERSION``; asking for a session
the version lacks answers 404, a room it lacks an empty ``sessions``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._model import EndpointFamily
from ._wire import Call, HTTPError, Reply

__all__ = ["RoomKeysEndpoints"]


@dataclass
class _Version:
    algorithm: str
    auth_data: dict[str, Any]
    keys: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    deleted: bool = False

    def count(self) -> int:
        return sum(len(s) for s in self.keys.values())


class RoomKeysEndpoints(EndpointFamily):
    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self._versions: dict[str, dict[str, _Version]] = {}  # user -> version id -> version

    # -- seeding and inspection (tests) ----------------------------------------------------

    def create_version(self, user_id: str, algorithm: str, auth_data: dict[str, Any]) -> str:
        versions = self._versions.setdefault(user_id, {})
        version = str(len(versions) + 1)
        versions[version] = _Version(algorithm, auth_data)
        return version

    def put_key(
        self, user_id: str, version: str, room_id: str, session_id: str, data: dict[str, Any]
    ) -> None:
        """Store one backed-up session as a client's upload would (a better copy wins)."""
        held = self._versions[user_id][version].keys.setdefault(room_id, {})
        old = held.get(session_id)
        if old is None or data["first_message_index"] < old["first_message_index"]:
            held[session_id] = data

    def keys(self, user_id: str, version: str) -> dict[str, dict[str, dict[str, Any]]]:
        return self._versions[user_id][version].keys

    # -- HTTP ------------------------------------------------------------------------------

    def _current(self, user_id: str) -> tuple[str, _Version] | None:
        live = [(v, b) for v, b in self._versions.get(user_id, {}).items() if not b.deleted]
        return max(live, key=lambda vb: int(vb[0])) if live else None

    def _named(self, user_id: str, version: str | None) -> tuple[str, _Version]:
        if version is None:
            current = self._current(user_id)
            if current is None:
                raise HTTPError(404, "M_NOT_FOUND", "No backup found")
            return current
        found = self._versions.get(user_id, {}).get(version)
        if found is None or found.deleted:
            raise HTTPError(404, "M_NOT_FOUND", f"Unknown backup version {version}")
        return version, found

    async def version(self, call: Call, version: str | None) -> Reply:
        user_id, _, _ = self.model._auth(call.request)
        method = call.request.method
        if method == "POST" and version is None:
            body = call.body if isinstance(call.body, dict) else {}
            created = self.create_version(user_id, body.get("algorithm", ""),
                                          body.get("auth_data", {}))  # fmt: skip
            return Reply(200, {"version": created})
        name, found = self._named(user_id, version)
        if method == "DELETE":
            found.deleted = True
            return Reply(200, {})
        return Reply(200, {
            "algorithm": found.algorithm, "auth_data": found.auth_data, "version": name,
            "count": found.count(), "etag": str(found.count()),
        })  # fmt: skip

    async def keys_route(self, call: Call, room_id: str | None, session_id: str | None) -> Reply:
        user_id, _, _ = self.model._auth(call.request)
        asked = call.query.get("version")
        if asked is None:
            raise HTTPError(400, "M_MISSING_PARAM", "Missing version")
        name, found = self._named(user_id, asked)
        if call.request.method == "PUT":
            current = self._current(user_id)
            if current is None or current[0] != name:
                raise HTTPError(403, "M_WRONG_ROOM_KEYS_VERSION", "Wrong backup version",
                                current_version=None if current is None else current[0])  # fmt: skip
            rooms = (call.body or {}).get("rooms", {})
            for room, sessions in rooms.items():
                for session, data in sessions.get("sessions", {}).items():
                    self.put_key(user_id, name, room, session, data)
            return Reply(200, {"count": found.count(), "etag": str(found.count())})
        if room_id is None:
            return Reply(200, {"rooms": {r: {"sessions": s} for r, s in found.keys.items()}})
        sessions = found.keys.get(room_id, {})
        if session_id is None:
            return Reply(200, {"sessions": sessions})
        if session_id not in sessions:
            raise HTTPError(404, "M_NOT_FOUND", "No room_keys found")
        return Reply(200, sessions[session_id])
