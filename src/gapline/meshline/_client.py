"""The async timeline client: authenticate, sync, store, yield; reconnect with backoff.

::

    client = MeshlineClient(identity, relay, store)
    async for item in client.messages():
        if isinstance(item, RetentionGap):   # an Unavailable gap: history lost on that relay
            ...
        else:                                # AcceptedMessage, new to this store
            ...

Each pass runs ``message.timeline.sync`` from the stored position until
``has_more`` is false, processing every page with ``process_page`` and
committing it with ``MeshlineStore.commit_page`` before yielding what the
commit added. Over WebSocket the client waits for ``message.timeline.changed``
(a hint only) or the poll interval; over HTTP it polls. Transport failures and
temporary relay errors back off exponentially (with jitter) and reconnect.

Deviation (READING.md §7.1): there is no Registry lookup; the relay's
``relay_id`` and endpoints are pinned in ``RelayEndpoint`` by configuration,
and ``relay.info`` must report the same ``relay_id``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gapline.meshline._base64 import b64u_encode
from gapline.meshline._canonical import NetworkContext, network_bound_bytes
from gapline.meshline._certificates import AccountDeviceState, DeviceCertificate
from gapline.meshline._errors import (
    InvalidPage,
    MeshlineError,
    RateLimited,
    RelayError,
    TransportError,
)
from gapline.meshline._identity import (
    AccountKey,
    DeviceKeys,
    account_auth_input,
    device_auth_input,
    relay_origin,
)
from gapline.meshline._sealing import BoxTarget, SendParams, seal_message
from gapline.meshline._store import MeshlineStore
from gapline.meshline._timeline import (
    AcceptedMessage,
    InboundPolicy,
    LocalDevice,
    RetentionGap,
    SyncPage,
    process_page,
)
from gapline.meshline._transport_http import HttpTransport
from gapline.meshline._transport_ws import WebSocketTransport

__all__ = [
    "Backoff",
    "DeviceIdentity",
    "MeshlineClient",
    "RelayEndpoint",
    "SessionCredentials",
    "TimelineItem",
    "Transport",
]

TimelineItem = AcceptedMessage | RetentionGap

# Codes after which retrying the same call later can succeed.
_TEMPORARY = frozenset({"internal_error", "bad_gateway", "temporarily_unavailable", "rate_limited"})


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


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with full jitter; ``reset`` after a success."""

    initial: float = 0.5
    maximum: float = 30.0
    _attempt: int = 0

    def next_delay(self, at_least: float = 0.0) -> float:
        ceiling = min(self.maximum, self.initial * (2**self._attempt))
        self._attempt += 1
        return max(at_least, random.uniform(ceiling / 2, ceiling))

    def reset(self) -> None:
        self._attempt = 0


class MeshlineClient:
    """Synchronises one device's account timeline from one relay into a ``MeshlineStore``."""

    def __init__(
        self,
        identity: DeviceIdentity,
        relay: RelayEndpoint,
        store: MeshlineStore,
        *,
        policy: InboundPolicy | None = None,
        page_limit: int = 100,
        poll_interval: float = 30.0,
        backoff: Backoff | None = None,
        prefer_websocket: bool = True,
    ):
        if store.owner != identity.account:
            raise ValueError("the store belongs to another account")
        self.identity = identity
        self.relay = relay
        self.store = store
        self._policy = policy
        self._limit = page_limit
        self._poll = poll_interval
        self._backoff = backoff or Backoff()
        self._prefer_ws = prefer_websocket and relay.wss is not None
        self._transport: Transport | None = None
        self._session: SessionCredentials | None = None
        self._ws: WebSocketTransport | None = None
        self._clock_offset = 0  # relay clock minus ours, learnt from a clock_skew answer

    # --- connection -------------------------------------------------------------------------

    async def connect(self) -> None:
        """Open the transport, check the relay's identity and authenticate this device."""
        await self.close()
        if self._prefer_ws:
            assert self.relay.wss is not None
            self._ws = await WebSocketTransport.connect(self.relay.wss)
            self._transport = self._ws
            endpoint = self.relay.wss
        else:
            self._transport = HttpTransport(self.relay.https)
            endpoint = self.relay.https
        info = await self._transport.call("relay.info")
        if not isinstance(info, dict) or info.get("relay_id") != self.relay.relay_id:
            # Not retried: talking to another relay than configured is a configuration fault.
            raise MeshlineError(
                "relay.info reports another relay_id than the pinned one", code="relay_mismatch"
            )
        self._session = await self._authenticate(self._transport, relay_origin(endpoint))

    async def _authenticate(self, transport: Transport, origin: str) -> SessionCredentials:
        """Challenge, sign, verify. On ``clock_skew`` retry once with a fresh challenge and a
        timestamp corrected by the relay clock that challenge exposed (``created_at``)."""
        for attempt in (0, 1):
            challenge = await transport.call("auth.challenge", {"account": self.identity.account})
            if not isinstance(challenge, dict) or not isinstance(challenge.get("nonce"), str):
                raise TransportError("auth.challenge answered without a nonce")
            timestamp = int(time.time()) + self._clock_offset
            payload = device_auth_input(
                relay_id=self.relay.relay_id,
                origin=origin,
                account=self.identity.account,
                device_id=self.identity.device_id,
                nonce=challenge["nonce"],
                timestamp=timestamp,
            )
            signature = self.identity.keys.sign(network_bound_bytes(payload, self.identity.context))
            try:
                result = await transport.call(
                    "auth.device.verify",
                    {
                        "nonce": challenge["nonce"],
                        "timestamp": timestamp,
                        "signer_certificate": self.identity.certificate.to_wire(),
                        "device_signature": b64u_encode(signature),
                    },
                )
            except RelayError as exc:
                created = challenge.get("created_at")
                if exc.code != "clock_skew" or attempt or not isinstance(created, int):
                    raise
                self._clock_offset = created - int(time.time())
                continue
            break
        return SessionCredentials.from_wire(result, mode="device")

    async def close(self) -> None:
        transport, self._transport, self._ws, self._session = self._transport, None, None, None
        if transport is not None:
            await transport.aclose()

    async def __aenter__(self) -> MeshlineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def call(self, method: str, params: Mapping[str, Any] | None = None) -> Any:
        """A session call; re-authenticates once if the relay says the session is gone."""
        if self._transport is None:
            await self.connect()
        for attempt in (0, 1):
            assert self._transport is not None and self._session is not None
            try:
                return await self._transport.call(method, params, session=self._session.token)
            except RelayError as exc:
                if exc.code != "unauthorized" or attempt:
                    raise
                await self.connect()
        raise AssertionError("unreachable")

    # --- sync -------------------------------------------------------------------------------

    async def sync(self) -> list[TimelineItem]:
        """Sync until ``has_more`` is false; what the store newly accepted, in order."""
        new: list[TimelineItem] = []
        local = self.identity.local()
        relay_id = self.relay.relay_id
        while True:
            after = await self.store.position(relay_id)
            result = await self.call(
                "message.timeline.sync", {"after": after, "limit": self._limit}
            )
            try:
                page = SyncPage.from_wire(result)
            except MeshlineError as exc:
                raise InvalidPage(f"sync result is malformed: {exc.message}") from exc
            known = await self.store.known_digests([i.envelope.key for i in page.items])
            outcome = process_page(
                page,
                local=local,
                relay_id=relay_id,
                after=after,
                known=known.get,
                policy=self._policy,
            )
            stored = await self.store.commit_page(relay_id, outcome)
            if stored.gap is not None:
                new.append(stored.gap)
            new.extend(stored.messages)
            if not page.has_more or outcome.stalled or outcome.position == after:
                return new

    async def messages(self) -> AsyncIterator[TimelineItem]:
        """Yield new messages and retention gaps forever, reconnecting as needed.

        An ``InvalidPage`` (the relay broke the response rules) is raised: the
        position cannot move past it and retrying would loop.
        """
        try:
            while True:
                try:
                    if self._transport is None:
                        await self.connect()
                    for item in await self.sync():
                        yield item
                    self._backoff.reset()
                    await self._wait_for_change()
                except (TransportError, RelayError) as exc:
                    if isinstance(exc, RelayError) and exc.code not in _TEMPORARY | {
                        "unauthorized"
                    }:
                        raise
                    hint = exc.retry_after if isinstance(exc, RateLimited) else None
                    await self.close()
                    await asyncio.sleep(self._backoff.next_delay(float(hint or 0)))
        finally:
            await self.close()

    async def _wait_for_change(self) -> None:
        """Until a ``message.timeline.changed`` hint (WebSocket) or the poll interval passes."""
        ws = self._ws
        if ws is None:
            await asyncio.sleep(self._poll)
            return
        try:
            async with asyncio.timeout(self._poll):
                while True:
                    note = await ws.notifications.get()
                    if note is None:
                        raise TransportError("WebSocket connection closed")
                    if note.method == "message.timeline.changed":
                        return
        except TimeoutError:
            return

    # --- account session ----------------------------------------------------------------------

    async def publish_device_state(self, account_key: AccountKey, state: AccountDeviceState) -> Any:
        """``device.state.publish`` under an account session (the bootstrap path: a relay
        cannot authenticate a device before it holds the account's device state)."""
        endpoint = self.relay.https
        transport = HttpTransport(endpoint)
        try:
            challenge = await transport.call("auth.challenge", {"account": self.identity.account})
            if not isinstance(challenge, dict) or not isinstance(challenge.get("nonce"), str):
                raise TransportError("auth.challenge answered without a nonce")
            payload = account_auth_input(
                relay_id=self.relay.relay_id,
                origin=relay_origin(endpoint),
                account=self.identity.account,
                account_public_key=account_key.public_key_b64,
                nonce=challenge["nonce"],
            )
            result = await transport.call(
                "auth.account.verify",
                {
                    "nonce": challenge["nonce"],
                    "account_public_key": account_key.public_key_b64,
                    "account_signature": account_key.sign_object(
                        payload, self.identity.context, exclude=()
                    ),
                },
            )
            session = SessionCredentials.from_wire(result, mode="account")
            return await transport.call(
                "device.state.publish", state.to_wire(), session=session.token
            )
        finally:
            await transport.aclose()

    # --- sending ----------------------------------------------------------------------------

    async def send(
        self,
        to: str,
        content: Mapping[str, Any],
        *,
        recipients: Sequence[DeviceCertificate],
        own_devices: Sequence[DeviceCertificate] | None = None,
    ) -> dict[str, Any]:
        """Seal and ``message.send``; returns the ``DeliveryStatus`` object.

        ``own_devices`` (certificates of this account's devices) adds sender
        boxes so they see the sent record; never used for self-delivery.
        """
        ctx = self.identity.context
        params: SendParams = seal_message(
            content,
            device_keys=self.identity.keys,
            from_=self.identity.account,
            from_device_id=self.identity.device_id,
            to=to,
            recipients=[BoxTarget.of(c, ctx) for c in recipients],
            senders=None
            if own_devices is None or to == self.identity.account
            else [BoxTarget.of(c, ctx) for c in own_devices],
            context=ctx,
        )
        status = await self.call("message.send", params.to_wire())
        if not isinstance(status, dict):
            raise TransportError("message.send answered without a DeliveryStatus")
        return status
