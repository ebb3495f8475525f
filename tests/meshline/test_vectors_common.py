"""common-v1.json: canonical JSON, base64url, network binding, type binding, X25519, payloads."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest

from gapline.meshline import (
    AccountDeviceState,
    BadRequest,
    DecryptionFailed,
    EncryptedPayload,
    MessageEnvelope,
    NetworkContext,
    WireContextForbidden,
    b64u_decode,
    b64u_encode,
    canonical_json,
    decrypt_payload,
    device_verify,
    envelope_signing_input,
    network_bound_bytes,
    network_bound_hash,
    parse_json,
    verify_device_state,
    verify_envelope,
    x25519_shared_secret,
)
from gapline.meshline._canonical import local_input_bytes
from gapline.meshline._content import UnsupportedType, select_type
from gapline.meshline._ids import decode_prefixed
from gapline.meshline._keybox import _ephemeral_shared_secret
from tests.meshline.vectors import load, pointer

V = load("common-v1.json")
CTX = NetworkContext(V["network_context"])


def ids(cases: list[dict[str, Any]], key: str = "name") -> list[str]:
    return [c[key] for c in cases]


@pytest.mark.parametrize(
    "case", V["canonical_json"]["vectors"], ids=ids(V["canonical_json"]["vectors"], "id")
)
def test_canonical_json(case: dict[str, Any]) -> None:
    raw = bytes.fromhex(case["input_utf8_hex"])
    assert raw == case["input_json"].encode()
    value = parse_json(raw)
    expected = case["expected"]
    if case["operation"] == "canonical_json":
        out = canonical_json(value)
    else:
        out = network_bound_bytes(value, CTX)
        assert network_bound_hash(value, CTX) == expected["network_bound_json_hash"]
    assert out.hex() == expected["utf8_hex"]
    assert out.decode() == expected["canonical_json"]
    assert base64.b64encode(out).decode() == expected["utf8_base64"]
    assert hashlib.sha256(out).hexdigest() == expected["sha256_hex"]
    assert b64u_encode(hashlib.sha256(out).digest()) == expected["sha256_base64url"]


@pytest.mark.parametrize(
    "case",
    V["canonical_json"]["rejection_vectors"],
    ids=ids(V["canonical_json"]["rejection_vectors"], "id"),
)
def test_canonical_json_rejections(case: dict[str, Any]) -> None:
    assert case["expected"] == "reject"
    with pytest.raises(BadRequest):
        canonical_json(parse_json(case["input_json"].encode()))


@pytest.mark.parametrize("case", V["base64url"]["cases"], ids=ids(V["base64url"]["cases"], "id"))
def test_base64url(case: dict[str, Any]) -> None:
    def decode() -> bytes:
        if "prefix" in case:
            return decode_prefixed(case["input"], case["prefix"], case["decoded_length"])
        return b64u_decode(case["input"])

    if case["expected_accepted"]:
        data = decode()
        assert data.hex() == case["decoded_hex"]
        if "decoded_length" in case:
            assert len(data) == case["decoded_length"]
        assert case["input"].endswith(b64u_encode(data))
    else:
        with pytest.raises(BadRequest):
            decode()


# --- object_types ---------------------------------------------------------------------------

OT = V["object_types"]


@pytest.mark.parametrize("case", OT["content_type_cases"], ids=ids(OT["content_type_cases"]))
def test_content_type_selection(case: dict[str, Any]) -> None:
    obj = json.loads(case["input_json"])
    supported = OT["supported_content_types"]
    if case["expected"] in ("unsupported_type", "invalid_type"):
        with pytest.raises(UnsupportedType) as info:
            select_type(obj, supported)
        assert info.value.reason == case["expected"]
    else:
        assert select_type(obj, supported) == case["expected"]
        for key, value in case.get("expected_preserved_fields", {}).items():
            assert obj[key] == value


SE = OT["signed_envelope"]


@pytest.mark.parametrize("case", SE["cases"], ids=ids(SE["cases"]))
def test_signed_envelope_type_binding(case: dict[str, Any]) -> None:
    wire = copy.deepcopy(SE["envelope"])
    if "type_override" in case:
        wire["$type"] = case["type_override"]
    if case.get("remove_type"):
        del wire["$type"]
    signature = b64u_decode(wire["device_signature"])
    data = network_bound_bytes(wire, CTX, exclude=("device_signature",))
    valid = device_verify(b64u_decode(SE["public_key"]), data, signature)
    assert valid is case["expected_signature_valid"]
    if case["expected_signature_valid"]:
        verify_envelope(MessageEnvelope.from_wire(wire), b64u_decode(SE["public_key"]), CTX)
    else:
        with pytest.raises(BadRequest):  # the typed parser refuses any other $type
            MessageEnvelope.from_wire(wire)


MA = OT["message_authentication"]


@pytest.mark.parametrize("case", MA["cases"], ids=ids(MA["cases"]))
def test_message_authentication_type_binding(case: dict[str, Any]) -> None:
    envelope = MessageEnvelope.from_wire(pointer(V, MA["envelope_ref"]))
    aad_obj: dict[str, Any] = {
        "$type": "meshline.message.aad",
        "message_id": envelope.message_id,
        "created_at": envelope.created_at,
        "from": envelope.from_,
        "from_device_id": envelope.from_device_id,
        "to": envelope.to,
    }
    if "aad_type_override" in case:
        aad_obj["$type"] = case["aad_type_override"]
    if case.get("remove_aad_type"):
        del aad_obj["$type"]
    key = b64u_decode(MA["content_key"])
    aad = network_bound_bytes(aad_obj, CTX)
    if case["expected_authenticated"]:
        plain = decrypt_payload(envelope.payload, key, aad)
        assert plain.hex() == MA["plaintext_utf8_hex"]
    else:
        with pytest.raises(DecryptionFailed):
            decrypt_payload(envelope.payload, key, aad)


# --- network_binding ------------------------------------------------------------------------

NB = V["network_binding"]


@pytest.mark.parametrize("case", NB["format_cases"], ids=ids(NB["format_cases"]))
def test_network_context_format(case: dict[str, Any]) -> None:
    if case["expected_accepted"]:
        assert NetworkContext(case["input"]) == case["input"]
    else:
        with pytest.raises(BadRequest):
            NetworkContext(case["input"])


@pytest.mark.parametrize("case", NB["binding_cases"], ids=ids(NB["binding_cases"]))
def test_network_binding(case: dict[str, Any]) -> None:
    obj = parse_json(case["input_json"].encode())
    expected = case["expected"]
    if case["operation"] == "device_signature":
        if expected == "forbidden_wire_context":
            with pytest.raises(WireContextForbidden):
                MessageEnvelope.from_wire(obj)
            with pytest.raises(WireContextForbidden):
                network_bound_bytes(obj, CTX, exclude=("device_signature",))
            return
        envelope = MessageEnvelope.from_wire(obj)
        data = envelope_signing_input(envelope, CTX)
        verify_envelope(envelope, b64u_decode(SE["public_key"]), CTX)
    elif case["operation"] == "account_signature":
        if expected == "forbidden_wire_context":
            for path in case["nested_protocol_object_paths"]:
                assert "$context" in pointer(obj, "/" + "/".join(map(str, path)))
            with pytest.raises(WireContextForbidden):
                AccountDeviceState.from_wire(obj)
            return
        state = AccountDeviceState.from_wire(obj)
        assert state.to_wire() == obj  # nested signatures preserved unchanged
        data = network_bound_bytes(obj, CTX, exclude=("account_signature",))
        verify_device_state(state, CTX)
    else:
        if expected == "context_mismatch":
            with pytest.raises(BadRequest):
                local_input_bytes(obj, CTX)
            return
        data = local_input_bytes(obj, CTX)
    assert expected == "accepted"
    assert data.decode() == case["canonical_json"]
    assert data.hex() == case["utf8_hex"]
    assert hashlib.sha256(data).hexdigest() == case["sha256_hex"]


SC = NB["signature_context"]


@pytest.mark.parametrize("case", SC["cases"], ids=ids(SC["cases"]))
def test_signature_context(case: dict[str, Any]) -> None:
    envelope = MessageEnvelope.from_wire(pointer(V, SC["envelope_ref"]))
    candidate = NetworkContext(case["candidate_network_context"])
    key = b64u_decode(SC["public_key"])
    data = envelope_signing_input(envelope, candidate)
    assert (
        device_verify(key, data, b64u_decode(envelope.device_signature))
        is case["expected_signature_valid"]
    )


# --- x25519 ----------------------------------------------------------------------------------


def _cryptography_exchange(private: bytes, peer: bytes) -> bytes:
    from cryptography.hazmat.primitives.asymmetric import x25519

    return x25519_shared_secret(x25519.X25519PrivateKey.from_private_bytes(private), peer)


# Opening exchanges with ``cryptography`` (x25519_shared_secret), sealing with libsodium
# (_ephemeral_shared_secret): both must accept and refuse exactly what the vectors say.
@pytest.mark.parametrize(
    "exchange",
    [_cryptography_exchange, _ephemeral_shared_secret],
    ids=["cryptography", "libsodium"],
)
@pytest.mark.parametrize("case", V["x25519"]["cases"], ids=ids(V["x25519"]["cases"]))
def test_x25519(case: dict[str, Any], exchange: Callable[[bytes, bytes], bytes]) -> None:
    private = b64u_decode(case["private_key"])
    peer = b64u_decode(case["peer_public_key"])
    if case["expected_accepted"]:
        assert exchange(private, peer) == b64u_decode(case["expected_raw_shared_secret"])
    else:
        assert b64u_decode(case["expected_raw_shared_secret"]) == bytes(32)
        with pytest.raises(DecryptionFailed):
            exchange(private, peer)


# --- encrypted_payload ----------------------------------------------------------------------

EP = V["encrypted_payload"]


@pytest.mark.parametrize("case", EP["cases"], ids=ids(EP["cases"]))
def test_encrypted_payload_structure(case: dict[str, Any]) -> None:
    holder: dict[str, Any] = {"payload": copy.deepcopy(EP["input"])}
    path = ["payload", *case.get("path", [])]
    parent = holder
    for part in path[:-1]:
        parent = parent[part]
    if case.get("remove"):
        del parent[path[-1]]
    elif "value" in case:
        parent[path[-1]] = case["value"]
    if case["expected_valid"]:
        payload = EncryptedPayload.from_wire(holder["payload"])
        assert payload.to_wire() == holder["payload"]
    else:
        with pytest.raises(BadRequest):
            EncryptedPayload.from_wire(holder.get("payload"))


# --- unsigned_varint (length prefixes) --------------------------------------------------------

UV = V["unsigned_varint"]
PREFIXES = {c["id"]: c for c in UV["prefix_cases"]}


@pytest.mark.parametrize("case", UV["prefix_cases"], ids=ids(UV["prefix_cases"], "id"))
def test_unsigned_varint_prefix(case: dict[str, Any]) -> None:
    from gapline.meshline._varint import decode_uvarint, encode_uvarint

    data = bytes.fromhex(case["input_hex"])
    if case["expected_accepted"]:
        value, used = decode_uvarint(data)
        assert (value, used) == (int(case["decoded_value_decimal"]), len(data))
        assert encode_uvarint(value) == data
    else:
        with pytest.raises(BadRequest):
            value, used = decode_uvarint(data)
            assert used == len(data), "trailing bytes after a complete prefix"


@pytest.mark.parametrize("case", UV["length_limit_cases"], ids=ids(UV["length_limit_cases"], "id"))
def test_unsigned_varint_length_limit(case: dict[str, Any]) -> None:
    from gapline.meshline._varint import decode_uvarint

    value, _ = decode_uvarint(bytes.fromhex(PREFIXES[case["prefix_case"]]["input_hex"]))
    assert (value <= case["max_payload_bytes"]) is case["expected_within_limit"]
