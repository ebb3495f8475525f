"""The libp2p layer between relays: Noise XX with descriptors, yamux streams, stream frames."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from gapline.meshline import AccountKey, BadRequest, NetworkContext, b64u_encode, encode_uvarint
from gapline.relay._p2p._channel import Buffered, TcpChannel
from gapline.relay._p2p._frames import FRAME_LIMIT, FramingError, encode_frame, read_frame
from gapline.relay._p2p._host import P2pHost, PeerRejected, VerifiedPeer
from gapline.relay._p2p._identity import PeerIdentity
from gapline.relay._p2p._multiaddr import TcpAddr
from gapline.relay._p2p._peers import FileRegistry, sign_registry_entry, verify_peer_descriptor
from gapline.relay._p2p._yamux import StreamReset, YamuxStream

CTX = NetworkContext("neo:860833102:0x" + "0" * 40)


class Node:
    """A relay key, its host, and the descriptor it presents (mutable for fault cases)."""

    def __init__(self, registry: FileRegistry, url: str) -> None:
        self.key = AccountKey.generate()
        self.url = url
        self.identity = PeerIdentity.from_relay_key(self.key)
        self.tamper: Callable[[dict[str, Any]], None] | None = None
        self.host = P2pHost(self.identity, self.descriptor, self.verify(registry))

    def descriptor(self) -> bytes:
        addrs = self.host.listen_addrs or [TcpAddr("ip4", "127.0.0.1", 9, self.identity.peer_id)]
        body: dict[str, Any] = {
            "$type": "meshline.relay.descriptor",
            "relay_id": self.key.relay_id(),
            "public_key": self.key.public_key_b64,
            "endpoints": [self.url, str(addrs[0])],
            "expires_at": int(time.time()) + 3600,
        }
        body["relay_signature"] = self.key.sign_object(body, CTX, exclude=())
        if self.tamper is not None:
            self.tamper(body)
        return json.dumps(body).encode()

    @staticmethod
    def verify(registry: FileRegistry) -> Callable[[bytes, bytes], str]:
        def check(peer_id: bytes, raw: bytes) -> str:
            relay_id, _ = verify_peer_descriptor(
                peer_id, raw, registry=registry, context=CTX, now=lambda: int(time.time())
            )
            return relay_id

        return check


def nodes(tmp_path: Path, count: int, *, registered: int | None = None) -> list[Node]:
    path = tmp_path / "registry.json"
    registry = FileRegistry(path, CTX)
    out = [Node(registry, f"https://relay{i}.test/meshline/v1") for i in range(count)]
    listed = out if registered is None else out[:registered]
    FileRegistry.write(path, [sign_registry_entry(n.key, n.url, CTX) for n in listed])
    return out


async def echo(stream: YamuxStream, incoming: Buffered, peer: VerifiedPeer) -> None:
    try:
        data = await read_frame(incoming)
    except FramingError:
        stream.reset()
        return
    await stream.write(encode_frame(peer.relay_id.encode() + b":" + data))
    await stream.close()


async def call(host: P2pHost, addr: TcpAddr, raw: bytes) -> bytes:
    conn = await host.connect(addr)
    stream, incoming = await conn.open("/test/echo", raw)
    await stream.close()
    return await read_frame(incoming)


async def test_relays_authenticate_each_other_and_exchange_frames(tmp_path: Path) -> None:
    a, b = nodes(tmp_path, 2)
    b.host.set_handler("/test/echo", echo)
    async with a.host.running(), b.host.running("127.0.0.1"):
        addr = b.host.listen_addrs[0]
        assert addr.peer_id == b.identity.peer_id
        assert str(addr).split("/p2p/")[1].startswith("12D3KooW")
        results = await asyncio.gather(
            *(call(a.host, addr, encode_frame(b"%d" % i)) for i in range(50))
        )
        assert sorted(results) == sorted(a.key.relay_id().encode() + b":%d" % i for i in range(50))
        (peer,) = a.host.peers
        assert peer.relay_id == b.key.relay_id()
        assert len(a.host.peers) == 1  # one connection, many streams
        big = b"x" * (FRAME_LIMIT - 64)
        assert await call(a.host, addr, encode_frame(big)) == a.key.relay_id().encode() + b":" + big


def _bad_signature(body: dict[str, Any]) -> None:
    sig = bytearray(32) + bytearray(b"\x01" * 32)
    body["relay_signature"] = b64u_encode(bytes(sig))


def _other_peer(body: dict[str, Any]) -> None:
    other = PeerIdentity.from_relay_key(AccountKey.generate())
    addr = TcpAddr.parse(body["endpoints"][1]).with_peer(other.peer_id)
    body["endpoints"][1] = str(addr)
    body.pop("relay_signature")


@pytest.mark.parametrize("fault", ["bad_signature", "other_peer_id", "unregistered"])
async def test_a_peer_that_does_not_prove_its_relay_is_never_believed(
    tmp_path: Path, fault: str
) -> None:
    a, b = nodes(tmp_path, 2, registered=1 if fault == "unregistered" else None)
    b.host.set_handler("/test/echo", echo)
    if fault == "bad_signature":
        b.tamper = _bad_signature
    elif fault == "other_peer_id":

        def resign(body: dict[str, Any]) -> None:
            _other_peer(body)
            body["relay_signature"] = b.key.sign_object(body, CTX, exclude=())

        b.tamper = resign
    async with a.host.running(), b.host.running("127.0.0.1"):
        with pytest.raises(PeerRejected):
            await call(a.host, b.host.listen_addrs[0], encode_frame(b"hi"))
        assert a.host.peers == [] and b.host.peers == []


async def test_dialing_a_peer_id_the_handshake_does_not_prove_fails(tmp_path: Path) -> None:
    a, b = nodes(tmp_path, 2)
    async with a.host.running(), b.host.running("127.0.0.1"):
        wrong = b.host.listen_addrs[0].with_peer(a.identity.peer_id)
        with pytest.raises(PeerRejected):
            await a.host.connect(wrong)
        assert a.host.peers == []


@pytest.mark.parametrize(
    "raw",
    [
        encode_uvarint(FRAME_LIMIT + 1) + b"{}",  # over the receive limit
        b"\x80" * 10,  # a varint longer than allowed
        b"\x81\x00",  # a non-minimal varint
        encode_frame(b"\xff\xfe{}"),  # not UTF-8
        encode_uvarint(100) + b"short",  # the stream ends inside the frame
    ],
    ids=["oversize", "long-varint", "non-minimal", "not-utf8", "truncated"],
)
async def test_framing_violations_reset_the_stream(tmp_path: Path, raw: bytes) -> None:
    a, b = nodes(tmp_path, 2)
    b.host.set_handler("/test/echo", echo)
    async with a.host.running(), b.host.running("127.0.0.1"):
        with pytest.raises(StreamReset):
            await call(a.host, b.host.listen_addrs[0], raw)
        # The connection survives a bad stream: the next request is answered.
        assert await call(a.host, b.host.listen_addrs[0], encode_frame(b"ok")) == (
            a.key.relay_id().encode() + b":ok"
        )


def test_multiaddrs_round_trip_and_refuse_what_they_cannot_dial() -> None:
    peer = PeerIdentity.from_relay_key(AccountKey.generate()).peer_id
    for text in ("/ip4/127.0.0.1/tcp/4201", "/ip6/::1/tcp/1", "/dns4/relay.example/tcp/443"):
        addr = TcpAddr.parse(text).with_peer(peer)
        assert TcpAddr.from_bytes(addr.to_bytes()) == addr == TcpAddr.parse(str(addr))
    for bad in ("/ip4/127.0.0.1/udp/1", "/ip4/300.0.0.1/tcp/1", "/ip4/1.2.3.4/tcp/01", "ip4/x"):
        with pytest.raises(BadRequest):
            TcpAddr.parse(bad)


def test_the_peer_id_is_bound_to_the_relay_key() -> None:
    key = AccountKey.generate()
    assert (
        PeerIdentity.from_relay_key(key).peer_id
        == PeerIdentity.from_relay_key(AccountKey.from_private_bytes(key.private_bytes())).peer_id
    )
    assert (
        PeerIdentity.from_relay_key(key).peer_id
        != PeerIdentity.from_relay_key(AccountKey.generate()).peer_id
    )


def test_kad_messages_and_peer_ids_match_the_dht_keyspace_vectors() -> None:
    from gapline.meshline import peer_id_bytes
    from gapline.relay._p2p._frames import encode_frame as frame
    from gapline.relay._p2p._identity import _public_key_proto, peer_id_of_public_key
    from gapline.relay._p2p._kad import FIND_NODE, KadMessage
    from tests.meshline.test_vectors_dht import V

    for case in V["keyspace"]["cases"]:
        key = bytes.fromhex(case["key_hex"])
        expected = case["expected"]
        message = KadMessage(FIND_NODE, key)
        assert message.encode().hex() == expected["find_node_request_hex"]
        assert frame(message.encode()).hex() == expected["framed_request_hex"]
        assert KadMessage.decode(bytes.fromhex(expected["find_node_request_hex"])) == message
    for peer in V["keyspace"]["peers"]:
        raw = bytes.fromhex(peer["bytes_hex"])
        assert peer_id_bytes(peer["peer_id"]) == raw
        if raw[0] == 0:  # an identity multihash: the Ed25519 key is inside
            assert raw[2:4] == b"\x08\x01"
            assert peer_id_of_public_key(_public_key_proto(raw[6:])) == raw


def test_a_tampered_noise_message_fails_and_the_handshake_binds_both_keys() -> None:
    from gapline.relay._p2p._noise import HandshakeState, NoiseError, StaticKey

    a, b = StaticKey.generate(), StaticKey.generate()
    ini, res = HandshakeState(initiator=True, static=a), HandshakeState(initiator=False, static=b)
    res.read_message(ini.write_message(b""))
    assert ini.read_message(res.write_message(b"two")) == b"two"
    assert res.read_message(ini.write_message(b"three")) == b"three"
    assert ini.remote_static == b.public and res.remote_static == a.public
    (i_send, i_recv), (r_send, r_recv) = ini.split(), res.split()
    assert r_recv.decrypt(b"", i_send.encrypt(b"", b"hello")) == b"hello"
    assert i_recv.decrypt(b"", r_send.encrypt(b"", b"back")) == b"back"
    tampered = bytearray(i_send.encrypt(b"", b"again"))
    tampered[0] ^= 1
    with pytest.raises(NoiseError):
        r_recv.decrypt(b"", bytes(tampered))
    # A third party's handshake message does not decrypt in this one.
    c = HandshakeState(initiator=True, static=StaticKey.generate())
    other = HandshakeState(initiator=False, static=StaticKey.generate())
    other.read_message(c.write_message(b""))
    fresh = HandshakeState(initiator=True, static=a)
    fresh.write_message(b"")
    with pytest.raises(NoiseError):
        fresh.read_message(other.write_message(b"x"))


async def test_a_yamux_peer_that_overruns_the_window_loses_the_connection(tmp_path: Path) -> None:
    from gapline.relay._p2p import _yamux

    a, b = nodes(tmp_path, 2)

    async def swallow(stream: YamuxStream, incoming: Buffered, peer: VerifiedPeer) -> None:
        await asyncio.sleep(0.5)  # reads nothing: the window never re-opens

    b.host.set_handler("/test/slow", swallow)
    async with a.host.running(), b.host.running("127.0.0.1"):
        conn = await a.host.connect(b.host.listen_addrs[0])
        stream, _ = await conn.open("/test/slow", b"")
        # Ignore the window: push one frame past what B granted.
        over = _yamux.INITIAL_WINDOW + 1
        conn.session._send(_yamux._frame(_yamux._DATA, 0, stream.id, over, b"x" * over))
        await asyncio.wait_for(conn.session.ended.wait(), 5)
        assert b.host.peers == []


class _RecordingTcp:
    """The raw side of a NoiseChannel, recording each transport write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.writer = self
        self.closed = False

    def is_closing(self) -> bool:
        return self.closed

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    async def drain(self) -> None:
        pass

    async def read(self) -> bytes:
        return b""

    def close(self) -> None:
        self.closed = True


def _messages(raw: bytes, recv: Any) -> list[bytes]:
    out = []
    while raw:
        length = int.from_bytes(raw[:2], "big")
        assert length <= 65535
        out.append(recv.decrypt(b"", raw[2 : 2 + length]))
        raw = raw[2 + length :]
    return out


async def test_frames_written_in_one_turn_leave_in_one_noise_message() -> None:
    from gapline.relay._p2p._channel import NoiseChannel
    from gapline.relay._p2p._noise import CipherState

    key = bytes(range(32))
    tcp = _RecordingTcp()
    channel = NoiseChannel(
        cast(TcpChannel, tcp), Buffered(tcp.read), CipherState(key), CipherState(key)
    )
    recv = CipherState(key)
    frames = [bytes([i]) * (10 + i) for i in range(40)]
    for frame in frames:
        channel.write(frame)
    assert tcp.writes == []  # nothing goes out before the loop turns
    await asyncio.sleep(0)
    assert len(tcp.writes) == 1 and _messages(tcp.writes[0], recv) == [b"".join(frames)]
    # Over one message's size: split into messages, in order, still one transport write.
    big = bytes(range(256)) * 600
    channel.write(big[:100])
    channel.write(big[100:])
    await channel.drain()  # a full message waits: flushed at once
    assert len(tcp.writes) == 2
    pieces = _messages(tcp.writes[1], recv)
    assert len(pieces) == 3 and b"".join(pieces) == big
    # Close sends what is still waiting.
    channel.write(b"last")
    channel.close()
    assert _messages(tcp.writes[2], recv) == [b"last"] and tcp.closed
