"""``profile.publish``/``profile.resolve`` and ``account.route.publish``/``.resolve``, rule by
rule and code by code, through the relay's real HTTP and WebSocket transports.

``ProfilesRoutesContract`` is not collected itself (no ``Test`` prefix); ``test_sqlite.py``
and ``test_postgres.py`` subclass it with a ``relay_dsn`` fixture. Every refusal is also
checked to have stored nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from gapline.meshline import (
    AccountRoute,
    MeshlineError,
    ResolvedProfile,
    check_cosigned,
    cosign_route,
    route_dht_key,
    route_record,
    sign_profile,
    sign_route,
    verify_resolved_profile,
    verify_route,
)
from gapline.meshline.testing import TestAccount, make_account
from tests.relay.channels import TRANSPORTS, Channels
from tests.relay.harness import Clock, RelayUnderTest, start_relay

SKEW = 300  # the relay's default --clock-skew


def _draft(
    r: RelayUnderTest,
    account: TestAccount,
    *,
    revision: int,
    lifetime: int = 3600,
    updated_at: int | None = None,
    relay_id: str | None = None,
    extensions: dict[str, Any] | None = None,
) -> AccountRoute:
    now = r.clock() if updated_at is None else updated_at
    return sign_route(
        account.key,
        r.context,
        relay_id=relay_id or r.relay_id,
        revision=revision,
        updated_at=now,
        expires_at=now + lifetime,
        extensions=extensions,
    )


def _profile(account: TestAccount, device: int = 0, **fields: Any) -> dict[str, Any]:
    fields.setdefault("public_discovery", False)
    dev = account.device(device)
    return sign_profile(dev.keys, account.account, account.context, **fields).to_wire()


class ProfilesRoutesContract:
    # --- profiles ---------------------------------------------------------------------

    @pytest.mark.parametrize("transport", TRANSPORTS)
    async def test_profile_publish_and_resolve(self, relay_dsn: str, transport: str) -> None:
        async with start_relay(relay_dsn) as r, Channels(r, transport) as ch:
            alice, bob = make_account(), make_account()
            await r.publish(alice, public=False)
            await r.publish(bob, public=False)
            a, b = await ch.device(alice), await ch.device(bob)
            profile = _profile(alice, nickname="Alice", bio="hello", updated_at=r.clock())
            assert await a.ok("profile.publish", profile) is None  # HTTP 204, JSON-RPC null
            result = await b.ok("profile.resolve", {"account": alice.account})
            resolved = ResolvedProfile.from_wire(result)
            assert resolved.profile.to_wire() == profile
            assert resolved.signer_certificate == alice.device().certificate
            verify_resolved_profile(resolved, account=alice.account, context=r.context)
            assert await b.code("profile.resolve", {"account": make_account().account}) == (
                "not_found"
            )
            for bad in ({}, {"account": ""}, {"account": "neo:1:nope"}):
                assert await b.code("profile.resolve", bad) == "bad_request"
            anonymous, account = await ch.anonymous(), await ch.account(alice)
            assert await anonymous.code("profile.resolve", {"account": alice.account}) == (
                "unauthorized"
            )
            assert await anonymous.code("profile.publish", profile) == "unauthorized"
            assert await account.code("profile.resolve", {"account": alice.account}) == (
                "forbidden"
            )
            assert await account.code("profile.publish", profile) == "forbidden"

    @pytest.mark.parametrize("transport", TRANSPORTS)
    async def test_profile_recency_and_clock(self, relay_dsn: str, transport: str) -> None:
        async with start_relay(relay_dsn) as r, Channels(r, transport) as ch:
            alice = make_account(2)
            await r.publish(alice, public=False)
            a = await ch.device(alice)
            now = r.clock()
            first = _profile(alice, nickname="one", updated_at=now - 10)
            await a.ok("profile.publish", first)
            older = _profile(alice, nickname="older", updated_at=now - 11)
            assert await a.code("profile.publish", older) == "stale_state"
            future = _profile(alice, nickname="future", updated_at=now + SKEW + 5)
            assert await a.code("profile.publish", future) == "clock_skew"
            assert (await a.ok("profile.resolve", {"account": alice.account}))["profile"] == first
            # Equal updated_at: the later accepted one replaces the earlier.
            same_time = _profile(alice, nickname="two", updated_at=now - 10)
            await a.ok("profile.publish", same_time)
            assert (await a.ok("profile.resolve", {"account": alice.account}))[
                "profile"
            ] == same_time
            within = _profile(alice, nickname="soon", updated_at=now + SKEW - 5)
            await a.ok("profile.publish", within)
            assert (await a.ok("profile.resolve", {"account": alice.account}))["profile"] == within

    @pytest.mark.parametrize("transport", TRANSPORTS)
    async def test_profile_bad_input_stores_nothing(self, relay_dsn: str, transport: str) -> None:
        async with start_relay(relay_dsn) as r, Channels(r, transport) as ch:
            alice, bob = make_account(2), make_account()
            await r.publish(alice, public=False)
            await r.publish(bob, public=False)
            a = await ch.device(alice)
            good = _profile(alice, updated_at=r.clock())
            oversized = {**good, "pad": "p" * 8200}  # the size is checked first
            assert await a.code("profile.publish", oversized) == "request_too_large"
            forged = {**good, "nickname": "changed after signing"}
            assert await a.code("profile.publish", forged) == "invalid_signature"
            by_other_device = _profile(alice, device=1)  # not the session's device
            assert await a.code("profile.publish", by_other_device) == "invalid_signature"
            assert await a.code("profile.publish", _profile(bob)) == "forbidden"
            for broken in (
                {**good, "nickname": None},
                {**good, "public_discovery": "yes"},
                {**good, "updated_at": -1},
                {**good, "$type": "meshline.profile.v2"},
                {k: v for k, v in good.items() if k != "device_signature"},
            ):
                assert await a.code("profile.publish", broken) == "bad_request"
            assert await a.code("profile.resolve", {"account": alice.account}) == "not_found"

    async def test_profile_keeps_its_signer_after_the_device_leaves(self, relay_dsn: str) -> None:
        async with start_relay(relay_dsn) as r, Channels(r, "http") as ch:
            alice, bob = make_account(2), make_account()
            await r.publish(alice, public=False)
            await r.publish(bob, public=False)
            profile = _profile(alice, device=1, public_discovery=True)
            await (await ch.device(alice, alice.device(1))).ok("profile.publish", profile)
            await r.publish(
                alice, alice.new_state([alice.device(0)], revision=alice.state.revision + 1)
            )
            result = await (await ch.device(bob)).ok("profile.resolve", {"account": alice.account})
            assert result["profile"] == profile
            assert result["signer_certificate"] == alice.device(1).certificate.to_wire()

    # --- routes -----------------------------------------------------------------------

    @pytest.mark.parametrize("transport", TRANSPORTS)
    async def test_route_publish_cosigns_and_resolve_answers(
        self, relay_dsn: str, transport: str
    ) -> None:
        async with start_relay(relay_dsn) as r, Channels(r, transport) as ch:
            alice = make_account()
            await r.publish(alice)
            account, anonymous = await ch.account(alice), await ch.anonymous()
            draft = _draft(r, alice, revision=1000)
            final = AccountRoute.from_wire(
                await account.ok("account.route.publish", draft.to_wire())
            )
            check_cosigned(draft, final)
            relay_key = r.server.relay.key.public_key
            verify_route(final, r.context, relay_public_key=relay_key, now=r.clock(), max_skew=SKEW)
            assert await anonymous.ok("account.route.resolve", {"account": alice.account}) == (
                final.to_wire()
            )
            # Publishing the same route again returns the same final document.
            assert await account.ok("account.route.publish", draft.to_wire()) == final.to_wire()
            newer = _draft(r, alice, revision=1001)
            await account.ok("account.route.publish", newer.to_wire())
            resolved = await anonymous.ok("account.route.resolve", {"account": alice.account})
            assert AccountRoute.from_wire(resolved).draft() == newer
            assert await anonymous.code(
                "account.route.resolve", {"account": make_account().account}
            ) == ("not_found")
            for bad in ({}, {"account": ""}, {"account": "neo:860833102:nope"}):
                assert await anonymous.code("account.route.resolve", bad) == "bad_request"

    @pytest.mark.parametrize("transport", TRANSPORTS)
    async def test_route_revisions_conflicts_and_sessions(
        self, relay_dsn: str, transport: str
    ) -> None:
        async with start_relay(relay_dsn) as r, Channels(r, transport) as ch:
            alice = make_account()
            await r.publish(alice)
            account = await ch.account(alice)
            first = _draft(r, alice, revision=50)
            final = await account.ok("account.route.publish", first.to_wire())
            other_content = _draft(r, alice, revision=50, lifetime=60)
            assert await account.code("account.route.publish", other_content.to_wire()) == (
                "state_conflict"
            )
            lower = _draft(r, alice, revision=49)
            assert await account.code("account.route.publish", lower.to_wire()) == "stale_state"
            device, anonymous = await ch.device(alice), await ch.anonymous()
            higher = _draft(r, alice, revision=51).to_wire()
            assert await device.code("account.route.publish", higher) == "forbidden"
            assert await anonymous.code("account.route.publish", higher) == "unauthorized"
            bob = make_account()
            await r.publish(bob)
            bobs = _draft(r, bob, revision=60).to_wire()
            assert await account.code("account.route.publish", bobs) == "forbidden"
            assert await anonymous.ok("account.route.resolve", {"account": alice.account}) == final

    @pytest.mark.parametrize("transport", TRANSPORTS)
    async def test_route_bad_input_stores_nothing(self, relay_dsn: str, transport: str) -> None:
        async with start_relay(relay_dsn) as r, Channels(r, transport) as ch:
            alice, stateless = make_account(), make_account()
            await r.publish(alice)
            account = await ch.account(alice)
            now = r.clock()

            async def refused(draft: Any) -> str:
                wire = draft.to_wire() if isinstance(draft, AccountRoute) else draft
                return await account.code("account.route.publish", wire)

            elsewhere = _draft(r, alice, revision=900, relay_id="0x" + "ab" * 20)
            assert await refused(elsewhere) == "bad_request"
            future = _draft(r, alice, revision=900, updated_at=now + SKEW + 60)
            assert await refused(future) == "clock_skew"
            expired = _draft(r, alice, revision=900, updated_at=now - 100, lifetime=50)
            assert await refused(expired) == "bad_request"
            too_long = _draft(r, alice, revision=900, lifetime=3651 * 86400)
            assert await refused(too_long) == "bad_request"
            oversized = {**_draft(r, alice, revision=900).to_wire(), "pad": "x" * 4100}
            assert await refused(oversized) == "request_too_large"
            # A draft within 4 KiB whose co-signed document is not.
            base = len(_draft(r, alice, revision=900, extensions={"pad": ""}).to_json())
            near = _draft(r, alice, revision=900, extensions={"pad": "x" * (4096 - base - 40)})
            assert len(near.to_json()) <= 4096
            assert await refused(near) == "request_too_large"
            signed_by_other = {
                **_draft(r, alice, revision=900).to_wire(),
                "account_signature": _draft(r, stateless, revision=900).account_signature,
            }
            assert await refused(signed_by_other) == "invalid_signature"
            with_relay_signature = {
                **_draft(r, alice, revision=900).to_wire(),
                "relay_signature": _draft(r, alice, revision=901).account_signature,
            }
            assert await refused(with_relay_signature) == "bad_request"
            for broken in (
                {**_draft(r, alice, revision=900).to_wire(), "revision": -1},
                {**_draft(r, alice, revision=900).to_wire(), "relay_id": r.relay_id.upper()},
                {**_draft(r, alice, revision=900).to_wire(), "note": None},
            ):
                assert await refused(broken) == "bad_request"
            # An account without device state here: no usable state.
            other = await ch.account(stateless)
            code = await other.code(
                "account.route.publish", _draft(r, stateless, revision=5).to_wire()
            )
            assert code == "state_conflict"
            anonymous = await ch.anonymous()
            for who in (alice, stateless):
                assert await anonymous.code("account.route.resolve", {"account": who.account}) == (
                    "not_found"
                )
            # None of the refused revisions raised the persisted highest one.
            await account.ok("account.route.publish", _draft(r, alice, revision=10).to_wire())

    async def test_route_expiry_never_reinstates_an_older_route(self, relay_dsn: str) -> None:
        clock = Clock()
        async with start_relay(relay_dsn, clock=clock) as r, Channels(r, "http") as ch:
            alice = make_account()
            await r.publish(alice)
            account, anonymous = await ch.account(alice), await ch.anonymous()
            await account.ok(
                "account.route.publish", _draft(r, alice, revision=1, lifetime=9000).to_wire()
            )
            await account.ok(
                "account.route.publish", _draft(r, alice, revision=2, lifetime=100).to_wire()
            )
            clock.advance(101)
            assert await anonymous.code("account.route.resolve", {"account": alice.account}) == (
                "not_found"
            )
            await r.server.cleanup_once()
            old = _draft(r, alice, revision=1, lifetime=9000)
            assert await account.code("account.route.publish", old.to_wire()) == "stale_state"
        async with start_relay(relay_dsn, clock=clock) as r, Channels(r, "http") as ch:
            account = await ch.account(alice)
            old = _draft(r, alice, revision=2, lifetime=9000)  # other content at revision 2
            assert await account.code("account.route.publish", old.to_wire()) == "state_conflict"
            await account.ok("account.route.publish", _draft(r, alice, revision=3).to_wire())

    async def test_a_same_revision_conflict_suspends_the_route(self, relay_dsn: str) -> None:
        """Two contents at one revision reach the replica (as a peer's PUT_VALUE would bring
        them): resolution answers invalid_state until a higher revision is published."""
        async with start_relay(relay_dsn) as r, Channels(r, "http") as ch:
            alice = make_account()
            await r.publish(alice)
            account, anonymous = await ch.account(alice), await ch.anonymous()
            await account.ok("account.route.publish", _draft(r, alice, revision=7).to_wire())
            relay = r.server.relay
            rival = _draft(r, alice, revision=7, lifetime=60)
            final = cosign_route(rival, relay.key, r.context)
            await relay.routes.replica.put(*route_record(final, r.context))
            assert await anonymous.code("account.route.resolve", {"account": alice.account}) == (
                "invalid_state"
            )
            again = _draft(r, alice, revision=7).to_wire()
            assert await account.code("account.route.publish", again) == "state_conflict"
            # A record filed under another account's key is refused by the replica.
            key = route_dht_key(make_account().account, r.context)
            with pytest.raises(MeshlineError) as info:
                await relay.routes.replica.put(key, final.to_json())
            assert info.value.code == "bad_request"
            newer = _draft(r, alice, revision=8)
            await account.ok("account.route.publish", newer.to_wire())
            resolved = await anonymous.ok("account.route.resolve", {"account": alice.account})
            assert AccountRoute.from_wire(resolved).draft() == newer
