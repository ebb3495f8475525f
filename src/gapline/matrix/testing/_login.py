"""Versions, login, registration, whoami and logout: how a client gets a session."""

from __future__ import annotations

import secrets

from ._model import EndpointFamily
from ._wire import Call, HTTPError, Reply

__all__ = ["LoginEndpoints"]


class LoginEndpoints(EndpointFamily):
    async def versions(self, call: Call) -> Reply:
        return Reply(200, {"versions": ["v1.11", "v1.12"], "unstable_features": {}})

    async def flows(self, call: Call) -> Reply:
        """``GET /login``: the model's `login_types` (a test sets SSO only)."""
        return Reply(200, {"flows": [{"type": kind} for kind in self.model.login_types]})

    async def login(self, call: Call) -> Reply:
        """``m.login.password``; a ``device_id`` given again reuses that device."""
        body = call.body
        if not isinstance(body, dict) or body.get("type") not in self.model.login_types:
            raise HTTPError(400, "M_UNKNOWN", "Unknown login type")
        if body.get("type") != "m.login.password":
            raise HTTPError(400, "M_UNKNOWN", "Unknown login type")
        ident = body.get("identifier") or {}
        user = ident.get("user") if isinstance(ident, dict) else None
        if not isinstance(user, str):
            raise HTTPError(400, "M_INVALID_PARAM", "Bad identifier")
        user_id = self.model.user_id(user)
        if self.model._passwords.get(user_id) != body.get("password"):
            raise HTTPError(403, "M_FORBIDDEN", "Invalid username or password")
        return self._logged_in(user_id, body.get("device_id"))

    async def register(self, call: Call) -> Reply:
        """User-interactive auth with the one stage ``m.login.dummy``, as a dev Synapse offers."""
        body = call.body
        if not isinstance(body, dict):
            raise HTTPError(400, "M_BAD_JSON", "Body must be an object")
        auth = body.get("auth")
        if not isinstance(auth, dict) or auth.get("type") != "m.login.dummy":
            return Reply(
                401, {"flows": [{"stages": ["m.login.dummy"]}], "params": {}, "session": "s"}
            )
        username = body.get("username") or secrets.token_hex(4)
        user_id = self.model.user_id(str(username))
        if user_id in self.model._passwords:
            raise HTTPError(400, "M_USER_IN_USE", "User ID already taken.")
        self.model._passwords[user_id] = str(body.get("password", ""))
        if body.get("inhibit_login"):
            return Reply(200, {"user_id": user_id})
        return self._logged_in(user_id, body.get("device_id"))

    async def whoami(self, call: Call) -> Reply:
        user_id, device_id, _ = self.model._auth(call.request)
        return Reply(200, {"user_id": user_id, "device_id": device_id, "is_guest": False})

    async def logout(self, call: Call) -> Reply:
        _, _, token = self.model._auth(call.request)
        self.model.revoke(token)
        return Reply(200, {})

    def _logged_in(self, user_id: str, device_id: str | None) -> Reply:
        session = self.model._new_login(user_id, device_id)
        return Reply(
            200,
            {
                "user_id": user_id,
                "access_token": session.access_token,
                "device_id": session.device_id,
            },
        )
