"""The relay DHT's routing table: k-buckets by XOR distance of keyspace positions, the
least recently seen peer probed when a bucket is full, and evicted only if it does not
answer (then the waiting newcomer takes its place)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from gapline.meshline import keyspace_position, xor_distance
from gapline.relay._metrics import RelayMetrics
from gapline.relay._p2p._multiaddr import TcpAddr
from gapline.relay._p2p._routing import Added, RoutingTable
from gapline.relay._route_federation import FederatedRouteDht
from tests.relay.test_p2p import Node, nodes


def _peer_id() -> bytes:
    """An identity-multihash Peer ID (the form relay Peer IDs take), random."""
    key = b"\x08\x01\x12\x20" + os.urandom(32)
    return b"\x00" + bytes([len(key)]) + key


def _in_bucket(own: bytes, table: RoutingTable, index: int, count: int) -> list[bytes]:
    out: list[bytes] = []
    while len(out) < count:
        candidate = _peer_id()
        if table.bucket_of(candidate) == index:
            out.append(candidate)
    return out


def test_bucket_index_is_the_shared_prefix_of_keyspace_positions() -> None:
    own = _peer_id()
    table = RoutingTable(own)
    mine = int.from_bytes(keyspace_position(own))
    for _ in range(200):
        peer = _peer_id()
        theirs = int.from_bytes(keyspace_position(peer))
        shared = 256 - (mine ^ theirs).bit_length()
        assert table.bucket_of(peer) == shared
        # The keyspace position is SHA-256 of the Peer ID bytes.
        assert keyspace_position(peer) == hashlib.sha256(peer).digest()
    with pytest.raises(ValueError):
        table.bucket_of(own)
    assert own not in table


def test_a_full_bucket_names_its_least_recently_seen_peer_and_keeps_the_newcomer_waiting() -> None:
    own = _peer_id()
    table = RoutingTable(own, k=3)
    first, second, third, fourth, fifth = _in_bucket(own, table, 0, 5)
    for peer in (first, second, third):
        assert table.add(peer) == Added(True)
    assert table.bucket(0) == [first, second, third]
    # Seen again: it becomes the most recently seen.
    assert table.add(first) == Added(True)
    assert table.bucket(0) == [second, third, first]
    # Full: the newcomer waits, and the least recently seen is to be probed.
    assert table.add(fourth) == Added(False, second)
    assert fourth not in table
    # The probe answered: it stays (now most recently seen); the newcomer keeps waiting.
    table.seen(second)
    assert table.bucket(0) == [third, first, second]
    assert table.add(fifth) == Added(False, third)
    # The probe failed: the most recently seen replacement takes the place.
    assert table.remove(third) == fifth
    assert table.bucket(0) == [first, second, fifth]
    assert table.remove(first) == fourth
    assert table.remove(second) is None
    assert sorted(table) == sorted([fifth, fourth])
    assert len(table) == 2


def test_closest_orders_by_xor_distance_and_retain_drops_the_ineligible() -> None:
    own = _peer_id()
    table = RoutingTable(own)
    peers = [_peer_id() for _ in range(60)]
    for peer in peers:
        table.add(peer)
    key = os.urandom(32)
    stored = list(table)
    assert table.closest(key, 5) == sorted(stored, key=lambda p: xor_distance(key, p))[:5]
    keep = set(stored[:10])
    gone = table.retain(keep)
    assert set(gone) == set(stored[10:])
    assert set(table) == keep


def _dht(node: Node) -> FederatedRouteDht:
    # The probe is FIND_NODE, which never reads the replica: none is needed here.
    replica: Any = None
    dht = FederatedRouteDht(
        replica,
        node.host,
        RelayMetrics(),
        replicas=1,
        addrs_of=lambda peer: [TcpAddr.parse(a) for a in _endpoints(peer.descriptor)],
    )
    return dht


def _endpoints(descriptor: bytes) -> list[str]:
    return [e for e in json.loads(descriptor)["endpoints"] if e.startswith("/")]


async def test_an_unresponsive_peer_is_evicted_for_the_waiting_one(tmp_path: Path) -> None:
    """Three real relays' hosts: A's bucket holds one peer; B is in it, C waits. While B
    answers A's probe, B stays; once B is gone, C's next arrival evicts it."""
    while True:
        a, b, c = nodes(tmp_path, 3)
        dht_a, _dht_b, _dht_c = _dht(a), _dht(b), _dht(c)
        dht_a.table = RoutingTable(a.identity.peer_id, k=1)
        if dht_a.table.bucket_of(b.identity.peer_id) == dht_a.table.bucket_of(c.identity.peer_id):
            break
    async with (
        a.host.running("127.0.0.1"),
        c.host.running("127.0.0.1"),
        asyncio.TaskGroup() as tg,
    ):
        maintain = tg.create_task(dht_a.maintain())
        async with b.host.running("127.0.0.1"):
            await b.host.connect(a.host.listen_addrs[0])
            await _until(lambda: list(dht_a.table) == [b.identity.peer_id])
            conn_c = await c.host.connect(a.host.listen_addrs[0])
            # C waits; B answers the probe and stays.
            await _until(lambda: _probes(dht_a, "kept") == 1)
            assert list(dht_a.table) == [b.identity.peer_id]
        # B is gone. C arrives again (a new connection): B is probed, fails, is evicted.
        conn_c.session.close()
        await c.host.connect(a.host.listen_addrs[0])
        await _until(lambda: _probes(dht_a, "evicted") == 1)
        assert list(dht_a.table) == [c.identity.peer_id]
        assert _probes(dht_a, "kept") == 1
        maintain.cancel()


def _probes(dht: FederatedRouteDht, outcome: str) -> float:
    value = dht.metrics.registry.get_sample_value(
        "meshline_relay_dht_operations_total", {"operation": "probe", "outcome": outcome}
    )
    return value or 0.0


async def _until(condition: Any) -> None:
    async with asyncio.timeout(20):
        while not condition():  # noqa: ASYNC110 - state changed by other tasks, polled
            await asyncio.sleep(0.01)
