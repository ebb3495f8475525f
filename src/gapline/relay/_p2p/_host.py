"""The libp2p host: TCP listener and dialer, Noise XX with descriptors, yamux, protocols.

A connection carries no business stream until the peer's handshake descriptor passed
``verify_peer`` (signature, Registry record, and the Peer ID the Noise handshake proved);
a failed check closes it. One connection per peer is kept and reused. Every connection
reader and every inbound stream handler is a task of the host's TaskGroup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass

from gapline.meshline import b58encode
from gapline.relay._p2p._channel import (
    Buffered,
    NoiseChannel,
    TcpChannel,
    negotiate_dialer,
    negotiate_listener,
    proposal,
)
from gapline.relay._p2p._identity import HandshakePayload, PeerIdentity
from gapline.relay._p2p._multiaddr import TcpAddr
from gapline.relay._p2p._multistream import MultistreamError
from gapline.relay._p2p._noise import HandshakeState, NoiseError, StaticKey
from gapline.relay._p2p._protobuf import ProtoError
from gapline.relay._p2p._yamux import StreamReset, YamuxError, YamuxSession, YamuxStream

__all__ = ["DIAL_FAILURES", "Connection", "P2pHost", "PeerRejected", "VerifiedPeer"]

log = logging.getLogger("gapline.relay.p2p")

NOISE = "/noise"
YAMUX = "/yamux/1.0.0"
HANDSHAKE_TIMEOUT = 10.0


class PeerRejected(Exception):
    """The peer's identity did not verify: the connection was closed."""


# What dialling a peer may fail with (besides cancellation): all mean "not connected".
DIAL_FAILURES = (
    NoiseError,
    ProtoError,
    MultistreamError,
    PeerRejected,
    TimeoutError,
    OSError,
    StreamReset,
)


@dataclass(frozen=True, slots=True)
class VerifiedPeer:
    peer_id: bytes
    relay_id: str
    descriptor: bytes

    @property
    def peer_id_text(self) -> str:
        return b58encode(self.peer_id)


# (peer_id, descriptor bytes) -> the relay it verified as; raises to refuse.
PeerVerifier = Callable[[bytes, bytes], str]
StreamHandler = Callable[[YamuxStream, Buffered, "VerifiedPeer"], Awaitable[None]]


class Connection:
    def __init__(self, session: YamuxSession, peer: VerifiedPeer) -> None:
        self.session = session
        self.peer = peer

    async def open(self, protocol: str, first: bytes) -> tuple[YamuxStream, Buffered]:
        """A new stream for ``protocol``, ``first`` sent optimistically with the proposal."""
        stream = self.session.open_stream()
        incoming = Buffered(stream.read)
        try:
            await stream.write(proposal(protocol) + first)  # one data frame
            await negotiate_dialer(None, incoming, protocol)
        except (MultistreamError, StreamReset):
            stream.reset()
            raise
        return stream, incoming


class P2pHost:
    def __init__(
        self,
        identity: PeerIdentity,
        descriptor: Callable[[], bytes],
        verify_peer: PeerVerifier,
        *,
        max_connections: int = 256,
    ) -> None:
        self.identity = identity
        self._descriptor = descriptor
        self._verify = verify_peer
        self._handlers: dict[str, StreamHandler] = {}
        self._connections: dict[bytes, Connection] = {}
        self._dialing: dict[bytes, asyncio.Future[Connection]] = {}
        self._tg: asyncio.TaskGroup | None = None
        self._server: asyncio.Server | None = None
        self._slots = asyncio.Semaphore(max_connections)
        self.listen_addrs: list[TcpAddr] = []
        self.on_peer: list[Callable[[VerifiedPeer], None]] = []

    def set_handler(self, protocol: str, handler: StreamHandler) -> None:
        self._handlers[protocol] = handler

    def connection(self, peer_id: bytes) -> Connection | None:
        conn = self._connections.get(peer_id)
        return None if conn is None or conn.session.closed else conn

    @property
    def peers(self) -> list[VerifiedPeer]:
        return [c.peer for c in self._connections.values() if not c.session.closed]

    @contextlib.asynccontextmanager
    async def running(self, host: str | None = None, port: int = 0) -> AsyncGenerator[P2pHost]:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            try:
                if host is not None:
                    self._server = await asyncio.start_server(self._inbound, host, port)
                    for sock in self._server.sockets:
                        addr = sock.getsockname()
                        kind = "ip6" if ":" in addr[0] else "ip4"
                        self.listen_addrs.append(
                            TcpAddr(kind, addr[0], addr[1], self.identity.peer_id)
                        )
                yield self
            finally:
                if self._server is not None:
                    self._server.close()
                for conn in list(self._connections.values()):
                    conn.session.close()
                self._connections.clear()
                self._tg = None

    # -- connection setup -----------------------------------------------------------
    async def _secure(
        self, tcp: TcpChannel, *, initiator: bool, expected_peer: bytes | None
    ) -> tuple[NoiseChannel, VerifiedPeer]:
        incoming = Buffered(tcp.read)
        if initiator:
            await negotiate_dialer(tcp.write, incoming, NOISE)
        else:
            await negotiate_listener(tcp.write, incoming, {NOISE})
        static = StaticKey.generate()
        hs = HandshakeState(initiator=initiator, static=static)

        def send(message: bytes) -> None:
            tcp.write(len(message).to_bytes(2, "big") + message)

        async def receive() -> bytes:
            return await incoming.exactly(int.from_bytes(await incoming.exactly(2), "big"))

        mine = self.identity.payload(static.public, self._descriptor())
        if initiator:
            send(hs.write_message(b""))
            peer = self._check(hs, hs.read_message(await receive()), expected_peer)
            send(hs.write_message(mine))  # only to a responder already verified
        else:
            hs.read_message(await receive())
            send(hs.write_message(mine))
            peer = self._check(hs, hs.read_message(await receive()), expected_peer)
        await tcp.drain()
        send_cipher, recv_cipher = hs.split()
        channel = NoiseChannel(tcp, incoming, send_cipher, recv_cipher)
        return channel, peer

    def _check(
        self, hs: HandshakeState, theirs: bytes, expected_peer: bytes | None
    ) -> VerifiedPeer:
        assert hs.remote_static is not None
        payload = HandshakePayload.verify(theirs, hs.remote_static)
        if expected_peer is not None and payload.peer_id != expected_peer:
            raise PeerRejected("the handshake proved another Peer ID than the one dialled")
        try:
            relay_id = self._verify(payload.peer_id, payload.descriptor)
        except Exception as exc:
            raise PeerRejected(f"peer descriptor refused: {exc}") from exc
        return VerifiedPeer(payload.peer_id, relay_id, payload.descriptor)

    async def _upgrade(
        self, tcp: TcpChannel, *, initiator: bool, expected_peer: bytes | None
    ) -> Connection:
        channel, peer = await self._secure(tcp, initiator=initiator, expected_peer=expected_peer)
        inner = Buffered(channel.read)
        if initiator:
            await negotiate_dialer(channel.write, inner, YAMUX)
        else:
            await negotiate_listener(channel.write, inner, {YAMUX})
        await channel.drain()
        leftover = inner.take()

        async def first_then_channel() -> bytes:
            nonlocal leftover
            if leftover:
                out, leftover = leftover, b""
                return out
            return await channel.read()

        channel_view = _Rechannel(channel, first_then_channel)
        return Connection(YamuxSession(channel_view, client=initiator), peer)

    def _adopt(self, conn: Connection) -> None:
        old = self._connections.get(conn.peer.peer_id)
        if old is not None and not old.session.closed:
            old.session.close()  # a reconnecting peer replaces its stale connection
        self._connections[conn.peer.peer_id] = conn
        assert self._tg is not None
        self._tg.create_task(self._serve(conn))
        for callback in self.on_peer:
            callback(conn.peer)

    async def _inbound(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tcp = TcpChannel(reader, writer)
        if self._slots.locked():
            writer.close()
            return
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                conn = await self._upgrade(tcp, initiator=False, expected_peer=None)
        except DIAL_FAILURES as exc:
            log.warning("inbound libp2p connection refused: %s", exc)
            writer.close()
            return
        self._adopt(conn)

    async def connect(self, addr: TcpAddr) -> Connection:
        """The verified connection to the peer at ``addr`` (reused while it is open)."""
        if addr.peer_id is None:
            raise PeerRejected("a dial address must name its Peer ID")
        conn = self._connections.get(addr.peer_id)
        if conn is not None and not conn.session.closed:
            return conn
        pending = self._dialing.get(addr.peer_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        self._dialing[addr.peer_id] = future
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                reader, writer = await asyncio.open_connection(addr.host, addr.port)
                tcp = TcpChannel(reader, writer)
                try:
                    conn = await self._upgrade(tcp, initiator=True, expected_peer=addr.peer_id)
                except BaseException:
                    writer.close()
                    raise
            self._adopt(conn)
            future.set_result(conn)
            return conn
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: the waiters (if any) get it too
            raise
        finally:
            self._dialing.pop(addr.peer_id, None)

    # -- streams ----------------------------------------------------------------------
    async def _serve(self, conn: Connection) -> None:
        async with self._slots, asyncio.TaskGroup() as streams:
            runner = streams.create_task(self._read(conn))
            while (stream := await conn.session.accept()) is not None:
                streams.create_task(self._stream(stream, conn.peer))
            await runner
        if self._connections.get(conn.peer.peer_id) is conn:
            del self._connections[conn.peer.peer_id]

    async def _read(self, conn: Connection) -> None:
        try:
            await conn.session.run()
        except (YamuxError, NoiseError, ConnectionError) as exc:
            log.warning("libp2p connection to %s ended: %s", conn.peer.peer_id_text, exc)

    async def _stream(self, stream: YamuxStream, peer: VerifiedPeer) -> None:
        incoming = Buffered(stream.read)
        try:
            protocol = await negotiate_listener(stream.send_now, incoming, self._handlers)
            await self._handlers[protocol](stream, incoming, peer)
        except (MultistreamError, StreamReset) as exc:
            log.info("stream from %s reset: %s", peer.peer_id_text, exc)
            stream.reset()
        except Exception:
            # A handler's failure is that stream's, not the connection's or the process's.
            log.exception("stream handler failed; stream from %s reset", peer.peer_id_text)
            stream.reset()


class _Rechannel:
    """The noise channel, read through whatever yamux negotiation left buffered."""

    def __init__(self, channel: NoiseChannel, read: Callable[[], Awaitable[bytes]]) -> None:
        self._channel = channel
        self._read = read

    async def read(self) -> bytes:
        return await self._read()

    def write(self, data: bytes) -> None:
        self._channel.write(data)

    async def drain(self) -> None:
        await self._channel.drain()

    def close(self) -> None:
        self._channel.close()
