"""AccountProfile: object rules, signatures, and what profile.publish / profile.resolve check."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gapline.meshline import (
    HTTP_STATUS_BY_CODE,
    PROFILE_MAX_BYTES,
    AccountProfile,
    BadRequest,
    ContentReference,
    MeshlineError,
    NetworkContext,
    ResolvedProfile,
    canonical_json,
    check_profile_publish,
    sign_profile,
    verify_profile,
    verify_resolved_profile,
)
from gapline.meshline.testing import TEST_CONTEXT, TestAccount, make_account

NOW = int(time.time())
SKEW = 300
ALICE = make_account(2)
BOB = make_account()
AVATAR = ContentReference(
    uri="https://cdn.example/avatar.png",
    hash="sha256:" + "A" * 43,
    content_type="image/png",
    size=1024,
)


def profile_of(account: TestAccount = ALICE, device: int = 0, **kw: Any) -> AccountProfile:
    kw.setdefault("public_discovery", True)
    kw.setdefault("updated_at", NOW)
    return sign_profile(account.device(device).keys, account.account, TEST_CONTEXT, **kw)


def wire(**changes: Any) -> dict[str, Any]:
    obj = profile_of(nickname="Alice", bio="hi").to_wire()
    obj.update(changes)
    return obj


def code_of(fn: Any, *args: Any, **kw: Any) -> str:
    with pytest.raises(MeshlineError) as info:
        fn(*args, **kw)
    assert info.value.code in HTTP_STATUS_BY_CODE  # every refusal is a wire code
    return info.value.code


def publish(profile: AccountProfile, **kw: Any) -> None:
    kw.setdefault("account", ALICE.account)
    kw.setdefault("signer", ALICE.device(0).certificate)
    kw.setdefault("current_updated_at", None)
    check_profile_publish(profile, context=TEST_CONTEXT, now=NOW, max_skew=SKEW, **kw)


def test_sign_verify_round_trip() -> None:
    profile = profile_of(nickname="Alice", bio="hello", avatar=AVATAR, extensions={"x": [1]})
    assert AccountProfile.from_json(profile.to_json()) == profile
    assert profile.to_wire()["$type"] == "meshline.profile"
    verify_profile(profile, ALICE.device(0).certificate, TEST_CONTEXT)
    publish(profile)


def test_a_profile_verifies_only_with_its_signing_device() -> None:
    profile = profile_of(device=1)
    verify_profile(profile, ALICE.device(1).certificate, TEST_CONTEXT)
    assert code_of(verify_profile, profile, ALICE.device(0).certificate, TEST_CONTEXT) == (
        "invalid_signature"
    )


def test_signature_covers_every_field_and_the_network() -> None:
    profile = profile_of(nickname="Alice")
    for change in ({"nickname": "Mallory"}, {"public_discovery": False}, {"extra": 1}):
        tampered = AccountProfile.from_wire({**profile.to_wire(), **change})
        assert code_of(verify_profile, tampered, ALICE.device(0).certificate, TEST_CONTEXT) == (
            "invalid_signature"
        )
    # Same network magic, another registry: the signature is bound to the whole context.
    other_network = NetworkContext("neo:860833102:0x" + "2" * 40)
    assert code_of(verify_profile, profile, ALICE.device(0).certificate, other_network) == (
        "invalid_signature"
    )


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"$type": "meshline.profile.v2"}, "wrong type"),
        ({"public_discovery": "true"}, "discovery must be a boolean"),
        ({"public_discovery": None}, "null"),
        ({"updated_at": -1}, "negative time"),
        ({"updated_at": "1"}, "time as text"),
        ({"nickname": " \u3000\t"}, "whitespace-only nickname"),
        ({"nickname": "x" * 257}, "nickname over 256 bytes"),
        ({"nickname": "é" * 129}, "nickname over 256 UTF-8 bytes"),
        ({"bio": "\u2028"}, "whitespace-only bio"),
        ({"bio": "b" * 2049}, "bio over 2 KiB"),
        ({"device_signature": "AA"}, "short signature"),
        ({"avatar": {**AVATAR.to_wire(), "content_type": "text/plain"}}, "avatar not an image"),
        ({"avatar": {"uri": "http://x", "hash": "sha256:x"}}, "avatar malformed"),
        ({"future": None}, "null in an unknown field"),
        ({"$context": "neo:0:0x" + "0" * 40}, "wire $context"),
    ],
)
def test_field_rules_are_bad_request(changes: dict[str, Any], why: str) -> None:
    assert code_of(AccountProfile.from_wire, wire(**changes)) == "bad_request", why


def test_missing_required_fields_are_bad_request() -> None:
    for name in ("account", "public_discovery", "updated_at", "device_signature", "$type"):
        obj = wire()
        del obj[name]
        assert code_of(AccountProfile.from_wire, obj) == "bad_request", name


def test_empty_texts_and_limits_exactly_are_allowed() -> None:
    profile = AccountProfile.from_wire(wire(nickname="", bio=""))
    assert profile.nickname == "" and profile.bio == ""
    AccountProfile.from_wire(wire(nickname="é" * 128, bio="b" * 2048))


def test_json_number_forms_are_refused() -> None:
    text = canonical_json(wire()).decode()
    for bad in (f'"updated_at":{NOW}.0', '"updated_at":-0', f'"updated_at":{NOW}e0'):
        with pytest.raises(BadRequest):
            AccountProfile.from_json(text.replace(f'"updated_at":{NOW}', bad))


def test_size_limit_is_8_kib_of_canonical_json() -> None:
    base = len(canonical_json(wire(pad="")))
    fits = wire(pad="p" * (PROFILE_MAX_BYTES - base))
    assert len(canonical_json(fits)) == PROFILE_MAX_BYTES
    AccountProfile.from_wire(fits)
    over = wire(pad="p" * (PROFILE_MAX_BYTES - base + 1))
    assert code_of(AccountProfile.from_wire, over) == "request_too_large"
    # Oversize wins over every other fault: nothing else is looked at.
    assert (
        code_of(AccountProfile.from_wire, {**over, "$type": "meshline.profile.other"})
        == "request_too_large"
    )
    with pytest.raises(MeshlineError) as info:
        sign_profile(
            ALICE.device(0).keys,
            ALICE.account,
            TEST_CONTEXT,
            public_discovery=True,
            extensions={"pad": "p" * PROFILE_MAX_BYTES},
        )
    assert info.value.code == "request_too_large"


def test_publish_for_another_account_is_forbidden() -> None:
    assert code_of(publish, profile_of(BOB), signer=BOB.device(0).certificate) == "forbidden"


def test_publish_checks_the_session_device_signed_it() -> None:
    forged = profile_of(BOB)  # Bob's device signing a profile that names Alice
    as_alice = AccountProfile.from_wire({**forged.to_wire(), "account": ALICE.account})
    assert code_of(publish, as_alice) == "invalid_signature"
    assert code_of(publish, profile_of(device=1)) == "invalid_signature"  # session is device 0


def test_publish_clock_skew() -> None:
    publish(profile_of(updated_at=NOW + SKEW))
    assert code_of(publish, profile_of(updated_at=NOW + SKEW + 1)) == "clock_skew"
    assert code_of(publish, profile_of(updated_at=NOW + 10 * 365 * 86400)) == "clock_skew"


def test_publish_recency() -> None:
    profile = profile_of(updated_at=NOW - 10)
    publish(profile, current_updated_at=NOW - 11)
    publish(profile, current_updated_at=NOW - 10)  # equal: the later acceptance replaces
    assert code_of(publish, profile, current_updated_at=NOW - 9) == "stale_state"


def test_publish_by_a_device_outside_its_window() -> None:
    late = ALICE.add_device(not_before=NOW + 3600)
    profile = sign_profile(
        late.keys, ALICE.account, TEST_CONTEXT, public_discovery=True, updated_at=NOW
    )
    assert code_of(publish, profile, signer=late.certificate) == "device_unknown"


def test_resolved_profile_checks() -> None:
    profile = profile_of(nickname="Alice")
    result = ResolvedProfile(profile, ALICE.device(0).certificate)
    parsed = ResolvedProfile.from_wire(result.to_wire())
    assert verify_resolved_profile(parsed, account=ALICE.account, context=TEST_CONTEXT) == profile
    # asked for Bob, got Alice's
    assert code_of(verify_resolved_profile, parsed, account=BOB.account, context=TEST_CONTEXT) == (
        "invalid_signature"
    )
    # a certificate whose account signature was tampered with
    cert = copy.deepcopy(ALICE.device(0).certificate.to_wire())
    cert["not_before"] -= 1
    bad = ResolvedProfile.from_wire({"profile": profile.to_wire(), "signer_certificate": cert})
    assert code_of(verify_resolved_profile, bad, account=ALICE.account, context=TEST_CONTEXT) == (
        "invalid_signature"
    )
    # the certificate of another account's device
    bob_cert = ResolvedProfile(profile, BOB.device(0).certificate)
    assert code_of(
        verify_resolved_profile, bob_cert, account=ALICE.account, context=TEST_CONTEXT
    ) == ("invalid_signature")


texts = st.text(
    alphabet=st.characters(codec="utf-8", categories=("L", "N", "P", "S", "Zs")), max_size=40
).filter(lambda t: not t or t.strip() != "")


@given(nickname=texts, bio=texts, discovery=st.booleans(), extra=st.integers(0, 2**53 - 1))
def test_property_round_trip_and_verify(
    nickname: str, bio: str, discovery: bool, extra: int
) -> None:
    from gapline.meshline._content import is_whitespace_only

    if (nickname and is_whitespace_only(nickname)) or (bio and is_whitespace_only(bio)):
        return
    profile = profile_of(
        nickname=nickname, bio=bio, public_discovery=discovery, extensions={"n": extra}
    )
    again = AccountProfile.from_json(profile.to_json())
    assert again == profile and again.public_discovery is discovery
    verify_profile(again, ALICE.device(0).certificate, TEST_CONTEXT)
    flipped = AccountProfile.from_wire({**profile.to_wire(), "public_discovery": not discovery})
    with pytest.raises(MeshlineError):
        verify_profile(flipped, ALICE.device(0).certificate, TEST_CONTEXT)
