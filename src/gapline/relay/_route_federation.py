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
from gapline.relay._p2p._host import (
    DIAL_FAILURES,
    Connection,
    P2pHost,
    PeerRejected,
    VerifiedPeer,
)
from gapline.relay._p2p._kad import FIND_NODE, GET_VALUE, PUT_VALUE, KadMessage, KadPeer
from gapline.relay._p2p._multiaddr import TcpAddr
from gapline.relay._p2p._protobuf import ProtoError
from gapline.relay._p2p._routing import BUCKET_SIZE, RoutingTable
from gapline.relay._p2p._yamux import StreamReset, YamuxStream

__all__ = ["KAD_PROTOCOL", "FederatedRouteDht"]

KAD_PROTOCOL = "/meshline/kad/1.0.0"
K = BUCKET_SIZE
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
        # The k-buckets: only peers whose identity and descriptor verified enter them
        # (``observe``, called for every verified connection); ``_peers`` keeps what each
        # one proved, for its addresses and its relay ID.
        self.table = RoutingTable(host.identity.peer_id, k=K)
        self._peers: dict[bytes, VerifiedPeer] = {}
        self._probes: asyncio.Queue[bytes] = asyncio.Queue()
        host.set_handler(KAD_PROTOCOL, self.handle)
        host.on_peer.append(self.observe)

    # -- the routing table ----------------------------------------------------------------
    def observe(self, peer: VerifiedPeer) -> None:
        """A verified peer connected: into its bucket, or a full bucket's replacements (then
        the bucket's least recently seen peer is probed, and evicted if it fails)."""
        for old_id, old in list(self._peers.items()):
            # One Peer ID per relay: a relay that now proves another drops its old one.
            if old.relay_id == peer.relay_id and old_id != peer.peer_id:
                self.forget(old_id)
        self._peers[peer.peer_id] = peer
        added = self.table.add(peer.peer_id)
        if added.probe is not None:
            self._probes.put_nowait(added.probe)

    def forget(self, peer_id: bytes) -> None:
        """Out of the table (unresponsive, or no longer eligible); a replacement moves in."""
        self.table.remove(peer_id)
        self._peers.pop(peer_id, None)

    def retain(self, relay_ids: set[str]) -> None:
        """Keep only peers of these relays (the Registry's active ones)."""
        gone = self.table.retain(p for p, v in self._peers.items() if v.relay_id in relay_ids)
        for peer_id in gone:
            self._peers.pop(peer_id, None)

    async def maintain(self) -> None:
        """Probe each full bucket's least recently seen peer that a newcomer met; one that
        does not answer is evicted for the newcomer (Kademlia's replacement rule)."""
        while True:
            peer_id = await self._probes.get()
            peer = self._peers.get(peer_id)
            if peer is None or peer_id not in self.table:
                continue
            if await self._ping(peer):
                self.metrics.dht_ops.labels("probe", "kept").inc()
                self.table.seen(peer_id)
            else:
                self.metrics.dht_ops.labels("probe", "evicted").inc()
                self.forget(peer_id)

    async def _ping(self, peer: VerifiedPeer) -> bool:
        """Whether the peer answers (a refusal is an answer; silence or no route is not)."""
        try:
            conn = await self._reach(peer)
            await self._ask(conn, KadMessage(FIND_NODE, self.host.identity.peer_id))
        except (*DIAL_FAILURES, FramingError) as exc:
            log.info("probe of %s failed: %s", peer.peer_id_text, exc)
            return (
                not isinstance(exc, TimeoutError) and self.host.connection(peer.peer_id) is not None
            )
        return True

    # -- as the querying node -----------------------------------------------------------
    def _closest(self, key: bytes, exclude: bytes | None = None) -> list[VerifiedPeer]:
        ids = [p for p in self.table.closest(key) if p != exclude][:K]
        return [self._peers[p] for p in ids]

    async def _ask(self, conn: Connection, message: KadMessage) -> KadMessage:
        async with asyncio.timeout(QUERY_TIMEOUT):
            stream, incoming = await conn.open(KAD_PROTOCOL, encode_frame(message.encode()))
            await stream.close()
            reply = KadMessage.decode(await read_frame(incoming, utf8=False))
        if reply.type != message.type or reply.key != message.key:
            raise ProtoError("the reply is for another operation or key")
        return reply

    async def _reach(self, peer: VerifiedPeer) -> Connection:
        """The open connection to a table peer, else a new one to its descriptor's addresses."""
        conn = self.host.connection(peer.peer_id)
        if conn is not None:
            return conn
        failure: Exception = PeerRejected("the peer's descriptor lists no libp2p address")
        for addr in self._addrs_of(peer):
            try:
                return await self.host.connect(addr.with_peer(peer.peer_id))
            except DIAL_FAILURES as exc:
                failure = exc
        raise failure

    async def _query(self, peer: VerifiedPeer, message: KadMessage) -> KadMessage:
        """Ask a table peer; one that cannot be reached or does not answer in time leaves the
        table (one that refuses the operation, by resetting the stream, has answered)."""
        try:
            reply = await self._ask(await self._reach(peer), message)
        except (*DIAL_FAILURES, FramingError) as exc:
            if isinstance(exc, TimeoutError) or self.host.connection(peer.peer_id) is None:
                self.forget(peer.peer_id)
            raise
        self.table.seen(peer.peer_id)
        return reply

    async def put(self, key: bytes, value: bytes) -> None:
        await self.replica.put(key, value)
        asked = len(self._closest(key))
        acks = await self.replicate(key, value)
        needed = min(self.replicas, asked)
        if acks < needed:
            raise RelayFailure(
                "temporarily_unavailable",
                f"the route reached {acks} of the {needed} replicas required; publish again",
            )

    async def replicate(self, key: bytes, value: bytes) -> int:
        """PUT_VALUE to the closest connected peers; how many acknowledged."""
        message = KadMessage(PUT_VALUE, key, (key, value))

        async def one(peer: VerifiedPeer) -> bool:
            try:
                reply = await self._query(peer, message)
            except (*DIAL_FAILURES, FramingError) as exc:
                log.info("PUT_VALUE to %s failed: %s", peer.peer_id_text, exc)
                return False
            return reply.record == (key, value)

        results = await asyncio.gather(*(one(p) for p in self._closest(key)))
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
        known: dict[bytes, VerifiedPeer | TcpAddr] = {p.peer_id: p for p in self._closest(key)}
        asked: set[bytes] = set()
        records: list[bytes] = []
        message = KadMessage(GET_VALUE, key)

        async def query(peer_id: bytes) -> None:
            target = known[peer_id]
            try:
                if isinstance(target, TcpAddr):
                    # Verifies its identity first; a verified peer joins the table.
                    reply = await self._ask(await self.host.connect(target), message)
                else:
                    reply = await self._query(target, message)
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
        return tuple(
            KadPeer(p.peer_id, tuple(a.to_bytes() for a in self._addrs_of(p)))
            for p in self._closest(key, exclude=asker.peer_id)
        )

    async def handle(self, stream: YamuxStream, incoming: Buffered, peer: VerifiedPeer) -> None:
        if peer.peer_id in self.table:
            self.table.seen(peer.peer_id)
        else:
            self.observe(peer)  # verified at its handshake, and evidently answering
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
