"""Units of the abuse limits: bounded parsing, who pays for a call, challenge quotas."""

from __future__ import annotations

import json
from typing import Any

import pytest
from multidict import MultiDict

from gapline.relay import RelayConfig
from gapline.relay._bounds import (
    MAX_ITEMS,
    address_key,
    parse_params,
    query_params,
    session_token,
)
from gapline.relay._errors import RelayFailure
from gapline.relay._ratelimit import Admission, ChallengeQuota, RateLimiter

FIELDS = {"after": "int", "limit": "int", "account": "str"}


def _query(**fields: str) -> MultiDict[str]:
    return MultiDict(fields)


@pytest.mark.parametrize(
    ("text", "value"),
    [("0", 0), ("-1", -1), ("9007199254740991", 2**53 - 1), ("-9007199254740991", 1 - 2**53)],
)
def test_query_integers_in_range_convert(text: str, value: int) -> None:
    assert query_params(_query(after=text), FIELDS) == {"after": value}


@pytest.mark.parametrize(
    "text",
    ["9007199254740992", "9" * 17, "9" * 4301, "1" * 4096, "01", "-0", "+1", "1.0", "١٢", " 1", ""],
)
def test_query_integers_out_of_form_or_range_are_bad_request(text: str) -> None:
    with pytest.raises(RelayFailure) as info:
        query_params(_query(limit=text), FIELDS)
    assert info.value.code == "bad_request"


def test_query_strings_and_field_counts_are_bounded() -> None:
    with pytest.raises(RelayFailure):
        query_params(_query(account="a" * 5000), FIELDS)
    many = MultiDict((f"k{i}", "1") for i in range(65))
    with pytest.raises(RelayFailure):
        query_params(many, FIELDS)
    with pytest.raises(RelayFailure):
        query_params(MultiDict([("after", "1"), ("after", "2")]), FIELDS)
    assert query_params(_query(colour="blue"), FIELDS) == {}


def test_bodies_bound_items_but_not_ordinary_requests() -> None:
    assert parse_params(json.dumps({"boxes": [{"a": 1}] * 8}).encode()) == {"boxes": [{"a": 1}] * 8}
    assert parse_params(json.dumps({"x": [0] * MAX_ITEMS})) == {"x": [0] * MAX_ITEMS}
    for value in ({"x": [0] * (MAX_ITEMS + 1)}, {f"k{i}": 0 for i in range(MAX_ITEMS + 1)}):
        with pytest.raises(RelayFailure) as info:
            parse_params(json.dumps(value).encode())
        assert info.value.code == "bad_request"
    # Commas inside strings only make the check run; they never refuse.
    assert parse_params(json.dumps({"s": "," * 5000}))["s"] == "," * 5000
    for raw in (b"[" * 5000 + b"]" * 5000, b'{"a":' + b"9" * 5000 + b"}", b'{"a":1.5}'):
        with pytest.raises(RelayFailure):
            parse_params(raw)


def test_session_tokens_are_checked_before_hashing() -> None:
    assert session_token("abc") == "abc"
    assert session_token("x" * 256) == "x" * 256
    for bad in (None, "", "x" * 257, "has space", "tab\t", "é"):
        assert session_token(bad) is None


def test_address_keys_group_ipv6_by_64() -> None:
    assert address_key("192.0.2.7") == "192.0.2.7"
    assert address_key("2001:db8::1") == address_key("2001:db8::ffff:1") == "2001:db8::/64"
    assert address_key("2001:db8:0:1::1") != address_key("2001:db8::1")
    assert address_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert address_key(None) == "?"


def test_admission_charges_verified_and_unverified_calls_apart() -> None:
    now = [0.0]
    gate = Admission(
        session=(1.0, 2),
        account=(1.0, 3),
        address=(1.0, 2),
        unauthenticated=(1.0, 3),
        clock=lambda: now[0],
    )
    assert [gate.charge_unverified("a") for _ in range(3)] == [0, 0, 1]
    # The refused third call took nothing from the shared bucket: one call is left there.
    assert gate.charge_unverified("b") == 0 and gate.charge_unverified("c") == 1
    # Verified calls: session first, then account (two sessions of one account share it).
    assert [gate.charge_verified("s1", "acct") for _ in range(3)] == [0, 0, 1]
    assert gate.charge_verified("s2", "acct") == 0 and gate.charge_verified("s2", "acct") == 1
    now[0] += 10
    assert gate.charge_unverified("a") == 0 and gate.charge_verified("s1", "acct") == 0


def test_challenge_quota_counts_outstanding_nonces() -> None:
    now = [100]
    quota = ChallengeQuota(per_address=3, per_account=2, clock=lambda: now[0])
    quota.issued("n1", "addr", "acct", 200)
    quota.issued("n2", "addr", "acct", 201)
    assert quota.check("addr", "acct") == 100  # until n1 expires
    assert quota.check("addr", "other") == 0
    quota.issued("n3", "addr", "other", 250)
    assert quota.check("addr", "third") == 100  # the address is full
    assert quota.check("elsewhere", 5) == 0  # a non-string account is the method's to refuse
    quota.consumed("n1")
    quota.consumed("n1")
    quota.consumed(["not", "a", "nonce"])
    assert quota.check("addr", "acct") == 0 and len(quota) == 2
    now[0] = 251
    assert quota.check("addr", "acct") == 0 and len(quota) == 0


def test_challenge_quota_memory_stays_bounded_when_nonces_are_used() -> None:
    quota = ChallengeQuota(per_address=10, per_account=10, clock=lambda: 0)
    quota.issued("keep", "a", "x", 10**9)  # one that never expires in this test
    for i in range(50_000):
        quota.issued(f"n{i}", "a", "y", 10**9)
        quota.consumed(f"n{i}")
    assert len(quota._order) < 5000 and len(quota) == 1


def test_config_refuses_nonpositive_limits() -> None:
    for name in ("header_timeout", "max_connections", "challenges_per_account", "ws_heartbeat"):
        settings: dict[str, Any] = {name: 0}
        with pytest.raises(ValueError, match=name):
            RelayConfig(dsn="x", retention=1, **settings)


def test_refusals_are_held_only_for_callers_that_ignore_retry_after() -> None:
    now = [0.0]
    gate = Admission(
        session=(1.0, 1),
        account=(1.0, 1),
        address=(1.0, 1),
        unauthenticated=(1.0, 1),
        clock=lambda: now[0],
    )
    rate, burst = Admission.REFUSALS
    assert [gate.hold("flooder", 5) for _ in range(burst)] == [0.0] * burst
    assert gate.hold("flooder", 5) == Admission.TARPIT_SECONDS
    assert gate.hold("flooder", 1) == 1.0  # never longer than the wait it announces
    assert gate.hold("patient", 5) == 0.0  # per caller
    now[0] += burst / rate
    assert gate.hold("flooder", 5) == 0.0  # and forgiven once it slows down


def test_a_debit_goes_into_bounded_debt() -> None:
    now = [0.0]
    limiter = RateLimiter(rate=1.0, burst=4, clock=lambda: now[0])
    limiter.debit("k", 100)
    assert limiter.take("k") == 5  # from -4 back to 1 token at 1/s
    now[0] += 5
    assert limiter.take("k") == 0
