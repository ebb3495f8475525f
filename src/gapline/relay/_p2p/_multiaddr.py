"""The libp2p TCP multiaddrs relays dial: ``/ip4|ip6|dns|dns4|dns6/<host>/tcp/<port>/p2p/<id>``.

Text for descriptors and command lines, binary for the DHT's ``Peer.addrs``. Anything
else is refused rather than guessed at: a descriptor with a malformed libp2p address is
invalid as a whole.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from gapline.meshline import BadRequest, b58decode, b58encode, decode_uvarint, encode_uvarint

__all__ = ["TcpAddr"]

_CODES = {"ip4": 4, "tcp": 6, "ip6": 41, "dns": 53, "dns4": 54, "dns6": 55, "p2p": 421}
_NAMES = {v: k for k, v in _CODES.items()}
_HOSTS = ("ip4", "ip6", "dns", "dns4", "dns6")


@dataclass(frozen=True, slots=True)
class TcpAddr:
    host_kind: str
    host: str
    port: int
    peer_id: bytes | None = None

    @classmethod
    def parse(cls, text: str) -> TcpAddr:
        try:
            return cls._parse(text)
        except ValueError as exc:  # ipaddress's refusals
            raise BadRequest(f"not a libp2p TCP multiaddr: {text!r}") from exc

    @classmethod
    def _parse(cls, text: str) -> TcpAddr:
        parts = text.split("/")
        if parts[0] != "" or len(parts) not in (5, 7):
            raise BadRequest(f"not a libp2p TCP multiaddr: {text!r}")
        kind, host, tcp, port = parts[1:5]
        if kind not in _HOSTS or tcp != "tcp" or not port.isdigit() or str(int(port)) != port:
            raise BadRequest(f"not a libp2p TCP multiaddr: {text!r}")
        if kind == "ip4":
            ipaddress.IPv4Address(host)
        elif kind == "ip6":
            ipaddress.IPv6Address(host)
        elif not host or len(host) > 253:
            raise BadRequest("bad DNS name in multiaddr")
        if not 0 < int(port) < 65536:
            raise BadRequest("multiaddr port out of range")
        peer: bytes | None = None
        if len(parts) == 7:
            if parts[5] != "p2p" or not parts[6]:
                raise BadRequest(f"not a libp2p TCP multiaddr: {text!r}")
            peer = b58decode(parts[6])
            _check_multihash(peer)
        return cls(kind, host, int(port), peer)

    def with_peer(self, peer_id: bytes) -> TcpAddr:
        return TcpAddr(self.host_kind, self.host, self.port, peer_id)

    def __str__(self) -> str:
        text = f"/{self.host_kind}/{self.host}/tcp/{self.port}"
        return text if self.peer_id is None else f"{text}/p2p/{b58encode(self.peer_id)}"

    def to_bytes(self) -> bytes:
        out = encode_uvarint(_CODES[self.host_kind])
        if self.host_kind == "ip4":
            out += ipaddress.IPv4Address(self.host).packed
        elif self.host_kind == "ip6":
            out += ipaddress.IPv6Address(self.host).packed
        else:
            name = self.host.encode()
            out += encode_uvarint(len(name)) + name
        out += encode_uvarint(_CODES["tcp"]) + self.port.to_bytes(2, "big")
        if self.peer_id is not None:
            out += encode_uvarint(_CODES["p2p"]) + encode_uvarint(len(self.peer_id))
            out += self.peer_id
        return out

    @classmethod
    def from_bytes(cls, data: bytes) -> TcpAddr:
        at, parts = 0, []
        while at < len(data):
            code, used = decode_uvarint(data[at:])
            at += used
            name = _NAMES.get(code)
            if name == "ip4":
                value, at = str(ipaddress.IPv4Address(data[at : at + 4])), at + 4
            elif name == "ip6":
                value, at = str(ipaddress.IPv6Address(data[at : at + 16])), at + 16
            elif name == "tcp":
                value, at = str(int.from_bytes(data[at : at + 2], "big")), at + 2
            elif name in ("dns", "dns4", "dns6", "p2p"):
                length, used = decode_uvarint(data[at:])
                at += used
                raw = data[at : at + length]
                at += length
                value = b58encode(raw) if name == "p2p" else raw.decode()
            else:
                raise BadRequest("unsupported multiaddr protocol")
            if at > len(data):
                raise BadRequest("truncated multiaddr")
            parts += [name, value]
        return cls.parse("/" + "/".join(parts))


def _check_multihash(peer: bytes) -> None:
    if len(peer) < 2 or peer[0] not in (0x00, 0x12) or peer[1] != len(peer) - 2:
        raise BadRequest("peer ID is not an identity or sha2-256 multihash")
