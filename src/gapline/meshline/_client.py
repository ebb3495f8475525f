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

Deviation: there is no Registry lookup; the relay's ``relay_id`` and endpoints
are pinned in ``RelayEndpoint`` by configuration (other relays a route may name,
in a ``RelayDirectory``), and ``relay.info`` must report the same ``relay_id``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from gapline.meshline._client_accounts import AccountCalls
from gapline.meshline._errors import (
    InvalidPage,
    MeshlineError,
    RateLimited,
    RelayError,
    TransportError,
)
from gapline.meshline._identity import relay_origin
from gapline.meshline._session import (
    DeviceIdentity,
    RelayDirectory,
    RelayEndpoint,
    SessionCredentials,
    StaticDirectory,
    Transport,
    device_session,
)
from gapline.meshline._store import MeshlineStore
from gapline.meshline._timeline import (
    AcceptedMessage,
    InboundPolicy,
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
    "RelayDirectory",
    "RelayEndpoint",
    "SessionCredentials",
    "StaticDirectory",
    "TimelineItem",
    "Transport",
]

TimelineItem = AcceptedMessage | RetentionGap

# Codes after which retrying the same call later can succeed.
_TEMPORARY = frozenset({"internal_error", "bad_gateway", "temporarily_unavailable", "rate_limited"})


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


class MeshlineClient(AccountCalls):
    """Synchronises one device's account timeline from its home relay into a ``MeshlineStore``;
    sending and the account, profile, route and contact calls come from ``AccountCalls``."""

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
        directory: RelayDirectory | None = None,
        max_skew: int = 300,
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
        self.directory: RelayDirectory = directory or StaticDirectory.of(relay)
        self.max_skew = max_skew
        self._init_account_calls()

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
        session, self._clock_offset = await device_session(
            transport,
            self.identity,
            relay_id=self.relay.relay_id,
            origin=origin,
            clock_offset=self._clock_offset,
        )
        return session

    async def close(self) -> None:
        transport, self._transport, self._ws, self._session = self._transport, None, None, None
        try:
            if transport is not None:
                await transport.aclose()
        finally:
            await self._close_peers()

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
