"""identity-auth-v1.json: device IDs, certificates (RFC 6979 re-created), origins, session auth."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest

from gapline.meshline import (
    AccountKey,
    BadRequest,
    DeviceCertificate,
    DeviceKeys,
    InvalidSignature,
    NetworkContext,
    account_auth_input,
    b64u_decode,
    b64u_encode,
    derive_device_id,
    device_auth_input,
    issue_certificate,
    neo_account_id,
    network_bound_bytes,
    relay_origin,
    verify_account_auth,
    verify_certificate,
    verify_device_auth,
)
from tests.meshline.vectors import load, pointer

V = load("identity-auth-v1.json")
CTX = NetworkContext(V["network_context"])
DC = V["device_certificate"]


def account_key() -> AccountKey:
    return AccountKey.from_private_bytes(b64u_decode(DC["private_key"]))


def device_keys() -> DeviceKeys:
    from cryptography.hazmat.primitives.asymmetric import x25519

    # The vector gives only the signing key; the encryption key is unused for signing.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return DeviceKeys(
        Ed25519PrivateKey.from_private_bytes(b64u_decode(DC["device_private_key"])),
        x25519.X25519PrivateKey.generate(),
    )


def test_device_identity() -> None:
    di = V["device_identity"]
    data = network_bound_bytes(di["input"], CTX)
    assert data.decode() == di["canonical_json"]
    assert data.hex() == di["utf8_hex"]
    assert "sha256:" + b64u_encode(hashlib.sha256(data).digest()) == di["hash"]
    inp = di["input"]
    assert (
        derive_device_id(
            inp["account"], inp["signing_public_key"], inp["encryption_public_key"], CTX
        )
        == di["derived_device_id"]
    )


def test_account_key_and_address() -> None:
    key = account_key()
    assert DC["algorithm"] == "ECDSA-P256-SHA256-RFC6979"
    assert key.public_key_b64 == DC["public_key"]
    assert key.account_id(CTX) == DC["account"]
    assert neo_account_id(b64u_decode(DC["public_key"]), CTX) == DC["account"]
    assert device_keys().signing_public_key == b64u_decode(DC["device_public_key"])


def test_device_certificate_signatures_recreated_bit_for_bit() -> None:
    unsigned = {k: v for k, v in DC["unsigned_object"].items() if not k.endswith("_signature")}
    device_input = network_bound_bytes(unsigned, CTX)
    assert device_input.hex() == DC["device_signing_input_utf8_hex"]
    device_sig = b64u_encode(device_keys().sign(device_input))
    assert device_sig == DC["device_signature"]  # Ed25519 is deterministic
    with_device = {**unsigned, "device_signature": device_sig}
    account_input = network_bound_bytes(with_device, CTX)
    assert account_input.hex() == DC["account_signing_input_utf8_hex"]
    assert b64u_encode(account_key().sign(account_input)) == DC["account_signature"]  # RFC 6979


def signed_certificate() -> dict[str, Any]:
    return {
        **DC["unsigned_object"],
        "device_signature": DC["device_signature"],
        "account_signature": DC["account_signature"],
    }


def test_issue_certificate_matches_vector() -> None:
    from cryptography.hazmat.primitives.asymmetric import x25519

    # Rebuild the device keys with the vector's encryption public key through the public API:
    # issue_certificate needs a private X25519 key, so compare everything but that field.
    cert = DeviceCertificate.from_wire(signed_certificate())
    assert verify_certificate(cert, CTX) == V["device_identity"]["derived_device_id"]
    keys = DeviceKeys(device_keys().signing_key, x25519.X25519PrivateKey.generate())
    issued = issue_certificate(
        account_key(), keys, CTX, not_before=cert.not_before, expires_at=cert.expires_at
    )
    verify_certificate(issued, CTX)
    assert issued.account == cert.account and issued.signing_public_key == cert.signing_public_key


@pytest.mark.parametrize(
    "field",
    [
        "account",
        "signing_public_key",
        "encryption_public_key",
        "not_before",
        "expires_at",
        "device_signature",
        "account_signature",
        "account_public_key",
    ],
)
def test_certificate_tampering_rejected(field: str) -> None:
    wire = signed_certificate()
    if field in ("not_before", "expires_at"):
        wire[field] += 1
    elif field == "account":
        wire[field] = "neo:860833102:NQ4dwCuyRn5oermdohgw3gWuYDmqT9Vedn"
    else:
        raw = bytearray(b64u_decode(wire[field]))
        raw[5] ^= 0x01
        wire[field] = b64u_encode(bytes(raw))
    with pytest.raises((InvalidSignature, BadRequest)):
        verify_certificate(DeviceCertificate.from_wire(wire), CTX)


def test_certificate_window_rules() -> None:
    keys = DeviceKeys.generate()
    with pytest.raises(BadRequest):
        issue_certificate(account_key(), keys, CTX, not_before=100, expires_at=100)
    with pytest.raises(BadRequest):
        issue_certificate(account_key(), keys, CTX, not_before=0, expires_at=720 * 86400 + 1)
    ok = issue_certificate(account_key(), keys, CTX, not_before=0, expires_at=720 * 86400)
    assert verify_certificate(ok, CTX).startswith("dev_")
    assert ok.is_valid_at(0) and not ok.is_valid_at(720 * 86400)


def test_certificate_other_network_rejected() -> None:
    other = NetworkContext("neo:860833103:0x5979ba79431672a38a18a32cdc48fd7317818b70")
    with pytest.raises(BadRequest):
        verify_certificate(DeviceCertificate.from_wire(signed_certificate()), other)
    same_magic = NetworkContext("neo:860833102:0x0000000000000000000000000000000000000000")
    with pytest.raises(InvalidSignature):
        verify_certificate(DeviceCertificate.from_wire(signed_certificate()), same_magic)


RO = V["relay_origin"]


@pytest.mark.parametrize(
    "case", RO["normalization_cases"], ids=[c["name"] for c in RO["normalization_cases"]]
)
def test_relay_origin(case: dict[str, Any]) -> None:
    origin = relay_origin(case["endpoint"])
    assert origin == case["expected_origin"]
    assert origin.encode().hex() == case["expected_origin_utf8_hex"]


@pytest.mark.parametrize(
    "case", RO["comparison_cases"], ids=[c["name"] for c in RO["comparison_cases"]]
)
def test_relay_origin_comparison(case: dict[str, Any]) -> None:
    same = relay_origin(case["left_endpoint"]) == relay_origin(case["right_endpoint"])
    assert same is case["expected_same_origin"]


SA = V["session_auth"]


def test_session_signers_resolve() -> None:
    signers = SA["signers"]
    assert pointer(V, signers["account_ref"]) == SA["device_auth"]["auth_payload"]["account"]
    assert pointer(V, signers["device_id_ref"]) == SA["device_auth"]["auth_payload"]["device_id"]
    assert (
        pointer(V, signers["account_public_key_ref"])
        == SA["account_auth"]["auth_payload"]["account_public_key"]
    )


def test_device_auth_signature_recreated() -> None:
    da = SA["device_auth"]
    payload = da["auth_payload"]
    built = device_auth_input(
        relay_id=SA["target"]["relay_id"],
        origin=relay_origin(SA["target"]["endpoint"]),
        account=pointer(V, SA["signers"]["account_ref"]),
        device_id=pointer(V, SA["signers"]["device_id_ref"]),
        nonce=SA["challenge"]["nonce"],
        timestamp=SA["challenge"]["created_at"],
    )
    assert built == payload
    data = network_bound_bytes(built, CTX)
    assert data.decode() == da["signing_input_canonical_json"]
    assert data.hex() == da["signing_input_utf8_hex"]
    assert hashlib.sha256(data).hexdigest() == da["signing_input_sha256_hex"]
    assert b64u_encode(device_keys().sign(data)) == da["signature"]
    legacy = {k: v for k, v in built.items() if k != "relay_id"}
    assert network_bound_bytes(legacy, CTX).hex() == da["legacy_signing_input_utf8_hex"]
    assert (
        b64u_encode(device_keys().sign(network_bound_bytes(legacy, CTX))) == da["legacy_signature"]
    )
    request = da["request"]
    assert request["device_signature"] == da["signature"]
    cert = DeviceCertificate.from_wire(request["signer_certificate"])
    device_id = verify_certificate(cert, CTX)
    verify_device_auth(
        request["device_signature"],
        signing_public_key=cert.signing_key_bytes,
        context=CTX,
        relay_id=SA["target"]["relay_id"],
        origin=relay_origin(SA["target"]["endpoint"]),
        account=cert.account,
        device_id=device_id,
        nonce=request["nonce"],
        timestamp=request["timestamp"],
    )


def test_account_auth_signature_recreated() -> None:
    aa = SA["account_auth"]
    built = account_auth_input(
        relay_id=SA["target"]["relay_id"],
        origin=relay_origin(SA["target"]["endpoint"]),
        account=pointer(V, SA["signers"]["account_ref"]),
        account_public_key=pointer(V, SA["signers"]["account_public_key_ref"]),
        nonce=SA["challenge"]["nonce"],
    )
    assert built == aa["auth_payload"]
    data = network_bound_bytes(built, CTX)
    assert data.decode() == aa["signing_input_canonical_json"]
    assert data.hex() == aa["signing_input_utf8_hex"]
    assert hashlib.sha256(data).hexdigest() == aa["signing_input_sha256_hex"]
    assert b64u_encode(account_key().sign(data)) == aa["signature"]  # RFC 6979: identical bytes
    legacy = {k: v for k, v in built.items() if k != "relay_id"}
    assert network_bound_bytes(legacy, CTX).hex() == aa["legacy_signing_input_utf8_hex"]
    assert (
        b64u_encode(account_key().sign(network_bound_bytes(legacy, CTX))) == aa["legacy_signature"]
    )
    request = aa["request"]
    verify_account_auth(
        request["account_signature"],
        account_public_key=request["account_public_key"],
        context=CTX,
        relay_id=SA["target"]["relay_id"],
        origin=relay_origin(SA["target"]["endpoint"]),
        account=built["account"],
        nonce=request["nonce"],
    )


@pytest.mark.parametrize(
    "case", SA["verification_cases"], ids=[c["name"] for c in SA["verification_cases"]]
)
@pytest.mark.parametrize("mode", ["device", "account"])
def test_session_verification_cases(case: dict[str, Any], mode: str) -> None:
    """The verifier always builds the input from its own relay_id and endpoint origin."""
    context = NetworkContext(case["network_context"])
    origin = relay_origin(case["endpoint"])
    nonce = case.get("nonce_override", SA["challenge"]["nonce"])
    if mode == "device":
        block = SA["device_auth"]
        request = copy.deepcopy(block["request"])
        request.update(case.get("request_extra_fields", {}))  # ignored: never overrides identity

        def check() -> None:
            cert = DeviceCertificate.from_wire(request["signer_certificate"])
            verify_device_auth(
                block[case["signature_field"]],
                signing_public_key=cert.signing_key_bytes,
                context=context,
                relay_id=case["trusted_relay_id"],
                origin=origin,
                account=cert.account,
                device_id=cert.device_id(context),
                nonce=nonce,
                timestamp=request["timestamp"],
            )
    else:
        block = SA["account_auth"]
        request = copy.deepcopy(block["request"])
        request.update(case.get("request_extra_fields", {}))

        def check() -> None:
            verify_account_auth(
                block[case["signature_field"]],
                account_public_key=request["account_public_key"],
                context=context,
                relay_id=case["trusted_relay_id"],
                origin=origin,
                account=block["auth_payload"]["account"],
                nonce=nonce,
            )

    if case["expected_signature_valid"]:
        check()
    else:
        with pytest.raises(InvalidSignature):
            check()
