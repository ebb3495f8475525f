"""AccountRoute: signing, the publish checks, co-signing, verification, history and selection."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gapline.meshline import (
    HTTP_STATUS_BY_CODE,
    ROUTE_MAX_BYTES,
    ROUTE_MAX_LIFETIME,
    AccountKey,
    AccountRoute,
    MeshlineError,
    NetworkContext,
    RelayDescriptor,
    ResolutionStatus,
    RouteHistory,
    RouteOrder,
    accept_route_publication,
    canonical_json,
    check_cosigned,
    compare_routes,
    cosign_route,
    resolve_records,
    route_dht_key,
    route_from_record,
    route_record,
    route_usable_state,
    select_route,
    sign_relay_descriptor,
    sign_route,
    verify_relay_descriptor,
    verify_resolved_route,
    verify_route,
    verify_route_draft,
)
from gapline.meshline.testing import TEST_CONTEXT, make_account

NOW = int(time.time())
SKEW = 300
ALICE = make_account()
BOB = make_account()
RELAY = AccountKey.generate()
OTHER_RELAY = AccountKey.generate()


def draft(
    revision: int = 1000,
    *,
    relay: AccountKey = RELAY,
    account: Any = ALICE,
    updated_at: int = NOW,
    lifetime: int = 86400,
    **extensions: Any,
) -> AccountRoute:
    return sign_route(
        account.key,
        TEST_CONTEXT,
        relay_id=relay.relay_id(),
        revision=revision,
        updated_at=updated_at,
        expires_at=updated_at + lifetime,
        extensions=extensions,
    )


def publish(route: AccountRoute, **kw: Any) -> Any:
    kw.setdefault("session_account", ALICE.account)
    kw.setdefault("relay_key", RELAY)
    kw.setdefault("history", RouteHistory())
    kw.setdefault("device_state", ALICE.state)
    return accept_route_publication(route, context=TEST_CONTEXT, now=NOW, max_skew=SKEW, **kw)


def code_of(fn: Any, *args: Any, **kw: Any) -> str:
    with pytest.raises(MeshlineError) as info:
        fn(*args, **kw)
    assert info.value.code in HTTP_STATUS_BY_CODE
    return info.value.code


def final(revision: int = 1000, **kw: Any) -> AccountRoute:
    return publish(draft(revision, **kw)).route


def verify(route: AccountRoute, key: bytes = RELAY.public_key, now: int = NOW) -> None:
    verify_route(route, TEST_CONTEXT, relay_public_key=key, now=now, max_skew=SKEW)


# --- objects and signatures ------------------------------------------------------------


def test_draft_then_cosigned_round_trip() -> None:
    route = draft(note="kept")
    assert route.relay_signature is None and route.extensions == {"note": "kept"}
    verify_route_draft(route, TEST_CONTEXT, now=NOW, max_skew=SKEW)
    done = publish(route)
    assert done.route.relay_signature is not None
    check_cosigned(route, done.route)
    verify(done.route)
    assert AccountRoute.from_json(done.route.to_json()) == done.route
    assert done.history == RouteHistory(1000, route.content_digest(TEST_CONTEXT), False)
    # The relay's signature covers the account's exactly as received.
    assert done.route.draft() == route


def test_republishing_the_same_route_returns_the_same_document() -> None:
    first = publish(draft())
    again = publish(draft(), history=first.history)
    assert again.route == first.route and again.history == first.history  # RFC 6979


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"$type": "meshline.route"}, "type"),
        ({"relay_id": "0x" + "A" * 40}, "relay id not lowercase"),
        ({"relay_id": "0x1234"}, "relay id short"),
        ({"revision": -1}, "negative revision"),
        ({"revision": 2**53}, "unsafe revision"),
        ({"updated_at": "1"}, "time as text"),
        ({"account_public_key": "AAAA"}, "short key"),
        ({"relay_signature": None}, "null"),
        ({"extra": [None]}, "null in an extension"),
    ],
)
def test_field_rules_are_bad_request(changes: dict[str, Any], why: str) -> None:
    assert code_of(AccountRoute.from_wire, {**draft().to_wire(), **changes}) == "bad_request", why


def test_window_rules() -> None:
    assert code_of(verify_route_draft, draft(lifetime=0), TEST_CONTEXT, now=NOW, max_skew=SKEW) == (
        "bad_request"
    )
    ten_years = draft(lifetime=ROUTE_MAX_LIFETIME)
    verify_route_draft(ten_years, TEST_CONTEXT, now=NOW, max_skew=SKEW)
    over = draft(lifetime=ROUTE_MAX_LIFETIME + 1)
    assert code_of(verify_route_draft, over, TEST_CONTEXT, now=NOW, max_skew=SKEW) == "bad_request"
    expired = draft(updated_at=NOW - 100, lifetime=100)
    assert code_of(publish, expired) == "bad_request"


def test_size_limit_counts_the_final_document() -> None:
    base = len(canonical_json(draft(pad="").to_wire()))
    sig_room = len(canonical_json(final(pad="").to_wire())) - base
    assert sig_room == len(',"relay_signature":""') + 86
    # A draft that fits only without the relay signature is refused at publication.
    near = draft(pad="p" * (ROUTE_MAX_BYTES - base - sig_room + 1))
    assert len(near.to_json()) <= ROUTE_MAX_BYTES
    assert code_of(publish, near) == "request_too_large"
    exact = draft(pad="p" * (ROUTE_MAX_BYTES - base - sig_room))
    assert len(publish(exact).route.to_json()) == ROUTE_MAX_BYTES
    over = {**draft().to_wire(), "pad": "p" * ROUTE_MAX_BYTES}
    assert code_of(AccountRoute.from_wire, over) == "request_too_large"


# --- the publish checks ----------------------------------------------------------------


def test_another_accounts_route_is_forbidden() -> None:
    assert code_of(publish, draft(account=BOB)) == "forbidden"


def test_a_route_naming_another_relay_is_refused() -> None:
    assert code_of(publish, draft(relay=OTHER_RELAY)) == "bad_request"


def test_a_cosigned_route_cannot_be_published_again() -> None:
    assert code_of(publish, final()) == "bad_request"


def test_wrong_account_signature() -> None:
    good = draft().to_wire()
    other = draft(revision=1001).to_wire()
    forged = AccountRoute.from_wire({**good, "account_signature": other["account_signature"]})
    assert code_of(publish, forged) == "invalid_signature"
    # Bob's key cannot sign for Alice's account.
    bobs = AccountRoute.from_wire({**draft(account=BOB).to_wire(), "account": ALICE.account})
    assert code_of(publish, bobs) == "invalid_signature"


def test_the_network_is_part_of_the_signature() -> None:
    other_network = NetworkContext("neo:860833102:0x" + "3" * 40)
    with pytest.raises(MeshlineError) as info:
        verify_route_draft(draft(), other_network, now=NOW, max_skew=SKEW)
    assert info.value.code == "invalid_signature"


def test_clock_skew_changes_nothing() -> None:
    future = draft(revision=5000, updated_at=NOW + SKEW + 1)
    history = RouteHistory(1000, draft().content_digest(TEST_CONTEXT))
    assert code_of(publish, future, history=history) == "clock_skew"
    publish(draft(updated_at=NOW + SKEW))  # at the tolerance: accepted
    far = draft(updated_at=NOW + 20 * 365 * 86400)
    assert code_of(publish, far) == "clock_skew"


def test_usable_device_state_is_required() -> None:
    assert code_of(publish, draft(), device_state=None) == "state_conflict"
    assert code_of(publish, draft(), device_state=BOB.state) == "state_conflict"
    publish(draft(), staged_until=NOW + 60)
    assert code_of(publish, draft(), staged_until=NOW) == "state_conflict"
    assert route_usable_state(ALICE.account, ALICE.state, staged_until=None, now=NOW)
    assert not route_usable_state(ALICE.account, ALICE.state, staged_until=NOW - 1, now=NOW)


def test_revisions_and_same_revision_conflicts() -> None:
    first = publish(draft(1000))
    assert code_of(publish, draft(999), history=first.history) == "stale_state"
    assert code_of(publish, draft(1000, lifetime=7200), history=first.history) == "state_conflict"
    higher = publish(draft(1001), history=first.history)
    assert higher.history.revision == 1001
    conflicted = RouteHistory(2000, "sha256:x", conflict=True)
    assert code_of(publish, draft(2000), history=conflicted) == "state_conflict"
    assert code_of(publish, draft(1999), history=conflicted) == "stale_state"
    assert publish(draft(2001), history=conflicted).history == RouteHistory(
        2001, draft(2001).content_digest(TEST_CONTEXT), False
    )


# --- final routes, as clients and DHT nodes check them --------------------------------------


def test_verify_final_route() -> None:
    route = final()
    verify(route)
    assert code_of(verify, route, OTHER_RELAY.public_key) == "invalid_signature"
    assert code_of(verify, route.draft()) == "bad_request"  # a draft is not a final route
    assert code_of(verify, route, now=route.expires_at) == "bad_request"  # expired when used
    tampered = AccountRoute.from_wire({**route.to_wire(), "relay_signature": "A" * 86})
    assert code_of(verify, tampered) == "invalid_signature"
    # Another relay co-signing a route that names ours.
    stolen = cosign_route(route.draft(), OTHER_RELAY, TEST_CONTEXT)
    assert code_of(verify, stolen) == "invalid_signature"
    assert code_of(verify, stolen, OTHER_RELAY.public_key) == "invalid_signature"


def test_a_client_checks_a_resolved_route() -> None:
    def check(
        route: AccountRoute, known: AccountRoute | None, account: str = ALICE.account
    ) -> None:
        verify_resolved_route(
            route,
            account=account,
            known=known,
            relay_public_key=RELAY.public_key,
            context=TEST_CONTEXT,
            now=NOW,
            max_skew=SKEW,
        )

    a, b = final(1000), final(1001)
    check(b, a)
    check(b, b)
    assert code_of(check, a, b) == "stale_state"
    assert code_of(check, final(1001, lifetime=60), b) == "invalid_state"
    assert code_of(check, a, None, BOB.account) == "invalid_signature"  # asked for Bob
    future = publish(draft(1002)).route
    assert (
        code_of(
            verify_resolved_route,
            future,
            account=ALICE.account,
            known=None,
            relay_public_key=RELAY.public_key,
            context=TEST_CONTEXT,
            now=NOW - SKEW - 1,
            max_skew=SKEW,
        )
        == "clock_skew"
    )


def test_check_cosigned_sees_any_change() -> None:
    mine = draft()
    assert check_cosigned(mine, final()) is None
    other = final(lifetime=7200)
    assert code_of(check_cosigned, mine, other) == "invalid_signature"
    assert code_of(check_cosigned, mine, mine) == "invalid_signature"  # nothing appended


def test_compare_routes() -> None:
    a, b = final(1000), final(1001)
    assert compare_routes(a, b) is RouteOrder.OLDER
    assert compare_routes(b, a) is RouteOrder.NEWER
    assert compare_routes(a, publish(draft(1000)).route) is RouteOrder.SAME
    assert compare_routes(a, final(1000, lifetime=60)) is RouteOrder.CONFLICT
    with pytest.raises(MeshlineError):
        compare_routes(a, publish_bob())  # routes of different accounts


def publish_bob() -> AccountRoute:
    return publish(draft(account=BOB), session_account=BOB.account, device_state=BOB.state).route


def test_selection() -> None:
    a, b = final(1000), final(1001)
    found = select_route([a, b], RouteHistory(), context=TEST_CONTEXT, now=NOW)
    assert found.status is ResolutionStatus.FOUND and found.route == b
    assert found.history.revision == 1001
    assert found.result() == b
    # Only an older route is left once the newest is known: never reinstated.
    gone = select_route([a], found.history, context=TEST_CONTEXT, now=NOW)
    assert gone.status is ResolutionStatus.NOT_FOUND and gone.history == found.history
    assert code_of(gone.result) == "not_found"
    # The newest expired: no usable route, and the history stays.
    short = final(1002, lifetime=10)
    later = select_route([a, short], found.history, context=TEST_CONTEXT, now=NOW + 10)
    assert later.status is ResolutionStatus.NOT_FOUND and later.history.revision == 1001


def test_conflict_suspends_until_a_higher_revision() -> None:
    a, twin = final(1000), final(1000, lifetime=7200)
    clash = select_route([a, twin], RouteHistory(), context=TEST_CONTEXT, now=NOW)
    assert clash.status is ResolutionStatus.CONFLICT and clash.history.conflict
    assert code_of(clash.result) == "invalid_state"
    # Seeing only one of them later does not resolve it.
    again = select_route([a], clash.history, context=TEST_CONTEXT, now=NOW)
    assert again.status is ResolutionStatus.CONFLICT
    resolved = select_route([a, final(1001)], clash.history, context=TEST_CONTEXT, now=NOW)
    assert resolved.status is ResolutionStatus.FOUND and not resolved.history.conflict


def test_dht_records() -> None:
    route = final()
    key, value = route_record(route, TEST_CONTEXT)
    assert key == route_dht_key(ALICE.account, TEST_CONTEXT) and len(key) == 32
    assert route_from_record(key, value, TEST_CONTEXT) == route
    bobs_key = route_dht_key(BOB.account, TEST_CONTEXT)
    assert code_of(route_from_record, bobs_key, value, TEST_CONTEXT) == "bad_request"
    assert code_of(route_record, route.draft(), TEST_CONTEXT) == "bad_request"
    keys = {RELAY.relay_id(): RELAY.public_key}
    newer = final(1001)
    values = [
        value,
        route_record(newer, TEST_CONTEXT)[1],
        b"not json",
        route_record(cosign_route(draft(1002), OTHER_RELAY, TEST_CONTEXT), TEST_CONTEXT)[1],
        route_record(publish_bob(), TEST_CONTEXT)[1],  # filed under Alice's key
    ]
    resolution = resolve_records(
        values,
        key=key,
        history=RouteHistory(),
        relay_key=keys.get,
        context=TEST_CONTEXT,
        now=NOW,
        max_skew=SKEW,
    )
    assert resolution.route == newer and resolution.history.revision == 1001


def test_relay_descriptor() -> None:
    descriptor = sign_relay_descriptor(
        RELAY, TEST_CONTEXT, endpoints=["https://relay.example/meshline/v1"], expires_at=NOW + 60
    )
    parsed = RelayDescriptor.from_wire(descriptor.to_wire())
    assert verify_relay_descriptor(parsed, TEST_CONTEXT, relay_id=RELAY.relay_id(), now=NOW) == (
        RELAY.public_key
    )
    for relay_id, now, code in (
        (OTHER_RELAY.relay_id(), NOW, "invalid_signature"),
        (RELAY.relay_id(), NOW + 60, "bad_request"),
    ):
        with pytest.raises(MeshlineError) as info:
            verify_relay_descriptor(parsed, TEST_CONTEXT, relay_id=relay_id, now=now)
        assert info.value.code == code
    # A key that does not derive the relay ID it claims.
    wire = {**descriptor.to_wire(), "public_key": OTHER_RELAY.public_key_b64}
    with pytest.raises(MeshlineError) as info:
        verify_relay_descriptor(
            RelayDescriptor.from_wire(wire), TEST_CONTEXT, relay_id=RELAY.relay_id(), now=NOW
        )
    assert info.value.code == "invalid_signature"
    with pytest.raises(MeshlineError):
        RelayDescriptor.from_wire({**descriptor.to_wire(), "endpoints": []})


# --- properties --------------------------------------------------------------------------

ROUTES = [final(r, lifetime=life) for r, life in itertools.product((10, 11, 12), (3600, 7200))]


@settings(max_examples=60, deadline=None)
@given(
    picks=st.lists(st.sampled_from(range(len(ROUTES))), max_size=6),
    start=st.sampled_from(
        [RouteHistory(), RouteHistory(11, ROUTES[2].content_digest(TEST_CONTEXT))]
    ),
)
def test_property_selection(picks: list[int], start: RouteHistory) -> None:
    candidates = [ROUTES[i] for i in picks]
    result = select_route(candidates, start, context=TEST_CONTEXT, now=NOW)
    # The history never goes back, and a route below it is never returned.
    assert result.history.revision >= start.revision
    if result.route is not None:
        assert result.route.revision == result.history.revision
        assert result.status is ResolutionStatus.FOUND
    # The arrival order of the candidates does not matter.
    flipped = select_route(list(reversed(candidates)), start, context=TEST_CONTEXT, now=NOW)
    assert flipped.status is result.status and flipped.history == result.history
    if result.route is not None:
        assert flipped.route is not None
        assert compare_routes(flipped.route, result.route) is RouteOrder.SAME
    # Two contents at the highest revision seen are a conflict, never a pick.
    top = [r for r in candidates if r.revision == result.history.revision]
    if len({canonical_json(r.content()) for r in top}) > 1:
        assert result.status is ResolutionStatus.CONFLICT
