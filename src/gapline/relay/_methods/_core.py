"""The relay's identity and shared state, which every method family reads.

``RelayCore`` holds the configuration, the store, the relay key and what derives from
them (relay ID, URLs, origin), plus the pure-verification caches several families use.
``Relay`` (``_relay``) is a ``RelayCore`` that also owns the method families.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from gapline.meshline import (
    AccountKey,
    DeviceCertificate,
    check_account_id,
    relay_origin,
    verify_certificate,
)
from gapline.relay._config import RelayConfig
from gapline.relay._errors import RelayFailure
from gapline.relay._store import AcceptedSend, NewSend, TimelineStore

__all__ = ["RelayCore"]

_CACHE_LIMIT = 10_000


class Outbound(Protocol):
    async def accept_outbound(
        self, call_params: dict[str, Any], send: NewSend, device_id: str, held_here: bool
    ) -> dict[str, Any] | None: ...


class Forwarding(Protocol):
    """Client reads of an account homed on another relay, answered by that relay."""

    async def profile(self, account: str) -> dict[str, Any]: ...

    async def device_state(self, account: str, params: dict[str, Any]) -> dict[str, Any]: ...


class RelayCore:
    """What every method family of one relay shares."""

    def __init__(self, config: RelayConfig, store: TimelineStore, key: AccountKey) -> None:
        self.config = config
        self.store = store
        self.key = key
        self.context = config.network_context
        self.relay_id = key.relay_id()
        self.base_url = self.ws_url = self.origin = ""
        # The libp2p TCP addresses actually served (set once the listener is bound).
        self.p2p_endpoints: tuple[str, ...] = ()
        # Federation's delivery service: message.send to accounts homed on other relays.
        self.outbound: Outbound | None = None
        self.forwarder: Forwarding | None = None
        self.on_url_changed: list[Callable[[], None]] = []
        if config.public_url or config.port:
            self.set_url(config.url)  # else: set once the listening port is known
        # Called with (account, revision) after a local device-state acceptance; the server
        # drops cached sessions and re-checks WebSocket bindings.
        self.on_state_accepted: Callable[[str, int], Awaitable[None]] | None = None
        self.on_appended: Callable[[AcceptedSend], None] | None = None
        # Verified certificates by canonical JSON: verification is pure, so cache it.
        self._verified: dict[bytes, str] = {}
        # Signing keys by device ID (any version of a device's certificate carries the same
        # keys, because the device ID derives from them).
        self._signing_keys: dict[str, bytes] = {}

    def set_url(self, url: str) -> None:
        """The HTTPS base URL clients use; sessions and auth signatures bind its origin."""
        self.base_url = url
        self.ws_url = ("wss" + url[5:]) if url.startswith("https") else ("ws" + url[4:])
        self.origin = relay_origin(url)
        for changed in self.on_url_changed:
            changed()

    def set_p2p_endpoints(self, endpoints: tuple[str, ...]) -> None:
        self.p2p_endpoints = endpoints
        for changed in self.on_url_changed:
            changed()

    def now(self) -> int:
        return self.config.clock()

    def account(self, value: object) -> str:
        """A complete account ID of this network (``bad_request`` otherwise)."""
        return check_account_id(value, self.context)

    def verify_certificate(self, cert: DeviceCertificate) -> str:
        """The certificate's device ID once its signatures and binding verify."""
        key = cert.to_json()
        device_id = self._verified.get(key)
        if device_id is None:
            device_id = verify_certificate(cert, self.context)
            if len(self._verified) > _CACHE_LIMIT:
                self._verified.clear()
            self._verified[key] = device_id
        return device_id

    async def device_certificate(self, device_id: str) -> DeviceCertificate:
        """The stored certificate of a device this relay accepted in a device state.

        The session proved the device at authentication; ``device_certificates`` keeps the
        latest version of its certificate, the one the account's state lists.
        """
        text = await self.store.accounts.certificate(device_id)
        if text is None:
            raise RelayFailure("device_unknown", "no certificate for the calling device")
        return DeviceCertificate.from_json(text)

    async def signing_key(self, device_id: str) -> bytes:
        """The Ed25519 key of a device this relay accepted (cached: it never changes)."""
        key = self._signing_keys.get(device_id)
        if key is None:
            key = (await self.device_certificate(device_id)).signing_key_bytes
            if len(self._signing_keys) > 10 * _CACHE_LIMIT:
                self._signing_keys.clear()
            self._signing_keys[device_id] = key
        return key
