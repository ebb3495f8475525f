"""Who the client is and which relays it talks to: identities, endpoints, sessions.

A relay is pinned by configuration (there is no Registry lookup): its ``relay_id``
and endpoints form a ``RelayEndpoint``, and a ``RelayDirectory`` maps the relay IDs
that routes name to endpoints. Sessions are opened per relay origin: a device
session (``auth.device.verify``) for everyday calls, an account session
(``auth.account.verify``) for what only the account key may do.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gapline.meshline._base64 import b64u_encode
from gapline.meshline._canonical import NetworkContext, network_bound_bytes
from gapline.meshline._certificates import DeviceCertificate
from gapline.meshline._errors import RelayError, TransportError
from gapline.meshline._identity import AccountKey, DeviceKeys, account_auth_input, device_auth_input
from gapline.meshline._timeline import LocalDevice

__all__ = [
    "DeviceIdentity",
    "RelayDirectory",
    "RelayEndpoint",
    "SessionCredentials",
    "StaticDirectory",
    "Transport",
    "account_session",
    "device_session",
]


class Transport(Protocol):
    async def call(
        self, method: str, params: Mapping[str, Any] | None = None, *, session: str | None = None
    ) -> Any: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RelayEndpoint:
    """A relay pinned by configuration: its ID, HTTPS base URL and optional WebSocket URL."""

    relay_id: str
    https: str
    wss: str | None = None


class RelayDirectory(Protocol):
    """Endpoints of the relays routes may name (the Registry's role, pinned locally)."""

    def endpoint(self, relay_id: str) -> RelayEndpoint | None: ...


@dataclass(frozen=True, slots=True)
class StaticDirectory:
    relays: Mapping[str, RelayEndpoint] = field(default_factory=dict)

    @classmethod
    def of(cls, *endpoints: RelayEndpoint) -> StaticDirectory:
        return cls({e.relay_id: e for e in endpoints})

    def endpoint(self, relay_id: str) -> RelayEndpoint | None:
        return self.relays.get(relay_id)


@dataclass(frozen=True, slots=True)
class DeviceIdentity:
    """This device: its keys and account-signed certificate."""

    context: NetworkContext
    keys: DeviceKeys
    certificate: DeviceCertificate

    @property
    def account(self) -> str:
        return self.certificate.account

    @property
    def device_id(self) -> str:
        return self.certificate.device_id(self.context)

    def local(self) -> LocalDevice:
        return LocalDevice(self.context, self.account, self.device_id, self.keys.encryption_key)


@dataclass(frozen=True, slots=True)
class SessionCredentials:
    token: str = field(repr=False)
    mode: str
    expires_at: int

    @classmethod
    def from_wire(cls, value: object, *, mode: str) -> SessionCredentials:
        if not isinstance(value, dict):
            raise TransportError("session credentials must be an object")
        token, got, expires = value.get("token"), value.get("mode"), value.get("expires_at")
        if (
            not isinstance(token, str)
            or not 1 <= len(token) <= 256
            or not all("!" <= c <= "~" for c in token)
        ):
            raise TransportError("session token is not 1..256 visible ASCII characters")
        if got != mode:
            # A token returned with another mode must not be used or cached.
            raise TransportError(f"relay returned a {got!r} session for a {mode!r} verification")
        if not isinstance(expires, int) or isinstance(expires, bool):
            raise TransportError("session expires_at must be an integer")
        return cls(token, mode, expires)


async def _challenge(transport: Transport, account: str) -> dict[str, Any]:
    challenge = await transport.call("auth.challenge", {"account": account})
    if not isinstance(challenge, dict) or not isinstance(challenge.get("nonce"), str):
        raise TransportError("auth.challenge answered without a nonce")
    return challenge


async def device_session(
    transport: Transport,
    identity: DeviceIdentity,
    *,
    relay_id: str,
    origin: str,
    clock_offset: int = 0,
) -> tuple[SessionCredentials, int]:
    """Challenge, sign, verify; the session and the relay-clock offset it used.

    On ``clock_skew`` retry once with a fresh challenge and a timestamp corrected by
    the relay clock that challenge exposed (``created_at``).
    """
    for attempt in (0, 1):
        challenge = await _challenge(transport, identity.account)
        timestamp = int(time.time()) + clock_offset
        payload = device_auth_input(
            relay_id=relay_id,
            origin=origin,
            account=identity.account,
            device_id=identity.device_id,
            nonce=challenge["nonce"],
            timestamp=timestamp,
        )
        signature = identity.keys.sign(network_bound_bytes(payload, identity.context))
        try:
            result = await transport.call(
                "auth.device.verify",
                {
                    "nonce": challenge["nonce"],
                    "timestamp": timestamp,
                    "signer_certificate": identity.certificate.to_wire(),
                    "device_signature": b64u_encode(signature),
                },
            )
        except RelayError as exc:
            created = challenge.get("created_at")
            if exc.code != "clock_skew" or attempt or not isinstance(created, int):
                raise
            clock_offset = created - int(time.time())
            continue
        return SessionCredentials.from_wire(result, mode="device"), clock_offset
    raise AssertionError("unreachable")


async def account_session(
    transport: Transport,
    account_key: AccountKey,
    context: NetworkContext,
    *,
    account: str,
    relay_id: str,
    origin: str,
) -> SessionCredentials:
    """An account session: proves control of the account key to this relay origin."""
    challenge = await _challenge(transport, account)
    payload = account_auth_input(
        relay_id=relay_id,
        origin=origin,
        account=account,
        account_public_key=account_key.public_key_b64,
        nonce=challenge["nonce"],
    )
    result = await transport.call(
        "auth.account.verify",
        {
            "nonce": challenge["nonce"],
            "account_public_key": account_key.public_key_b64,
            "account_signature": account_key.sign_object(payload, context, exclude=()),
        },
    )
    return SessionCredentials.from_wire(result, mode="account")
