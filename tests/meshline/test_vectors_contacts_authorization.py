"""contacts-v1.json through the authorization verdicts a relay applies.

The vectors state selection outcomes and signature validity; a grant a selection
case may adopt (``replace``/``keep``/``merge``) must also be one a home relay
accepts as delivery authorization, and an ``invalid`` one must be refused with the
spec's code. Invitations likewise, by ``expected_signature_valid`` and type.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gapline.meshline import (
    AccessBasis,
    CurrentDevices,
    DeviceCertificate,
    NetworkContext,
    Refusal,
    evaluate_authorization,
)
from tests.meshline.vectors import load, pointer

V = load("contacts-v1.json")
CTX = NetworkContext(V["network_context"])
G = V["grants"]
NOW = G["verification_time"]
GRANTS = {g["label"]: g["grant"] for g in G["grants"]}
DEVICES = {d["label"]: d for d in G["signing_devices"]}

# What each refused selection case is refused for.
REFUSALS = {
    "expired_candidate_is_invalid": Refusal.EXPIRED,
    "changed_expiry_cannot_reuse_signature": Refusal.BAD_SIGNATURE,
    "changed_extension_cannot_reuse_signature": Refusal.BAD_SIGNATURE,
    "inactive_signer_cannot_renew": Refusal.NO_CURRENT_SIGNER,
    "different_signing_key_and_account_cannot_reuse_signature": Refusal.NO_CURRENT_SIGNER,
    "invalid_null_root_extension_is_rejected_despite_valid_signature": Refusal.MALFORMED,
    "invalid_null_nested_extension_is_rejected_despite_valid_signature": Refusal.MALFORMED,
    "invalid_null_array_element_is_rejected_despite_valid_signature": Refusal.MALFORMED,
}


def devices_of(account: str, labels: list[str]) -> CurrentDevices:
    certs = {DEVICES[label]["device_id"]: DEVICES[label]["certificate"] for label in labels}
    by_id = {
        device_id: DeviceCertificate.from_wire(cert)
        for device_id, cert in certs.items()
        if cert["account"] == account
    }
    return CurrentDevices(account, by_id)


CASES = [c for c in G["selection_cases"] if c["expected_action"] != "out_of_scope"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_selection_cases_as_delivery_authorization(case: dict[str, Any]) -> None:
    wire = copy.deepcopy(GRANTS[case["candidate"]])
    wire.update(case.get("candidate_overrides", {}))
    devices = devices_of(
        wire["grantor"], case.get("current_valid_devices", G["current_valid_devices"])
    )
    verdict = evaluate_authorization(
        wire, requester=wire["grantee"], target_devices=devices, now=NOW, context=CTX
    )
    if case["expected_action"] == "invalid":
        assert verdict.refusal is REFUSALS[case["name"]]
    else:
        assert verdict.basis is AccessBasis.GRANT, verdict.message


def test_every_vector_grant_for_its_own_pair() -> None:
    for label, wire in GRANTS.items():
        devices = devices_of(wire["grantor"], G["current_valid_devices"])
        verdict = evaluate_authorization(
            wire, requester=wire["grantee"], target_devices=devices, now=NOW, context=CTX
        )
        if label.startswith("invalid_null"):
            assert verdict.refusal is Refusal.MALFORMED, label
        elif label == "expired":
            assert verdict.refusal is Refusal.EXPIRED, label
        else:
            assert verdict.allowed, label
            # Presented by the reverse party it is someone else's grant.
            reverse = evaluate_authorization(
                wire, requester=wire["grantor"], target_devices=devices, now=NOW, context=CTX
            )
            assert reverse.refusal is Refusal.WRONG_AUDIENCE, label


INV = V["invites"]
INVITES = {i["label"]: i["object"] for i in INV["invites"]}
SIGNER = pointer(V, INV["signing_device_ref"])


@pytest.mark.parametrize("case", INV["verification_cases"], ids=lambda c: c["name"])
def test_invite_cases_as_authorization(case: dict[str, Any]) -> None:
    obj = copy.deepcopy(INVITES[case["invite"]])
    obj.update(case.get("invite_overrides", {}))
    context = NetworkContext(case.get("network_context", CTX))
    devices = CurrentDevices(
        SIGNER["certificate"]["account"],
        {SIGNER["device_id"]: DeviceCertificate.from_wire(SIGNER["certificate"])},
    )
    now = SIGNER["certificate"]["not_before"]
    assert now < obj["expires_at"]
    verdict = evaluate_authorization(
        obj,
        requester=G["grants"][0]["grant"]["grantee"],
        target_devices=devices,
        now=now,
        context=context,
    )
    if not case["expected_type_supported"]:
        assert verdict.refusal is Refusal.UNSUPPORTED_TYPE
    elif case["expected_signature_valid"]:
        assert verdict.basis is AccessBasis.INVITE
    else:
        assert verdict.refusal is Refusal.BAD_SIGNATURE and verdict.code == "invalid_signature"
    if verdict.allowed:  # at its expiry it is refused, whoever presents it
        expired = evaluate_authorization(
            obj, requester="x", target_devices=devices, now=obj["expires_at"], context=context
        )
        assert expired.refusal is Refusal.EXPIRED
