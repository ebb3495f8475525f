"""Contact authorization verdicts: grants, invitations, public discovery, signed state queries."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gapline.meshline import (
    HTTP_STATUS_BY_CODE,
    JSONRPC_CODE_BY_CODE,
    AccessBasis,
    AccessVerdict,
    BadRequest,
    ContactGrant,
    ContactInvite,
    CurrentDevices,
    Forbidden,
    InvalidSignature,
    MeshlineError,
    Refusal,
    SignedStateQuery,
    authorize_delivery,
    authorize_state_query,
    evaluate_authorization,
    evaluate_grant,
    evaluate_invite,
    issue_grant,
    issue_invite,
    parse_authorization,
    public_access,
    sign_grant,
    sign_profile,
    sign_state_query,
    verify_state_query,
)
from gapline.meshline.testing import TEST_CONTEXT, TestAccount, make_account

NOW = int(time.time())
ALICE = make_account(2)  # the target: grants and invites come from her
BOB = make_account()  # the requester / sender
CAROL = make_account()
ALICE_DEVICES = CurrentDevices.verified(ALICE.state, TEST_CONTEXT)


def grant(
    grantee: TestAccount = BOB, *, device: int = 0, expires_at: int | None = None, **ext: Any
) -> ContactGrant:
    dev = ALICE.device(device)
    return issue_grant(
        dev.keys,
        dev.device_id,
        TEST_CONTEXT,
        grantor=ALICE.account,
        grantee=grantee.account,
        expires_at=expires_at,
        extensions=ext,
    )


def invite(*, device: int = 0, expires_at: int = NOW + 3600) -> ContactInvite:
    dev = ALICE.device(device)
    return issue_invite(
        dev.keys, dev.device_id, TEST_CONTEXT, inviter=ALICE.account, expires_at=expires_at
    )


def of_grant(g: ContactGrant, devices: CurrentDevices = ALICE_DEVICES, **kw: Any) -> AccessVerdict:
    kw.setdefault("grantee", BOB.account)
    kw.setdefault("now", NOW)
    return evaluate_grant(g, grantor_devices=devices, context=TEST_CONTEXT, **kw)


def of_invite(i: ContactInvite, devices: CurrentDevices = ALICE_DEVICES, now: int = NOW) -> Any:
    return evaluate_invite(i, inviter_devices=devices, now=now, context=TEST_CONTEXT)


def refused(verdict: AccessVerdict, refusal: Refusal, code: str) -> None:
    assert not verdict.allowed and verdict.basis is None
    assert verdict.refusal is refusal and verdict.code == code
    with pytest.raises(MeshlineError) as info:
        verdict.check()
    assert info.value.code == code and code in HTTP_STATUS_BY_CODE


def without(account: TestAccount, index: int) -> CurrentDevices:
    """The account's devices after one was removed (a new, signed state)."""
    kept = [d for i, d in enumerate(account.devices) if i != index]
    state = account.new_state(kept, revision=account.state.revision + 1)
    return CurrentDevices.verified(state, TEST_CONTEXT)


# --- grants ---------------------------------------------------------------------------


def test_valid_grant() -> None:
    verdict = of_grant(grant())
    assert verdict.allowed and verdict.check() is AccessBasis.GRANT and verdict.code is None
    assert of_grant(grant(device=1)).allowed
    assert of_grant(grant(expires_at=NOW + 1)).allowed


def test_grant_replayed_for_another_sender() -> None:
    refused(of_grant(grant(), grantee=CAROL.account), Refusal.WRONG_AUDIENCE, "forbidden")


def test_grant_from_another_account() -> None:
    carol_devices = CurrentDevices.verified(CAROL.state, TEST_CONTEXT)
    refused(of_grant(grant(), carol_devices), Refusal.WRONG_ISSUER, "forbidden")


def test_expired_grant() -> None:
    refused(of_grant(grant(expires_at=NOW)), Refusal.EXPIRED, "forbidden")
    refused(of_grant(grant(expires_at=NOW - 100)), Refusal.EXPIRED, "forbidden")


def test_revoked_signing_device() -> None:
    g = grant(device=1)
    refused(of_grant(g, without(ALICE, 1)), Refusal.NO_CURRENT_SIGNER, "forbidden")
    # Another current device's signature keeps the grant valid.
    both = sign_grant(g, ALICE.device(0).keys, ALICE.device(0).device_id, TEST_CONTEXT)
    assert of_grant(both, without(ALICE, 1)).allowed


def test_signing_device_outside_its_window() -> None:
    soon = ALICE.add_device(not_before=NOW + 600)
    late_state = ALICE.new_state([*ALICE.devices, soon], revision=ALICE.state.revision + 2)
    devices = CurrentDevices.verified(late_state, TEST_CONTEXT)
    g = sign_grant(
        ContactGrant(ALICE.account, BOB.account, {}), soon.keys, soon.device_id, TEST_CONTEXT
    )
    refused(of_grant(g, devices), Refusal.NO_CURRENT_SIGNER, "forbidden")  # not yet valid
    assert of_grant(g, devices, now=NOW + 600).allowed
    expired = soon.certificate.expires_at
    refused(of_grant(g, devices, now=expired), Refusal.NO_CURRENT_SIGNER, "forbidden")


def test_wrong_signature_from_a_current_device() -> None:
    g = grant()
    other = grant(expires_at=NOW + 10)  # same device, another body
    forged = ContactGrant(g.grantor, g.grantee, other.signatures, g.expires_at, g.extensions)
    refused(of_grant(forged), Refusal.BAD_SIGNATURE, "invalid_signature")
    # A signature made under another device ID does not transfer.
    moved = {ALICE.device(1).device_id: g.signatures[ALICE.device(0).device_id]}
    refused(
        of_grant(ContactGrant(g.grantor, g.grantee, moved)),
        Refusal.BAD_SIGNATURE,
        "invalid_signature",
    )


def test_one_good_signature_is_enough() -> None:
    g = grant(device=1)
    bad = dict(g.signatures)
    bad[ALICE.device(0).device_id] = grant(expires_at=1).signatures[ALICE.device(0).device_id]
    assert of_grant(ContactGrant(g.grantor, g.grantee, bad)).allowed


def test_unknown_signers_are_ignored_not_failures() -> None:
    outsider = CAROL.device(0)
    g = sign_grant(
        ContactGrant(ALICE.account, BOB.account, {}),
        outsider.keys,
        outsider.device_id,
        TEST_CONTEXT,
    )
    refused(of_grant(g), Refusal.NO_CURRENT_SIGNER, "forbidden")


# --- invitations ----------------------------------------------------------------------


def test_valid_invite_is_reusable() -> None:
    i = invite()
    assert of_invite(i).check() is AccessBasis.INVITE
    assert of_invite(i).allowed  # no usage count
    assert ContactInvite.from_json(i.to_json()) == i


def test_invite_refusals() -> None:
    carol_devices = CurrentDevices.verified(CAROL.state, TEST_CONTEXT)
    refused(of_invite(invite(), carol_devices), Refusal.WRONG_ISSUER, "forbidden")
    refused(of_invite(invite(expires_at=NOW)), Refusal.EXPIRED, "forbidden")
    refused(of_invite(invite(device=1), without(ALICE, 1)), Refusal.NO_CURRENT_SIGNER, "forbidden")
    i = invite()
    forged = ContactInvite(i.inviter, i.signer_device_id, i.expires_at + 1, i.device_signature)
    refused(of_invite(forged), Refusal.BAD_SIGNATURE, "invalid_signature")


# --- parsing, delivery and public discovery ---------------------------------------------


def test_parse_authorization() -> None:
    assert parse_authorization(grant().to_wire()) == grant()
    assert parse_authorization(invite().to_wire()) == invite()
    for bad in ({"$type": "meshline.friend.invite"}, [], None, {"$type": "meshline.contact.grant"}):
        with pytest.raises(BadRequest):
            parse_authorization(bad)


def evaluate(material: Any, requester: TestAccount = BOB) -> AccessVerdict:
    return evaluate_authorization(
        material,
        requester=requester.account,
        target_devices=ALICE_DEVICES,
        now=NOW,
        context=TEST_CONTEXT,
    )


def test_evaluate_wire_material() -> None:
    assert evaluate(grant().to_wire()).basis is AccessBasis.GRANT
    assert evaluate(invite().to_wire()).basis is AccessBasis.INVITE
    assert evaluate(invite()).basis is AccessBasis.INVITE
    refused(evaluate({"$type": "meshline.friend.invite"}), Refusal.UNSUPPORTED_TYPE, "bad_request")
    broken = {**grant().to_wire(), "signatures": {}}
    refused(evaluate(broken), Refusal.MALFORMED, "bad_request")
    refused(evaluate(grant().to_wire(), CAROL), Refusal.WRONG_AUDIENCE, "forbidden")


def profile(discovery: bool) -> Any:
    return sign_profile(
        ALICE.device(0).keys,
        ALICE.account,
        TEST_CONTEXT,
        public_discovery=discovery,
        updated_at=NOW,
    )


def deliver(authorization: Any, *, sender: TestAccount = BOB, public: bool | None = False) -> Any:
    return authorize_delivery(
        authorization,
        sender=sender.account,
        recipient=ALICE.account,
        recipient_devices=ALICE_DEVICES,
        recipient_profile=None if public is None else profile(public),
        now=NOW,
        context=TEST_CONTEXT,
    )


def test_delivery_rules() -> None:
    assert deliver(None, sender=ALICE).basis is AccessBasis.SELF
    refused(deliver(grant().to_wire(), sender=ALICE), Refusal.SELF_DELIVERY, "bad_request")
    assert deliver(None, public=True).basis is AccessBasis.PUBLIC
    refused(deliver(None, public=False), Refusal.NOT_PUBLIC, "forbidden")
    refused(deliver(None, public=None), Refusal.NOT_PUBLIC, "forbidden")  # no profile
    assert deliver(grant().to_wire()).basis is AccessBasis.GRANT
    assert deliver(invite().to_wire()).basis is AccessBasis.INVITE
    refused(deliver(grant().to_wire(), sender=CAROL), Refusal.WRONG_AUDIENCE, "forbidden")


def test_invalid_authorization_never_falls_back_to_public() -> None:
    for material, code in (
        (grant(expires_at=NOW - 1).to_wire(), "forbidden"),
        ({**invite().to_wire(), "expires_at": NOW + 99999}, "invalid_signature"),
        ({"$type": "meshline.contact.grant"}, "bad_request"),
    ):
        verdict = deliver(material, public=True)
        assert not verdict.allowed and verdict.code == code


def test_public_access() -> None:
    assert public_access(profile(True)).allowed
    refused(public_access(profile(False)), Refusal.NOT_PUBLIC, "forbidden")
    refused(public_access(None), Refusal.NOT_PUBLIC, "forbidden")


def test_every_refusal_has_a_wire_code() -> None:
    for refusal in Refusal:
        assert refusal.code in HTTP_STATUS_BY_CODE and refusal.code in JSONRPC_CODE_BY_CODE
    with pytest.raises(Forbidden):
        AccessVerdict.refuse(Refusal.EXPIRED, "x").check()
    with pytest.raises(InvalidSignature):
        AccessVerdict.refuse(Refusal.BAD_SIGNATURE, "x").check()
    with pytest.raises(BadRequest):
        AccessVerdict.refuse(Refusal.MALFORMED, "x").check()


# --- signed device-state queries ----------------------------------------------------------


def query(
    material: Any = None, *, account: TestAccount = ALICE, created_at: int = NOW
) -> SignedStateQuery:
    dev = BOB.device(0)
    return sign_state_query(
        dev.keys,
        dev.certificate,
        TEST_CONTEXT,
        account=account.account,
        authorization=grant() if material is None else material,
        created_at=created_at,
    )


def verify_query(q: SignedStateQuery, **kw: Any) -> str:
    kw.setdefault("now", NOW)
    return verify_state_query(q, context=TEST_CONTEXT, max_skew=60, max_age=300, **kw)


def code_of(fn: Any, *args: Any, **kw: Any) -> str:
    with pytest.raises(MeshlineError) as info:
        fn(*args, **kw)
    return info.value.code


def test_signed_query_round_trip() -> None:
    q = query()
    again = SignedStateQuery.from_wire(q.to_wire())
    assert again == q and q.to_wire()["$type"] == "meshline.device.state.resolve"
    caller = (BOB.account, BOB.device(0).device_id)
    assert verify_query(again, caller=caller) == BOB.account
    assert verify_query(again) == BOB.account  # a destination relay has no caller
    verdict = authorize_state_query(
        again, target_devices=ALICE_DEVICES, now=NOW, context=TEST_CONTEXT
    )
    assert verdict.basis is AccessBasis.GRANT
    by_invite = query(invite())
    assert (
        authorize_state_query(
            by_invite, target_devices=ALICE_DEVICES, now=NOW, context=TEST_CONTEXT
        ).basis
        is AccessBasis.INVITE
    )


def test_signed_query_refusals() -> None:
    q = query()
    assert code_of(verify_query, q, caller=(BOB.account, "dev_" + "A" * 22)) == "forbidden"
    assert code_of(verify_query, q, caller=(CAROL.account, BOB.device(0).device_id)) == "forbidden"
    own = sign_state_query(
        BOB.device(0).keys,
        BOB.device(0).certificate,
        TEST_CONTEXT,
        account=BOB.account,
        authorization=grant(),
        created_at=NOW,
    )
    assert code_of(verify_query, own) == "forbidden"
    assert code_of(verify_query, query(created_at=NOW + 61)) == "clock_skew"
    assert code_of(verify_query, query(created_at=NOW + 86400 * 365)) == "clock_skew"
    assert code_of(verify_query, query(created_at=NOW - 301)) == "clock_skew"
    verify_query(query(created_at=NOW + 60))
    verify_query(query(created_at=NOW - 300))
    tampered = SignedStateQuery.from_wire({**q.to_wire(), "account": CAROL.account})
    assert code_of(verify_query, tampered) == "invalid_signature"
    cert = {**q.signer_certificate.to_wire(), "expires_at": q.signer_certificate.expires_at - 1}
    bad_cert = SignedStateQuery.from_wire({**q.to_wire(), "signer_certificate": cert})
    assert code_of(verify_query, bad_cert) == "invalid_signature"
    # The grant in a validly signed query still decides: Carol's query with Bob's grant.
    carol = CAROL.device(0)
    replay = sign_state_query(
        carol.keys,
        carol.certificate,
        TEST_CONTEXT,
        account=ALICE.account,
        authorization=grant(),
        created_at=NOW,
    )
    assert verify_query(replay) == CAROL.account
    verdict = authorize_state_query(
        replay, target_devices=ALICE_DEVICES, now=NOW, context=TEST_CONTEXT
    )
    refused(verdict, Refusal.WRONG_AUDIENCE, "forbidden")


@pytest.mark.parametrize(
    "field",
    ["$type", "account", "authorization", "signer_certificate", "created_at", "device_signature"],
)
def test_signed_query_missing_fields_are_bad_request(field: str) -> None:
    wire = query().to_wire()
    del wire[field]
    assert code_of(SignedStateQuery.from_wire, wire) == "bad_request"


# --- properties --------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    expires=st.one_of(st.none(), st.integers(NOW - 1000, NOW + 1000)),
    removed=st.sets(st.sampled_from([0, 1])),
    signers=st.sets(st.sampled_from([0, 1]), min_size=1),
    now=st.integers(NOW, NOW + 100),  # inside every certificate window
)
def test_property_grant_verdict(
    expires: int | None, removed: set[int], signers: set[int], now: int
) -> None:
    g = ContactGrant(ALICE.account, BOB.account, {}, expires)
    for i in sorted(signers):
        g = sign_grant(g, ALICE.device(i).keys, ALICE.device(i).device_id, TEST_CONTEXT)
    kept = [d for i, d in enumerate(ALICE.devices) if i not in removed]
    devices = CurrentDevices.verified(
        ALICE.new_state(kept, revision=ALICE.state.revision + 1), TEST_CONTEXT
    )
    verdict = of_grant(g, devices, now=now)
    live = expires is None or now < expires
    assert verdict.allowed is (live and bool(signers - removed))
    if not live:
        assert verdict.refusal is Refusal.EXPIRED
    elif not signers - removed:
        assert verdict.refusal is Refusal.NO_CURRENT_SIGNER
