"""``/meshline/kad/1.0.0`` messages: the libp2p Kademlia protobuf subset, sans-I/O.

``Message{type=1, key=2, record=3{key=1, value=2}, closerPeers=8{id=1, addrs=2}}``. A
decoded message whose ``record.key`` differs from ``key`` is refused here, as any
receiver must; what the record's value means is the caller's (account-route rules).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gapline.relay._p2p._protobuf import (
    ProtoError,
    as_bytes,
    as_int,
    bytes_field,
    fields,
    varint_field,
)

__all__ = ["FIND_NODE", "GET_VALUE", "KAD_PROTOCOL", "PUT_VALUE", "KadMessage", "KadPeer"]

KAD_PROTOCOL = "/meshline/kad/1.0.0"
PUT_VALUE, GET_VALUE, FIND_NODE = 0, 1, 4
_KNOWN = {PUT_VALUE, GET_VALUE, 2, 3, FIND_NODE, 5}


@dataclass(frozen=True, slots=True)
class KadPeer:
    id: bytes
    addrs: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class KadMessage:
    type: int
    key: bytes
    record: tuple[bytes, bytes] | None = None  # (record.key, record.value)
    closer: tuple[KadPeer, ...] = field(default=())

    def encode(self) -> bytes:
        out = varint_field(1, self.type) + bytes_field(2, self.key)
        if self.record is not None:
            out += bytes_field(3, bytes_field(1, self.record[0]) + bytes_field(2, self.record[1]))
        for peer in self.closer:
            body = bytes_field(1, peer.id) + b"".join(bytes_field(2, a) for a in peer.addrs)
            out += bytes_field(8, body)
        return out

    @classmethod
    def decode(cls, data: bytes) -> KadMessage:
        kind: int | None = None
        key = b""
        record_raw: bytes | None = None
        closer: list[KadPeer] = []
        for number, _, value in fields(data):
            if number == 1:
                kind = as_int(value)
            elif number == 2:
                key = as_bytes(value)
            elif number == 3:
                record_raw = (record_raw or b"") + as_bytes(value)  # embedded messages merge
            elif number == 8:
                closer.append(_peer(as_bytes(value)))
        if kind is None or kind not in _KNOWN:
            raise ProtoError("unknown or missing message type")
        record = None
        if record_raw is not None:
            rkey, rvalue = b"", b""
            for number, _, value in fields(record_raw):
                if number == 1:
                    rkey = as_bytes(value)
                elif number == 2:
                    rvalue = as_bytes(value)
            if rkey != key:
                raise ProtoError("record.key differs from Message.key")
            record = (rkey, rvalue)
        return cls(kind, key, record, tuple(closer))


def _peer(data: bytes) -> KadPeer:
    peer_id, addrs = b"", []
    for number, _, value in fields(data):
        if number == 1:
            peer_id = as_bytes(value)
        elif number == 2:
            addrs.append(as_bytes(value))
    return KadPeer(peer_id, tuple(addrs))
