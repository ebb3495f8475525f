"""The relay's federation side: its libp2p listener, its peers, and the relay RPC it serves.

Started only when ``p2p_listen`` is configured; the descriptor lists the libp2p address
once the listener is bound (``RelayCore.set_p2p_endpoints``), never before. Bootstrap
addresses are dialled at start and re-dialled with backoff while they stay unreachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

from gapline.meshline import check_account_id, check_device_id
from gapline.relay._config import RelayConfig
from gapline.relay._errors import RelayFailure
from gapline.relay._methods import Relay
from gapline.relay._metrics import RelayMetrics
from gapline.relay._p2p._host import DIAL_FAILURES, P2pHost, PeerRejected, VerifiedPeer
from gapline.relay._p2p._identity import PeerIdentity
from gapline.relay._p2p._multiaddr import TcpAddr
from gapline.relay._p2p._peers import FileRegistry, Registry, verify_peer_descriptor
from gapline.relay._peer_rpc import RELAY_PROTOCOL, PeerMethod, PeerRpcServer

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
        methods: dict[str, PeerMethod] = {"device.status": self.device_status}
        self.rpc = PeerRpcServer(
            {name: self._counted(name, m) for name, m in methods.items()},
            business_limit=config.max_request_bytes,
        )
        self.host.set_handler(RELAY_PROTOCOL, self.rpc.handle)

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

    # -- relay RPC methods ------------------------------------------------------------
    async def device_status(self, peer: VerifiedPeer, params: dict[str, Any]) -> dict[str, Any]:
        """From this relay's own current device state only; never a cached answer."""
        account = check_account_id(params.get("account"), self.config.network_context)
        device_id = check_device_id(params.get("device_id"))
        access = await self.relay.access.of(account)
        if access is None:
            raise RelayFailure("target_not_local", "this relay holds no state for the account")
        cert = access.devices.valid(device_id, self.relay.now())
        if cert is None:
            return {"status": "inactive"}
        return {"status": "active", "expires_at": cert.expires_at}

    # -- lifetime ---------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def running(self) -> AsyncGenerator[Federation]:
        assert self.config.p2p_listen is not None
        host, port = self.config.p2p_listen
        async with self.host.running(host, port), asyncio.TaskGroup() as tg:
            self.relay.set_p2p_endpoints(tuple(str(a) for a in self.host.listen_addrs))
            dialers = [
                tg.create_task(self._keep_dialling(TcpAddr.parse(a))) for a in self.config.bootstrap
            ]
            try:
                yield self
            finally:
                for task in dialers:
                    task.cancel()
                self.relay.set_p2p_endpoints(())

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
