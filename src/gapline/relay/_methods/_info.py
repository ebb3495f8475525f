"""``relay.info`` and ``relay.descriptor``: who this relay is and what it offers."""

from __future__ import annotations

from typing import Any

from gapline.relay._methods._base import Call, Method, SessionMode
from gapline.relay._methods._core import RelayCore

__all__ = ["InfoMethods"]


class InfoMethods:
    def __init__(self, core: RelayCore) -> None:
        self.core = core
        self._descriptor: dict[str, Any] | None = None
        self._descriptor_until = 0
        core.on_url_changed.append(self._forget_descriptor)

    def methods(self) -> list[Method]:
        return [
            Method("relay.descriptor", "GET", SessionMode.NONE, self.relay_descriptor),
            Method("relay.info", "GET", SessionMode.NONE, self.relay_info),
        ]

    def _forget_descriptor(self) -> None:
        self._descriptor = None

    async def relay_info(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        core = self.core
        return {
            "relay_id": core.relay_id,
            "name": core.config.name,
            "server_time": core.now(),
            "limits": {"message_retention": core.config.retention},
        }

    async def relay_descriptor(self, call: Call, params: dict[str, Any]) -> dict[str, Any]:
        return self.descriptor()

    def descriptor(self) -> dict[str, Any]:
        """The signed descriptor, renewed at half its lifetime or when endpoints change."""
        core = self.core
        now = core.now()
        ttl = core.config.descriptor_ttl
        if self._descriptor is None or now >= self._descriptor_until - ttl // 2:
            expires_at = now + ttl
            # The libp2p address is listed only while the listener is bound (a standalone
            # relay has none: a documented deviation, public relays must list one).
            body: dict[str, Any] = {
                "$type": "meshline.relay.descriptor",
                "relay_id": core.relay_id,
                "public_key": core.key.public_key_b64,
                "endpoints": [core.base_url, core.ws_url, *core.p2p_endpoints],
                "expires_at": expires_at,
            }
            body["relay_signature"] = core.key.sign_object(body, core.context, exclude=())
            self._descriptor, self._descriptor_until = body, expires_at
        return self._descriptor
