"""contacts-v1.json: grant signatures, grant format, grant selection, invites."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519, x25519

from gapline.meshline import (
    BadRequest,
    DeviceCertificate,
    DeviceKeys,
    NetworkContext,
    b64u_decode,
    device_verify,
    network_bound_bytes,
    parse_json,
)
from gapline.meshline._contacts import (
    ContactGrant,
    ContactInvite,
    GrantAction,
    select_grant,
    sign_grant,
    verify_invite,
)
from tests.meshline.vectors import load, pointer

V = load("contacts-v1.json")
CTX = NetworkContext(V["network_context"])
S = V["signing"]
G = V["grants"]
INV = V["invites"]


def names(cases: list[dict[str, Any]]) -> list[str]:
    return [c["name"] for c in cases]


def test_grant_signature_recreated() -> None:
    vec = S["vector"]
    grant_wire = vec["grant"]
    assert grant_wire["signatures"] == {}  # the unsigned body as given
    body = {k: v for k, v in grant_wire.items() if k != "signatures"}
    data = network_bound_bytes(body, CTX)
    assert data.decode() == vec["signing_input_canonical_json"]
    assert data.hex() == vec["signing_input_utf8_hex"]
    signing = ed25519.Ed25519PrivateKey.from_private_bytes(b64u_decode(vec["private_key"]))
    keys = DeviceKeys(signing, x25519.X25519PrivateKey.generate())
    grant = ContactGrant(
        body["grantor"],
        body["grantee"],
        {},
        body["expires_at"],
        {"future_data": body["future_data"]},
    )
    signed = sign_grant(grant, keys, vec["device_id"], CTX)
    assert signed.signatures == {vec["device_id"]: vec["signature"]}
    assert ContactGrant.from_wire(signed.to_wire()) == signed


@pytest.mark.parametrize("case", S["verification_cases"], ids=names(S["verification_cases"]))
def test_grant_signature_verification(case: dict[str, Any]) -> None:
    vec = S["vector"]
    grant = copy.deepcopy(vec["grant"])
    grant.update(case.get("grant_overrides", {}))
    for name in case.get("grant_remove_fields", []):
        del grant[name]
    context = NetworkContext(case.get("network_context", CTX))
    public_key = b64u_decode(case.get("public_key", vec["public_key"]))
    signature = b64u_decode(case.get("signature", vec["signature"]))
    # The device ID only names the map entry; it is not part of the signed body.
    assert case.get("device_id", vec["device_id"]).startswith("dev_")
    data = network_bound_bytes({k: v for k, v in grant.items() if k != "signatures"}, context)
    assert device_verify(public_key, data, signature) is case["expected_signature_valid"]


@pytest.mark.parametrize("case", G["format_cases"], ids=names(G["format_cases"]))
def test_grant_format(case: dict[str, Any]) -> None:
    if case["expected"] == "accept":
        grant = ContactGrant.from_json(case["input_json"])
        assert grant.to_wire() == parse_json(case["input_json"])
    else:
        with pytest.raises(BadRequest):
            ContactGrant.from_json(case["input_json"])


GRANTS = {g["label"]: g for g in G["grants"]}
DEVICES = {d["label"]: d for d in G["signing_devices"]}


def test_grant_vectors_signing_inputs() -> None:
    for label, entry in GRANTS.items():
        body = {k: v for k, v in entry["grant"].items() if k != "signatures"}
        assert network_bound_bytes(body, CTX).hex() == entry["signing_input_utf8_hex"], label


def test_signing_devices() -> None:
    from gapline.meshline import verify_certificate

    for device in G["signing_devices"]:
        cert = DeviceCertificate.from_wire(device["certificate"])
        assert verify_certificate(cert, CTX) == device["device_id"]
        signing = ed25519.Ed25519PrivateKey.from_private_bytes(
            b64u_decode(device["signing_private_key"])
        )
        assert signing.public_key().public_bytes_raw() == cert.signing_key_bytes


def grant_of(label: str, overrides: dict[str, Any] | None = None) -> ContactGrant | None:
    wire = copy.deepcopy(GRANTS[label]["grant"])
    wire.update(overrides or {})
    try:
        return ContactGrant.from_wire(wire)
    except BadRequest:
        return None


@pytest.mark.parametrize("case", G["selection_cases"], ids=names(G["selection_cases"]))
def test_grant_selection(case: dict[str, Any]) -> None:
    valid_labels = case.get("current_valid_devices", G["current_valid_devices"])
    devices = {
        DEVICES[label]["device_id"]: DeviceCertificate.from_wire(DEVICES[label]["certificate"])
        for label in valid_labels
    }
    current = grant_of(case["current"])
    assert current is not None
    candidate = grant_of(case["candidate"], case.get("candidate_overrides"))
    if candidate is None:  # refused by the object rules (e.g. a null extension)
        action, selected = GrantAction.INVALID, current
    else:
        action, selected = select_grant(
            current,
            candidate,
            devices=devices,
            now=G["verification_time"],
            context=CTX,
            candidate_context=NetworkContext(case.get("candidate_network_context", CTX)),
        )
    assert action is GrantAction(case["expected_action"])
    assert selected is not None
    assert selected.to_wire() == GRANTS[case["expected_selected"]]["grant"]


INVITES = {i["label"]: i for i in INV["invites"]}


def test_invite_signing_inputs() -> None:
    for label, entry in INVITES.items():
        data = network_bound_bytes(entry["object"], CTX, exclude=("device_signature",))
        assert data.decode() == entry["signing_input_canonical_json"], label
        assert data.hex() == entry["signing_input_utf8_hex"]
        signing = ed25519.Ed25519PrivateKey.from_private_bytes(
            b64u_decode(pointer(V, INV["signing_device_ref"])["signing_private_key"])
        )
        from gapline.meshline import b64u_encode

        assert (
            b64u_encode(signing.sign(data)) == entry["object"]["device_signature"]
        )  # Ed25519 is deterministic


@pytest.mark.parametrize("case", INV["verification_cases"], ids=names(INV["verification_cases"]))
def test_invite_verification(case: dict[str, Any]) -> None:
    obj = copy.deepcopy(INVITES[case["invite"]]["object"])
    obj.update(case.get("invite_overrides", {}))
    context = NetworkContext(case.get("network_context", CTX))
    signer = DeviceCertificate.from_wire(pointer(V, INV["signing_device_ref"])["certificate"])
    data = network_bound_bytes(obj, context, exclude=("device_signature",))
    valid = device_verify(signer.signing_key_bytes, data, b64u_decode(obj["device_signature"]))
    assert valid is case["expected_signature_valid"]
    supported = obj["$type"] == "meshline.contact.invite"
    assert supported is case["expected_type_supported"]
    if supported:
        invite = ContactInvite.from_wire(obj)
        now = obj["expires_at"] - 1
        assert (
            verify_invite(invite, signer, now=now, context=context)
            is case["expected_signature_valid"]
        )
        assert (
            verify_invite(invite, signer, now=obj["expires_at"], context=context) is False
        )  # expired
    else:
        with pytest.raises(BadRequest):
            ContactInvite.from_wire(obj)
