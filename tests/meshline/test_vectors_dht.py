"""dht-keyspace-v1.json: the account-route resource key, keyspace positions, FIND_NODE frames.

The file is pinned by ``dht-keyspace-v1.source.json`` (where it was copied from and
its SHA-256) because manifest.json does not list it.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from typing import Any

import pytest

from gapline.meshline import (
    BadRequest,
    NetworkContext,
    b64u_encode,
    find_node_request,
    frame_message,
    keyspace_position,
    network_bound_bytes,
    peer_id_bytes,
    route_dht_key,
    xor_distance,
)
from tests.meshline.vectors import VECTOR_DIR, pointer


@cache
def vectors() -> Any:
    raw = (VECTOR_DIR / "dht-keyspace-v1.json").read_bytes()
    source = json.loads((VECTOR_DIR / "dht-keyspace-v1.source.json").read_text())
    assert hashlib.sha256(raw).hexdigest() == source["sha256"], "dht vectors differ from source"
    return json.loads(raw)


V = vectors()
CTX = NetworkContext(V["network_context"])
PEERS = {p["id"]: p for p in V["keyspace"]["peers"]}


def test_resource_key_derivation() -> None:
    vec = V["resource_key"]
    expected = vec["expected"]
    data = network_bound_bytes(vec["input"], CTX)
    assert data.decode() == expected["canonical_json"]
    assert data.hex() == expected["utf8_hex"]
    assert hashlib.sha256(data).hexdigest() == expected["sha256_hex"]
    key = route_dht_key(vec["input"]["resource_id"], CTX)
    assert key.hex() == expected["expected_key_hex"]
    assert b64u_encode(key) == expected["expected_key_base64url"] == expected["sha256_base64url"]


def test_the_key_depends_on_the_network() -> None:
    account = V["resource_key"]["input"]["resource_id"]
    other = NetworkContext("neo:860833102:0x" + "1" * 40)
    assert route_dht_key(account, CTX) != route_dht_key(account, other)


@pytest.mark.parametrize("peer", V["keyspace"]["peers"], ids=lambda p: p["id"])
def test_peer_ids(peer: dict[str, Any]) -> None:
    raw = peer_id_bytes(peer["peer_id"])
    assert raw.hex() == peer["bytes_hex"] and len(raw) == peer["byte_length"]
    assert keyspace_position(raw).hex() == peer["keyspace_hex"]


def test_peer_ids_in_other_bases_are_not_read_here() -> None:
    with pytest.raises(BadRequest):
        peer_id_bytes("bafzbeie5745rpv2m6tjyuugywy4d5ewrqgqqhfnf445he3omzpjbx5xqxe")


def key_of(case: dict[str, Any]) -> bytes:
    source = case["key_source"]
    if "peer" in source:
        value = PEERS[source["peer"]]["bytes_hex"]
    else:
        value = pointer(V, source["value_ref"])
    assert value == case["key_hex"]
    return bytes.fromhex(value)


@pytest.mark.parametrize("case", V["keyspace"]["cases"], ids=lambda c: c["id"])
def test_keyspace_and_find_node(case: dict[str, Any]) -> None:
    key = key_of(case)
    expected = case["expected"]
    assert len(key) == expected["key_byte_length"]
    assert keyspace_position(key).hex() == expected["target_position_hex"]
    request = find_node_request(key)
    assert request.hex() == expected["find_node_request_hex"]
    assert frame_message(request).hex() == expected["framed_request_hex"]
    assert expected["response_key_hex"] == key.hex()  # a response echoes the raw key
    for distance in expected["distances"]:
        peer = bytes.fromhex(PEERS[distance["peer"]]["bytes_hex"])
        assert xor_distance(key, peer).hex() == distance["xor_hex"]
