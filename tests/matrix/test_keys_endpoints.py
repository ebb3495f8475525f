"""The end-to-end encryption endpoints: builders, typed answers, the client's glue, sync fields."""

from __future__ import annotations

import json

import httpx
import pytest

from gapline.matrix import (
    KeysChangesResponse,
    KeysClaimResponse,
    KeysQueryResponse,
    KeysUploadResponse,
    MatrixClient,
    MatrixProtocolError,
    Session,
    SyncResponse,
    api,
    parse,
)

SESSION = Session("https://hs.example", "@me:example", "DEV", "secret-token")


def test_keys_upload_sends_only_what_it_is_given() -> None:
    req = api.keys_upload(one_time_keys={"signed_curve25519:AAAA": {"key": "k"}})
    assert (req.method, req.path) == ("POST", "/_matrix/client/v3/keys/upload")
    assert req.json == {"one_time_keys": {"signed_curve25519:AAAA": {"key": "k"}}}
    assert req.idempotent and req.authenticated
    full = api.keys_upload(device_keys={"user_id": "@a:x"}, one_time_keys={}, fallback_keys={})
    assert full.json == {
        "device_keys": {"user_id": "@a:x"},
        "one_time_keys": {},
        "fallback_keys": {},
    }


def test_keys_query_and_claim_bodies() -> None:
    query = api.keys_query({"@a:x": [], "@b:x": ("D1",)}, timeout_ms=10_000)
    assert query.path == "/_matrix/client/v3/keys/query"
    assert query.json == {"device_keys": {"@a:x": [], "@b:x": ["D1"]}, "timeout": 10_000}
    assert query.idempotent
    claim = api.keys_claim({"@b:x": {"D1": "signed_curve25519"}})
    assert claim.path == "/_matrix/client/v3/keys/claim"
    assert claim.json == {"one_time_keys": {"@b:x": {"D1": "signed_curve25519"}}}
    assert not claim.idempotent  # a retry would consume a second key on the other side


def test_send_to_device_path_quotes_type_and_txn() -> None:
    req = api.send_to_device("m.room.encrypted", {"@b:x": {"D/1": {"a": 1}}}, "txn/9")
    assert req.method == "PUT"
    assert req.path == "/_matrix/client/v3/sendToDevice/m.room.encrypted/txn%2F9"
    assert req.json == {"messages": {"@b:x": {"D/1": {"a": 1}}}}
    assert req.idempotent


def test_keys_changes_query() -> None:
    req = api.keys_changes("s1", "s2")
    assert req.path == "/_matrix/client/v3/keys/changes"
    assert req.query == (("from", "s1"), ("to", "s2"))


def test_sync_carries_the_encryption_fields() -> None:
    body = json.dumps(
        {
            "next_batch": "s2",
            "to_device": {
                "events": [
                    {
                        "sender": "@b:x",
                        "type": "m.room.encrypted",
                        "content": {"algorithm": "m.olm.v1.curve25519-aes-sha2"},
                    }
                ]
            },
            "device_lists": {"changed": ["@b:x"], "left": ["@c:x"]},
            "device_one_time_keys_count": {"signed_curve25519": 17},
            "device_unused_fallback_key_types": [],
        }
    ).encode()
    sync = parse(body, SyncResponse)
    (event,) = sync.to_device.events
    assert (event.sender, event.type) == ("@b:x", "m.room.encrypted")
    assert sync.device_lists.changed == ["@b:x"] and sync.device_lists.left == ["@c:x"]
    assert sync.device_one_time_keys_count == {"signed_curve25519": 17}
    assert sync.device_unused_fallback_key_types == []  # reported, and empty: the key was used


def test_sync_without_encryption_fields_has_empty_defaults() -> None:
    sync = parse(b'{"next_batch":"s1"}', SyncResponse)
    assert sync.to_device.events == [] and sync.device_lists.changed == []
    assert sync.device_one_time_keys_count == {}
    assert sync.device_unused_fallback_key_types is None  # not reported is not "used"


def test_key_answers_keep_signed_objects_raw() -> None:
    device = {
        "user_id": "@b:x",
        "device_id": "D1",
        "algorithms": ["m.olm.v1.curve25519-aes-sha2"],
        "keys": {"curve25519:D1": "c", "ed25519:D1": "e"},
        "signatures": {"@b:x": {"ed25519:D1": "s"}},
        "a_field_from_the_future": {"x": 1},
    }
    answer = parse(
        json.dumps(
            {
                "device_keys": {"@b:x": {"D1": device}},
                "master_keys": {"@b:x": {"user_id": "@b:x", "usage": ["master"], "keys": {}}},
                "failures": {"other.example": {"errcode": "M_UNAVAILABLE"}},
            }
        ).encode(),
        KeysQueryResponse,
    )
    # Unknown fields survive: the signature covers them.
    assert answer.device_keys["@b:x"]["D1"] == device
    assert answer.master_keys["@b:x"]["usage"] == ["master"]
    assert answer.self_signing_keys == {} and "other.example" in answer.failures
    claim = parse(
        b'{"one_time_keys":{"@b:x":{"D1":{"signed_curve25519:AAAB":{"key":"k","signatures":{}}}}}}',
        KeysClaimResponse,
    )
    assert claim.one_time_keys["@b:x"]["D1"]["signed_curve25519:AAAB"]["key"] == "k"
    upload = parse(b'{"one_time_key_counts":{"signed_curve25519":50}}', KeysUploadResponse)
    assert upload.one_time_key_counts == {"signed_curve25519": 50}
    changes = parse(b'{"changed":["@b:x"],"left":[]}', KeysChangesResponse)
    assert changes.changed == ["@b:x"]


@pytest.mark.parametrize(
    ("body", "shape"),
    [
        (b'{"device_keys":{"@b:x":["D1"]}}', KeysQueryResponse),
        (b'{"one_time_keys":{"@b:x":{"D1":"key"}}}', KeysClaimResponse),
        (b'{"one_time_key_counts":{"signed_curve25519":"many"}}', KeysUploadResponse),
        (b'{"next_batch":"s","to_device":{"events":[{"type":"x","content":{}}]}}', SyncResponse),
        (b'{"next_batch":"s","device_lists":{"changed":"@b:x"}}', SyncResponse),
    ],
)
def test_malformed_key_answers_are_protocol_errors(body: bytes, shape: type) -> None:
    with pytest.raises(MatrixProtocolError):
        parse(body, shape)


async def test_client_methods_send_the_builders_requests() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        path = request.url.path
        if path.endswith("/keys/upload"):
            return httpx.Response(200, json={"one_time_key_counts": {"signed_curve25519": 3}})
        if path.endswith("/keys/query"):
            return httpx.Response(200, json={"device_keys": {"@b:x": {}}})
        if path.endswith("/keys/claim"):
            return httpx.Response(200, json={"one_time_keys": {}})
        if path.endswith("/keys/changes"):
            return httpx.Response(200, json={"changed": ["@b:x"], "left": []})
        return httpx.Response(200, json={})

    async with MatrixClient(
        "https://hs.example", session=SESSION, transport=httpx.MockTransport(handler)
    ) as client:
        upload = await client.keys_upload(one_time_keys={"signed_curve25519:A": {"key": "k"}})
        query = await client.keys_query({"@b:x": []})
        claim = await client.keys_claim({"@b:x": {"D1": "signed_curve25519"}})
        changes = await client.keys_changes("s1", "s2")
        await client.send_to_device("m.dummy", {"@b:x": {"D1": {}}}, "t1")
    assert upload.one_time_key_counts == {"signed_curve25519": 3}
    assert query.device_keys == {"@b:x": {}} and claim.one_time_keys == {}
    assert changes.changed == ["@b:x"]
    assert [(r.method, r.url.path) for r in seen] == [
        ("POST", "/_matrix/client/v3/keys/upload"),
        ("POST", "/_matrix/client/v3/keys/query"),
        ("POST", "/_matrix/client/v3/keys/claim"),
        ("GET", "/_matrix/client/v3/keys/changes"),
        ("PUT", "/_matrix/client/v3/sendToDevice/m.dummy/t1"),
    ]
    assert json.loads(seen[-1].content) == {"messages": {"@b:x": {"D1": {}}}}
    assert all(r.headers["authorization"] == "Bearer secret-token" for r in seen)
