"""The relay DHT's account-route resource: keys, records, keyspace, and the PUT/GET seam.

An account route lives under the raw 32 bytes of SHA-256 of the network-bound
``{"$type": "meshline.dht.resource.account.route", "resource_id": <account>}``, so
one account has different keys in different networks. The record value is the
route's UTF-8 JSON; a receiver re-derives the key from the parsed route's
``account`` and refuses a record filed under another key. Kademlia distance is the
XOR of keyspace positions, a position being SHA-256 of the wire key (a resource
key is hashed once more, like a peer ID's bytes).

``RouteDht`` is where federation plugs in: a standalone relay's route store is its
own replica of this keyspace, and ``resolve_records`` is what any querying node
runs over the values a GET collected.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from gapline.meshline._canonical import NetworkContext, network_bound_bytes, parse_json
from gapline.meshline._errors import BadRequest, MeshlineError
from gapline.meshline._ids import b58decode
from gapline.meshline._routes import (
    AccountRoute,
    RouteHistory,
    RouteResolution,
    select_route,
    verify_route,
)
from gapline.meshline._varint import encode_uvarint

__all__ = [
    "ROUTE_RESOURCE_TYPE",
    "RouteDht",
    "find_node_request",
    "frame_message",
    "keyspace_position",
    "peer_id_bytes",
    "resolve_records",
    "route_dht_key",
    "route_from_record",
    "route_record",
    "xor_distance",
]

ROUTE_RESOURCE_TYPE = "meshline.dht.resource.account.route"
_FIND_NODE = 4


def route_dht_key(account: str, context: NetworkContext) -> bytes:
    """The raw 32-byte DHT key of ``account``'s route in ``context``."""
    data = network_bound_bytes({"$type": ROUTE_RESOURCE_TYPE, "resource_id": account}, context)
    return hashlib.sha256(data).digest()


def route_record(route: AccountRoute, context: NetworkContext) -> tuple[bytes, bytes]:
    """``(Record.key, Record.value)`` for a final route."""
    if route.relay_signature is None:
        raise BadRequest("only final co-signed routes go into the DHT")
    return route_dht_key(route.account, context), route.to_json()


def route_from_record(key: bytes, value: bytes, context: NetworkContext) -> AccountRoute:
    """Parse a record value and check it was filed under its own account's key.

    Structure only; the caller still runs ``verify_route`` (``resolve_records`` does).
    """
    route = AccountRoute.from_wire(parse_json(value))
    if route_dht_key(route.account, context) != key:
        raise BadRequest("the record's key is not its route's account key")
    return route


class RouteDht(Protocol):
    """PUT a final route record to the replicas; GET every value stored under a key."""

    async def put(self, key: bytes, value: bytes) -> None: ...

    async def get(self, key: bytes) -> Sequence[bytes]: ...


def resolve_records(
    values: Iterable[bytes],
    *,
    key: bytes,
    history: RouteHistory,
    relay_key: Callable[[str], bytes | None],
    context: NetworkContext,
    now: int,
    max_skew: int,
) -> RouteResolution:
    """Validate what a GET returned and select the current route.

    ``relay_key(relay_id)`` gives the key of an active relay's verified descriptor, or
    None (unknown or inactive relay: its routes are not usable). Records that fail
    any rule are dropped without touching ``history``.
    """
    valid: list[AccountRoute] = []
    for value in values:
        try:
            route = route_from_record(key, value, context)
            public_key = relay_key(route.relay_id)
            if public_key is None:
                continue
            verify_route(route, context, relay_public_key=public_key, now=now, max_skew=max_skew)
        except MeshlineError:
            continue
        valid.append(route)
    return select_route(valid, history, context=context, now=now)


def keyspace_position(key: bytes) -> bytes:
    """Where a wire key (peer ID bytes or resource key) sits in the Kademlia keyspace."""
    return hashlib.sha256(key).digest()


def xor_distance(a: bytes, b: bytes) -> bytes:
    """Kademlia distance of two wire keys: XOR of their keyspace positions."""
    pa, pb = keyspace_position(a), keyspace_position(b)
    return bytes(x ^ y for x, y in zip(pa, pb, strict=True))


def peer_id_bytes(peer_id: str) -> bytes:
    """The multihash bytes of a peer ID in its legacy base58btc text (``Qm…``, ``12D3Koo…``)."""
    if not peer_id.startswith(("Qm", "1")):
        raise BadRequest("only base58btc peer IDs are read here")
    return b58decode(peer_id)


def _bytes_field(number: int, value: bytes) -> bytes:
    return bytes([number << 3 | 2]) + encode_uvarint(len(value)) + value


def find_node_request(key: bytes) -> bytes:
    """The protobuf ``Message{type: FIND_NODE, key}``."""
    return bytes([1 << 3, _FIND_NODE]) + _bytes_field(2, key)


def frame_message(message: bytes) -> bytes:
    """A DHT stream frame: unsigned-varint length, then the protobuf bytes."""
    return encode_uvarint(len(message)) + message
