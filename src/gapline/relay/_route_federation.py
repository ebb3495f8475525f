"""The relay DHT for account routes: this relay's replica joined to its peers'.

``FederatedRouteDht`` fills the ``RouteDht`` seam. ``put`` commits to the local replica
(full verification, revision rules) and then sends ``PUT_VALUE`` to the closest eligible
peers, counting as acknowledgements only replies that echo the exact record; it fails
(``temporarily_unavailable``) when fewer than ``replicas`` peers acknowledged, where that
many are connected. ``get`` runs an iterative Kademlia lookup with ``GET_VALUE`` (alpha
parallel queries, closest-first, ending when the k closest known peers have answered),
and verifies every collected record into the local replica, which selection then reads:
a record with a bad signature, an unknown relay or a stale revision is never believed.
The same replica answers other nodes' ``PUT_VALUE``/``GET_VALUE``/``FIND_NODE``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from gapline.meshline import (
    MeshlineError,
    StaleState,
    route_from_record,
    select_route,
    xor_distance,
)
from gapline.relay._errors import RelayFailure
from gapline.relay._methods._route_dht import LocalRouteDht
from gapline.relay._metrics import RelayMetrics
from gapline.relay._p2p._channel import Buffered
from gapline.relay._p2p._frames import FramingError, encode_frame, read_frame
from gapline.relay._p2p._host import DIAL_FAILURES, Connection, P2pHost, VerifiedPeer
from gapline.relay._p2p._kad import FIND_NODE, GET_VALUE, PUT_VALUE, KadMessage, KadPeer
from gapline.relay._p2p._multiaddr import TcpAddr
from gapline.relay._p2p._protobuf import ProtoError
from gapline.relay._p2p._yamux import StreamReset, YamuxStream

__all__ = ["KAD_PROTOCOL", "FederatedRouteDht"]

KAD_PROTOCOL = "/meshline/kad/1.0.0"
K = 20
# Queries in flight per lookup round (local policy): peers are few and already connected,
# so one round usually asks every one of the k closest.
ALPHA = 10
QUERY_TIMEOUT = 5.0

log = logging.getLogger("gapline.relay.dht")


class FederatedRouteDht:
    def __init__(
        self,
        replica: LocalRouteDht,
        host: P2pHost,
        metrics: RelayMetrics,
        *,
        replicas: int,
        addrs_of: Callable[[VerifiedPeer], list[TcpAddr]],
    ) -> None:
        self.replica, self.host, self.metrics = replica, host, metrics
        self.replicas = replicas
        self._addrs_of = addrs_of
        host.set_handler(KAD_PROTOCOL, self.handle)

    # -- as the querying node -----------------------------------------------------------
    def _closest(self, key: bytes, peers: Sequence[VerifiedPeer]) -> list[VerifiedPeer]:
        return sorted(peers, key=lambda p: xor_distance(key, p.peer_id))[:K]

    async def _ask(self, conn: Connection, message: KadMessage) -> KadMessage:
        async with asyncio.timeout(QUERY_TIMEOUT):
            stream, incoming = await conn.open(KAD_PROTOCOL, encode_frame(message.encode()))
            await stream.close()
            reply = KadMessage.decode(await read_frame(incoming, utf8=False))
        if reply.type != message.type or reply.key != message.key:
            raise ProtoError("the reply is for another operation or key")
        return reply

    def _connection(self, peer: VerifiedPeer) -> Connection | None:
        return self.host.connection(peer.peer_id)

    async def put(self, key: bytes, value: bytes) -> None:
        await self.replica.put(key, value)
        acks = await self.replicate(key, value)
        needed = min(self.replicas, len(self.host.peers))
        if acks < needed:
            raise RelayFailure(
                "temporarily_unavailable",
                f"the route reached {acks} of the {needed} replicas required; publish again",
            )

    async def replicate(self, key: bytes, value: bytes) -> int:
        """PUT_VALUE to the closest connected peers; how many acknowledged."""
        message = KadMessage(PUT_VALUE, key, (key, value))

        async def one(peer: VerifiedPeer) -> bool:
            conn = self._connection(peer)
            if conn is None:
                return False
            try:
                reply = await self._ask(conn, message)
            except (*DIAL_FAILURES, FramingError) as exc:
                log.info("PUT_VALUE to %s failed: %s", peer.peer_id_text, exc)
                return False
            return reply.record == (key, value)

        results = await asyncio.gather(*(one(p) for p in self._closest(key, self.host.peers)))
        acks = sum(results)
        self.metrics.dht_ops.labels("put", "ack").inc(acks)
        self.metrics.dht_ops.labels("put", "miss").inc(len(results) - acks)
        return acks

    async def get(self, key: bytes) -> Sequence[bytes]:
        for value in await self.lookup(key):
            try:
                await self.replica.put(key, value)
            except StaleState:
                pass  # older than what is known: selection already has the newer one
            except (MeshlineError, RelayFailure) as exc:
                self.metrics.dht_ops.labels("get", "rejected").inc()
                log.warning("a DHT record for %s was refused: %s", key.hex()[:16], exc)
        return await self.replica.get(key)

    async def lookup(self, key: bytes) -> list[bytes]:
        """Iterative GET_VALUE: the records the k closest reachable peers hold."""
        known: dict[bytes, VerifiedPeer | TcpAddr] = {p.peer_id: p for p in self.host.peers}
        asked: set[bytes] = set()
        records: list[bytes] = []
        message = KadMessage(GET_VALUE, key)

        async def query(peer_id: bytes) -> None:
            target = known[peer_id]
            try:
                if isinstance(target, TcpAddr):
                    conn = await self.host.connect(target)  # verifies its identity first
                else:
                    conn = self._connection(target)
                    if conn is None:
                        return
                reply = await self._ask(conn, message)
            except (*DIAL_FAILURES, FramingError) as exc:
                self.metrics.dht_ops.labels("get", "peer_failed").inc()
                log.info("GET_VALUE to a peer failed: %s", exc)
                return
            if reply.record is not None:
                records.append(reply.record[1])
            for candidate in reply.closer:
                if candidate.id in known or candidate.id == self.host.identity.peer_id:
                    continue
                for raw in candidate.addrs:
                    try:
                        addr = TcpAddr.from_bytes(raw)
                    except MeshlineError:
                        continue
                    if addr.peer_id in (None, candidate.id):
                        known[candidate.id] = addr.with_peer(candidate.id)
                        break

        while True:
            closest = sorted(known, key=lambda p: xor_distance(key, p))[:K]
            batch = [p for p in closest if p not in asked][:ALPHA]
            if not batch:
                break
            asked.update(batch)
            await asyncio.gather(*(query(p) for p in batch))
        self.metrics.dht_ops.labels("get", "records").inc(len(records))
        return records

    # -- as the storage node --------------------------------------------------------------
    def _closer(self, key: bytes, asker: VerifiedPeer) -> tuple[KadPeer, ...]:
        peers = [p for p in self.host.peers if p.peer_id != asker.peer_id]
        return tuple(
            KadPeer(p.peer_id, tuple(a.to_bytes() for a in self._addrs_of(p)))
            for p in self._closest(key, peers)
        )

    async def handle(self, stream: YamuxStream, incoming: Buffered, peer: VerifiedPeer) -> None:
        try:
            message = KadMessage.decode(await read_frame(incoming, utf8=False))
            reply = await self._reply(message, peer)
        except (FramingError, ProtoError, MeshlineError, RelayFailure) as exc:
            # No error field in Kademlia: a refused message resets its stream.
            self.metrics.dht_ops.labels("serve", "reset").inc()
            log.info("DHT stream from %s reset: %s", peer.peer_id_text, exc)
            stream.reset()
            return
        try:
            await stream.write(encode_frame(reply.encode()))
            await stream.close()
        except StreamReset:
            return  # the asker went away; it treats the operation as failed

    async def _reply(self, message: KadMessage, peer: VerifiedPeer) -> KadMessage:
        if message.type == FIND_NODE:
            if not message.key:
                raise ProtoError("FIND_NODE needs a key")
            return KadMessage(FIND_NODE, message.key, None, self._closer(message.key, peer))
        if len(message.key) != 32:
            raise ProtoError("a resource key is 32 bytes")
        if message.type == PUT_VALUE:
            if message.record is None:
                raise ProtoError("PUT_VALUE without a record")
            try:
                await self.replica.put(message.key, message.record[1])
            except StaleState:
                self.metrics.dht_ops.labels("serve_put", "stale").inc()
                return KadMessage(PUT_VALUE, message.key)  # not accepted: no record echoed
            self.metrics.dht_ops.labels("serve_put", "stored").inc()
            return KadMessage(PUT_VALUE, message.key, message.record)
        if message.type == GET_VALUE:
            value = await self._current(message.key)
            record = None if value is None else (message.key, value)
            self.metrics.dht_ops.labels("serve_get", "hit" if record else "miss").inc()
            return KadMessage(GET_VALUE, message.key, record, self._closer(message.key, peer))
        raise ProtoError("message type outside this protocol")

    async def _current(self, key: bytes) -> bytes | None:
        """The one value a GET answers with: the conflict-free highest revision, if any."""
        history, _ = await self.replica.history(key)
        values = await self.replica.get(key)
        now = self.replica.clock()
        pairs = [(route_from_record(key, v, self.replica.context), v) for v in values]
        resolution = select_route(
            [r for r, _ in pairs], history, context=self.replica.context, now=now
        )
        if resolution.route is None:
            return None
        return next(v for r, v in pairs if r is resolution.route)
