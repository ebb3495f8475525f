"""The relay's federation side: its libp2p listener, its peers, and the relay RPC it serves.

Started only when ``p2p_listen`` is configured; the descriptor lists the libp2p address
once the listener is bound (``RelayCore.set_p2p_endpoints``), never before. Bootstrap
addresses are dialled at start and re-dialled with backoff while they stay unreachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from gapline.meshline import (
    MeshlineError,
    RelayDescriptor,
    b64u_decode,
    check_account_id,
    check_device_id,
    parse_json,
    route_from_record,
)
from gapline.relay._config import RelayConfig
from gapline.relay._delivery import DeliveryService
from gapline.relay._errors import RelayFailure
from gapline.relay._methods import Relay
from gapline.relay._metrics import RelayMetrics
from gapline.relay._p2p._host import DIAL_FAILURES, P2pHost, PeerRejected, VerifiedPeer
from gapline.relay._p2p._identity import PeerIdentity
from gapline.relay._p2p._multiaddr import TcpAddr
from gapline.relay._p2p._peers import (
    FileRegistry,
    Registry,
    libp2p_addrs,
    verify_peer_descriptor,
)
from gapline.relay._peer_queries import AccountQueries, Forwarder
from gapline.relay._peer_rpc import RELAY_PROTOCOL, PeerMethod, PeerRpcServer, notify_peer
from gapline.relay._route_federation import FederatedRouteDht

__all__ = ["Federation"]

log = logging.getLogger("gapline.relay.federation")
_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


class Federation:
    def __init__(
        self,
        relay: Relay,
        config: RelayConfig,
        metrics: RelayMetrics,
        registry: Registry | None = None,
    ) -> None:
        if registry is None:
            if config.registry_file is None:
                raise ValueError("a libp2p listener needs a registry file (--registry-file)")
            registry = FileRegistry(config.registry_file, config.network_context)
        self.relay, self.config, self.metrics, self.registry = relay, config, metrics, registry
        self.identity = PeerIdentity.from_relay_key(relay.key)
        self.host = P2pHost(self.identity, self._descriptor, self._verify)
        self.host.on_peer.append(lambda _: self.metrics.peers.set(len(self.host.peers)))
        self.dht = FederatedRouteDht(
            relay.routes.replica,
            self.host,
            metrics,
            replicas=config.route_replicas,
            addrs_of=self._peer_addrs,
        )
        relay.routes.dht = self.dht
        relay.routes.peer_key = self._relay_key
        relay.routes.cache_missing = False
        self.delivery = DeliveryService(
            relay, self.host, metrics, relay.messages, self._addrs_of_relay
        )
        relay.outbound = self.delivery
        self._republish_now = asyncio.Event()
        self.host.on_peer.append(lambda _: self._republish_now.set())
        self._fetched: dict[str, tuple[int, list[TcpAddr]]] = {}
        # One client for every descriptor fetch: building one loads the TLS trust store,
        # which takes the event loop for a long moment each time.
        self._http: httpx.AsyncClient | None = None
        self.queries = AccountQueries(relay)
        relay.forwarder = Forwarder(
            relay,
            self.delivery.route_of,
            self.delivery.connect,
            lambda method: metrics.peer_calls.labels(method, "unverified_answer").inc(),
        )
        methods: dict[str, PeerMethod] = {
            "device.status": self.queries.device_status,
            "device.state.resolve": self.queries.device_state_resolve,
            "profile.resolve": self.queries.profile_resolve,
            "message.deliver": self.delivery.message_deliver,
            "device.status.changed": self.device_status_changed,
        }
        self.rpc = PeerRpcServer(
            {name: self._counted(name, m) for name, m in methods.items()},
            business_limit=config.max_request_bytes,
        )
        self.host.set_handler(RELAY_PROTOCOL, self.rpc.handle)

    def _relay_key(self, relay_id: str) -> bytes | None:
        """An active Registry relay's key (its routes verify against it)."""
        entry = self.registry.entry(relay_id)
        if entry is None or entry.status != "active":
            return None
        return b64u_decode(entry.public_key, length=33)

    @staticmethod
    def _peer_addrs(peer: VerifiedPeer) -> list[TcpAddr]:
        return libp2p_addrs(RelayDescriptor.from_wire(parse_json(peer.descriptor)).endpoints)

    def _addrs_of_relay(self, relay_id: str) -> list[TcpAddr]:
        """Where to dial a relay: its verified descriptor's libp2p addresses."""
        for peer in self.host.peers:
            if peer.relay_id == relay_id:
                return self._peer_addrs(peer)
        cached = self._fetched.get(relay_id)
        if cached is not None and cached[0] > self.relay.now():
            return cached[1]
        return []

    async def fetch_descriptor(self, relay_id: str) -> None:
        """Learn a relay's addresses from its Registry URL (``relay/descriptor``)."""
        entry = self.registry.entry(relay_id)
        if entry is None or entry.status != "active":
            return
        if self._http is None:
            raise RuntimeError("descriptor fetches run while the federation is running")
        response = await self._http.get(entry.url.rstrip("/") + "/relay/descriptor")
        raw = response.content
        descriptor = RelayDescriptor.from_wire(parse_json(raw))
        addrs = libp2p_addrs(descriptor.endpoints)
        if not addrs:
            return
        verify_peer_descriptor(
            addrs[0].peer_id or b"",
            raw,
            registry=self.registry,
            context=self.config.network_context,
            now=self.relay.now,
        )
        self._fetched[relay_id] = (descriptor.expires_at, addrs)

    def _descriptor(self) -> bytes:
        return json.dumps(self.relay.info.descriptor()).encode()

    def _verify(self, peer_id: bytes, raw: bytes) -> str:
        relay_id, _ = verify_peer_descriptor(
            peer_id,
            raw,
            registry=self.registry,
            context=self.config.network_context,
            now=self.relay.now,
        )
        if relay_id == self.relay.relay_id:
            raise PeerRejected("a connection to this relay itself")
        return relay_id

    def _counted(self, name: str, method: PeerMethod) -> PeerMethod:
        async def run(peer: VerifiedPeer, params: dict[str, Any]) -> Any:
            try:
                result = await method(peer, params)
            except RelayFailure as exc:
                self.metrics.peer_calls.labels(name, exc.code).inc()
                raise
            self.metrics.peer_calls.labels(name, "ok").inc()
            return result

        return run

    # -- lifetime ---------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def running(self) -> AsyncGenerator[Federation]:
        assert self.config.p2p_listen is not None
        host, port = self.config.p2p_listen
        async with (
            httpx.AsyncClient(timeout=10) as http,  # closed after every task using it
            self.host.running(host, port),
            self.delivery.running(),
            asyncio.TaskGroup() as tg,
        ):
            self._http = http
            self.relay.set_p2p_endpoints(tuple(str(a) for a in self.advertised()))
            dialers = [
                tg.create_task(self._keep_dialling(TcpAddr.parse(a))) for a in self.config.bootstrap
            ]
            dialers.append(tg.create_task(self._republishing()))
            dialers.append(tg.create_task(self._sending_hints()))
            dialers.append(tg.create_task(self._registry_peers()))
            dialers.append(tg.create_task(self.dht.maintain()))
            try:
                yield self
            finally:
                for task in dialers:
                    task.cancel()
                self.relay.set_p2p_endpoints(())

    def advertised(self) -> list[TcpAddr]:
        """The libp2p addresses the descriptor lists: ``--p2p-announce`` (each naming this
        relay's Peer ID), else the bound ones, never an unspecified host."""
        own = self.identity.peer_id
        if self.config.p2p_announce:
            out = []
            for text in self.config.p2p_announce:
                addr = TcpAddr.parse(text)
                if addr.peer_id not in (None, own):
                    raise ValueError(f"--p2p-announce {text}: names another Peer ID")
                out.append(addr.with_peer(own))
            return out
        bound = [a for a in self.host.listen_addrs if not _unspecified(a)]
        if not bound:
            raise ValueError("the libp2p listener has no dialable address: use --p2p-announce")
        return bound

    async def device_status_changed(self, peer: VerifiedPeer, params: dict[str, Any]) -> None:
        """A home relay's hint that a device's status may have changed.

        Believed only from the relay the account's current route names. This relay keeps
        no ``device.status`` cache (it asks only when it needs an answer), so a believed
        hint has nothing to invalidate; it is counted.
        """
        account = check_account_id(params.get("account"), self.config.network_context)
        check_device_id(params.get("device_id"))
        route = await self.delivery.route_of(account)
        if route is None or route.relay_id != peer.relay_id:
            raise RelayFailure("forbidden", "the sender is not the account's home relay")

    async def _sending_hints(self) -> None:
        while True:
            relay_id, hint = await self.queries.hints.get()
            try:
                conn = await self.delivery.connect(relay_id)
                await notify_peer(conn, "device.status.changed", hint)
            except (*DIAL_FAILURES, LookupError) as exc:
                log.info("device.status.changed to %s not sent: %s", relay_id, exc)

    async def _republishing(self) -> None:
        """Keep this relay's routes in the DHT: at start, on each new peer, and hourly."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.republish_interval):
                    await self._republish_now.wait()
            self._republish_now.clear()
            await self.republish()

    async def republish(self) -> int:
        """PUT every unexpired route this relay is home for to its peers; how many."""
        count, after = 0, ""
        while True:
            rows = await self.relay.store.routes.held(self.relay.now(), after, 256)
            if not rows:
                return count
            for key_hex, value in rows:
                key = bytes.fromhex(key_hex)
                route = route_from_record(key, value.encode(), self.config.network_context)
                if route.relay_id == self.relay.relay_id:
                    await self.dht.replicate(key, value.encode())
                    count += 1
            after = rows[-1][0]

    async def _registry_peers(self) -> None:
        """Dial the Registry's other active relays whose descriptors can be fetched."""
        while True:
            active = {e.relay_id for e in self.registry.entries() if e.status == "active"}
            self.dht.retain(active)  # the routing table holds only eligible relays
            for peer in self.host.peers:
                if peer.relay_id in active and peer.peer_id not in self.dht.table:
                    self.dht.observe(peer)  # evicted earlier, still connected and verified
            for entry in self.registry.entries():
                if entry.relay_id == self.relay.relay_id or entry.status != "active":
                    continue
                if any(p.relay_id == entry.relay_id for p in self.host.peers):
                    continue
                try:
                    await self.fetch_descriptor(entry.relay_id)
                    for addr in self._addrs_of_relay(entry.relay_id):
                        await self.host.connect(addr)
                        break
                except (*DIAL_FAILURES, httpx.HTTPError, MeshlineError) as exc:
                    log.info("registry relay %s not reached: %s", entry.relay_id, exc)
            await asyncio.sleep(self.config.peer_refresh_interval)

    async def _keep_dialling(self, addr: TcpAddr) -> None:
        attempt = 0
        while True:
            try:
                conn = await self.host.connect(addr)
                attempt = 0
                await conn.session.ended.wait()
                self.metrics.peers.set(len(self.host.peers))
            except DIAL_FAILURES as exc:  # logged, and the peer is dialled again
                log.warning("bootstrap peer %s unreachable: %s", addr, exc)
                await asyncio.sleep(_BACKOFF[min(attempt, len(_BACKOFF) - 1)])
                attempt += 1


def _unspecified(addr: TcpAddr) -> bool:
    return addr.host_kind in ("ip4", "ip6") and ipaddress.ip_address(addr.host).is_unspecified
