"""Cross-relay delivery: ``message.deliver`` as the target, and the source's worker.

Target: the receiving rules (home relay by route, certificate and envelope signatures,
the target's own time checks, contact authorization, a valid recipient device), then the
same acceptance as a local send: keyed on (from, message_id), idempotent over the
canonical JSON of the complete params, the result kept for the retention period.

Source: ``message.send`` to an account whose route names another relay is accepted into
the durable queue (``Deliveries``), answered ``delivering``, and handed to the worker,
which sends the unchanged params until a terminal answer. Errors follow the spec's retry
table: transient ones and lost answers retry the same target with backoff (a lost answer
never moves the message elsewhere); route errors refresh the route, and the target
changes only when a higher-revision route names another relay; other errors end the
delivery with that error, unknown codes as ``bad_gateway``; the fixed deadline ends it
as ``message_expired``. Restarted, the worker reads the queue again; the target's
idempotency makes every resend land once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

from gapline.meshline import (
    AccountRoute,
    DeviceCertificate,
    MeshlineError,
    SendParams,
    check_account_id,
    route_dht_key,
    verify_envelope,
)
from gapline.relay._errors import RelayFailure
from gapline.relay._methods import Relay
from gapline.relay._methods._messaging import MessageMethods, digest_and_parts, new_send
from gapline.relay._metrics import RelayMetrics
from gapline.relay._p2p._frames import FramingError
from gapline.relay._p2p._host import DIAL_FAILURES, P2pHost, VerifiedPeer
from gapline.relay._p2p._multiaddr import TcpAddr
from gapline.relay._peer_rpc import PeerCallError, call_peer_json
from gapline.relay._store import NewSend
from gapline.relay._store._deliveries import PendingDelivery

__all__ = ["DeliveryService"]

log = logging.getLogger("gapline.relay.delivery")

_RETRY = {"internal_error", "bad_gateway", "rate_limited", "temporarily_unavailable"}
_REROUTE = {"route_stale", "target_not_local", "route_not_found", "not_found", "invalid_state"}
_BACKOFF = (1, 2, 5, 10, 30, 60, 300)
CALL_TIMEOUT = 15.0
NO_ROUTE_TTL = 10


class DeliveryService:
    def __init__(
        self,
        relay: Relay,
        host: P2pHost,
        metrics: RelayMetrics,
        messages: MessageMethods,
        addrs_of: Any,
        *,
        concurrency: int = 64,
    ) -> None:
        self.relay, self.host, self.metrics, self.messages = relay, host, metrics, messages
        self._addrs_of = addrs_of  # relay_id -> list[TcpAddr] known for it
        self._routes: dict[str, tuple[AccountRoute | None, int]] = {}
        # Fresh sends; the scan finds everything else.
        self._queue: asyncio.Queue[PendingDelivery] = asyncio.Queue(maxsize=4096)
        self._certificates: dict[str, dict[str, Any]] = {}
        # Keys this process holds in memory (queued or being attempted): the scan leaves
        # them alone. A key settled (finished or postponed) after a scan's read began is
        # skipped by that scan too: the row it read may predate the commit.
        self._owned: set[tuple[str, str]] = set()
        self._settled: dict[tuple[str, str], int] = {}
        self._tick = 0
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(concurrency)
        self._remembered: set[str] = set()  # remote signer certificates already stored
        # Signer certificates already parsed and verified, by their exact wire text.
        self._signers: dict[str, tuple[DeviceCertificate, str]] = {}
        self._accounts_by_key: dict[bytes, str] = {}
        relay.routes.on_changed.append(self._route_changed)
        relay.routes.on_suspended.append(self._forget_routes)

    # -- routes -----------------------------------------------------------------------
    def _route_changed(self, key: bytes) -> None:
        account = self._accounts_by_key.pop(key, None)
        if account is not None:
            self._routes.pop(account, None)

    def _forget_routes(self) -> None:
        self._routes.clear()
        self._accounts_by_key.clear()

    async def route_of(self, account: str, *, refresh: bool = False) -> AccountRoute | None:
        """The account's current route after a DHT lookup, remembered until it expires or a
        replica commit changes any key (None is remembered for ``NO_ROUTE_TTL``)."""
        now = self.relay.now()
        known = self._routes.get(account)
        if known is not None and not refresh and now < known[1]:
            return known[0]
        routes = self.relay.routes
        generation = routes.generation
        route = await routes.current_route(account, remote=True)
        if not routes.cache_trusted or routes.generation != generation:
            return route  # changed meanwhile, or a change may go unheard (route feed down)
        if len(self._routes) > 100_000:
            self._forget_routes()
        self._accounts_by_key[route_dht_key(account, self.relay.context)] = account
        until = now + NO_ROUTE_TTL if route is None else route.expires_at
        self._routes[account] = (route, until)
        return route

    # -- source: accepting a send for another relay -------------------------------------
    async def accept_outbound(
        self, call_params: dict[str, Any], send: NewSend, device_id: str, held_here: bool
    ) -> dict[str, Any] | None:
        """The DeliveryStatus of a send to an account homed elsewhere; None when this relay
        serves the recipient (its route names this relay, or there is no route and this
        relay holds its state: the local path decides)."""
        route = await self.route_of(send.to_account)
        if route is None:
            if held_here:
                return None
            raise RelayFailure("route_not_found", "no route is known for the recipient account")
        if route.relay_id == self.relay.relay_id:
            return None
        deliver: dict[str, Any] = {
            "envelope": call_params["envelope"],
            "recipient_boxes": call_params["recipient_boxes"],
            "signer_certificate": await self._certificate(device_id),
        }
        if "authorization" in call_params:
            deliver["authorization"] = call_params["authorization"]
        config = self.relay.config
        created_at = call_params["envelope"]["created_at"]
        deadline = min(created_at + config.delivery_age_limit, send.now + send.retention)
        text = json.dumps(deliver)
        accepted = await self.relay.store.deliveries.accept(send, text, deadline)
        if self.relay.on_appended is not None and accepted.appended:
            self.relay.on_appended(accepted)
        if not accepted.duplicate:
            item = PendingDelivery(
                send.from_account, send.message_id, send.to_account, text, deadline, 0
            )
            key = (send.from_account, send.message_id)
            if key not in self._owned:
                with contextlib.suppress(asyncio.QueueFull):  # the queue scan picks it up
                    self._queue.put_nowait(item)
                    self._owned.add(key)
        return accepted.result.to_json()

    async def _certificate(self, device_id: str) -> dict[str, Any]:
        """The sending device's certificate (any version verifies its signatures)."""
        wire = self._certificates.get(device_id)
        if wire is None:
            wire = (await self.relay.device_certificate(device_id)).to_wire()
            if len(self._certificates) > 100_000:
                self._certificates.clear()
            self._certificates[device_id] = wire
        return wire

    # -- source: the worker -------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def running(self) -> AsyncGenerator[DeliveryService]:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(self._from_queue(tg)), tg.create_task(self._scan(tg))]
            try:
                yield self
            finally:
                for task in tasks:
                    task.cancel()

    async def _from_queue(self, tg: asyncio.TaskGroup) -> None:
        while True:
            item = await self._queue.get()
            await self._start(tg, item)  # owned since it was queued

    async def _scan(self, tg: asyncio.TaskGroup) -> None:
        """What the in-memory queue does not carry: work left from before a restart (or
        by another process on the same database), and retries whose time has come."""
        while True:
            read_at = self._tick
            for item in await self.relay.store.deliveries.due(self.relay.now(), 256):
                key = (item.from_account, item.message_id)
                if key in self._owned or self._settled.get(key, -1) > read_at:
                    continue  # held here, or the row read predates its settling commit
                self._owned.add(key)
                await self._start(tg, item)
            # Later reads begin after these commits: their rows show them.
            self._settled = {k: t for k, t in self._settled.items() if t > read_at}
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._wake.wait()
            self._wake.clear()

    async def _start(self, tg: asyncio.TaskGroup, item: PendingDelivery) -> None:
        """Attempt an owned item once a slot is free; it stays owned until it settles."""
        await self._slots.acquire()
        key = (item.from_account, item.message_id)
        tg.create_task(self._attempt(item, key))

    async def _attempt(self, item: PendingDelivery, key: tuple[str, str]) -> None:
        try:
            await self._deliver(item)
        except Exception:
            # Not an answer of the target (a store failure, a bug): the item stays queued
            # and the scan tries it again; the worker itself carries on.
            log.exception("delivery of %s failed; it stays queued", item.message_id)
            self.metrics.deliveries.labels("retry_internal").inc()
        finally:
            self._owned.discard(key)
            self._tick += 1
            self._settled[key] = self._tick
            self._slots.release()

    async def _deliver(self, item: PendingDelivery) -> None:
        store = self.relay.store.deliveries
        now = self.relay.now()
        if now >= item.deadline:
            await self._finish(item, "message_expired", "the delivery deadline passed")
            return
        refresh = item.attempts > 0
        try:
            route = await self.route_of(item.to_account, refresh=refresh)
            if route is None:
                raise PeerCallError(-32022, "no route", None)
            conn = await self.connect(route.relay_id)
            async with asyncio.timeout(CALL_TIMEOUT):
                # The queued text itself: every attempt sends the same bytes.
                result = await call_peer_json(conn, "message.deliver", item.params)
        except PeerCallError as exc:
            code = exc.code
            if code in _RETRY or code in _REROUTE or (code is None and exc.number == -32022):
                await self._retry(item, code or "route_not_found")
                return
            if code is None:
                code = "bad_gateway"
            await self._finish(item, code, exc.message)
            return
        except (*DIAL_FAILURES, FramingError, LookupError, MeshlineError) as exc:
            # Receipt unknown (or never attempted; or an answer that is not JSON-RPC): the
            # same target is asked again.
            log.info("delivery of %s not confirmed: %s", item.message_id, exc)
            await self._retry(item, "unreachable")
            return
        if not isinstance(result, dict) or result.get("status") != "target_accepted":
            await self._finish(item, "bad_gateway", "the target answered no target_accepted")
            return
        await store.finish(item, "target_accepted", None)
        self.metrics.deliveries.labels("target_accepted").inc()

    async def connect(self, relay_id: str) -> Any:
        for conn_peer in self.host.peers:
            if conn_peer.relay_id == relay_id:
                conn = self.host.connection(conn_peer.peer_id)
                if conn is not None:
                    return conn
        addrs: list[TcpAddr] = self._addrs_of(relay_id)
        if not addrs:
            raise LookupError(f"no libp2p address known for relay {relay_id}")
        last: Exception | None = None
        for addr in addrs:
            try:
                conn = await self.host.connect(addr)
            except DIAL_FAILURES as exc:
                last = exc
                continue
            if conn.peer.relay_id != relay_id:
                raise LookupError("the address belongs to another relay")
            return conn
        assert last is not None
        raise last

    async def _retry(self, item: PendingDelivery, why: str) -> None:
        self.metrics.deliveries.labels("retry_" + why).inc()
        wait = _BACKOFF[min(item.attempts, len(_BACKOFF) - 1)]
        await self.relay.store.deliveries.postpone(item, self.relay.now() + wait)

    async def _finish(self, item: PendingDelivery, code: str, message: str) -> None:
        error = {"code": code, "message": message}
        await self.relay.store.deliveries.finish(item, "failed", error)
        self.metrics.deliveries.labels("failed_" + code).inc()

    # -- target: message.deliver -------------------------------------------------------
    def _signer(self, wire: object) -> tuple[DeviceCertificate, str]:
        """The certificate and its verified device ID; the same text verifies once."""
        text = json.dumps(wire, sort_keys=True)
        known = self._signers.get(text)
        if known is None:
            cert = DeviceCertificate.from_wire(wire)
            known = (cert, self.relay.verify_certificate(cert))
            if len(self._signers) > 10_000:
                self._signers.clear()
            self._signers[text] = known
        return known

    async def message_deliver(self, peer: VerifiedPeer, params: dict[str, Any]) -> dict[str, Any]:
        core = self.relay
        if "sender_boxes" in params:
            raise RelayFailure("bad_request", "message.deliver carries no sender_boxes")
        if "signer_certificate" not in params:
            raise RelayFailure("bad_request", "signer_certificate is required")
        send = SendParams.from_wire({k: v for k, v in params.items() if k != "signer_certificate"})
        envelope = send.envelope
        check_account_id(envelope.from_, core.context, field="from")
        check_account_id(envelope.to, core.context, field="to")
        if envelope.from_ == envelope.to:
            raise RelayFailure("bad_request", "self-delivery is not delivered between relays")
        cert, device_id = self._signer(params["signer_certificate"])
        if cert.account != envelope.from_ or device_id != envelope.from_device_id:
            raise RelayFailure("invalid_signature", "the certificate is not the envelope signer's")
        verify_envelope(envelope, cert.signing_key_bytes, core.context)
        route = await core.routes.current_route(envelope.to, remote=False)
        if route is not None and route.relay_id != core.relay_id:
            raise RelayFailure("route_stale", "the recipient's current route names another relay")
        if await core.access.of(envelope.to) is None:
            raise RelayFailure("target_not_local", "this relay is not the recipient's home")
        digest, parts, recipient_texts, _ = digest_and_parts(params)
        now = core.now()
        refusal: RelayFailure | None = None
        if envelope.created_at > now + core.config.clock_skew:
            refusal = RelayFailure("clock_skew", "envelope created_at is in the relay's future")
        elif envelope.created_at < now - core.config.delivery_age_limit:
            refusal = RelayFailure("message_expired", "the envelope is older than the age limit")
        denied = await self.messages.authorization(send, now)
        if device_id not in self._remembered:
            await core.store.accounts.remember_certificate(
                device_id, cert.account, json.dumps(cert.to_wire(), sort_keys=True)
            )
            if len(self._remembered) > 100_000:
                self._remembered.clear()
            self._remembered.add(device_id)
        accepted = await core.store.sends.accept(
            new_send(
                send,
                digest,
                parts,
                recipient_texts,
                [],
                retention=core.config.retention,
                now=now,
                refusal=refusal or denied,
            )
        )
        if core.on_appended is not None and accepted.appended:
            core.on_appended(accepted)
        return accepted.result.to_json()
