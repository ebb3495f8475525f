"""Two `gapline relay serve` processes on one PostgreSQL database agree on profiles, routes
and contact authorization: what one accepted, the other answers and checks against, and
concurrent publications through both are decided as if they had come one after the other.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from gapline.meshline import AccountRoute, issue_grant, sign_profile, sign_route
from gapline.meshline.testing import TestAccount, make_account, make_send_params
from gapline.relay.devserver import RelayProcess
from tests.relay.harness import RelayUnderTest, remote

pytestmark = pytest.mark.postgres


def _draft(r: RelayUnderTest, account: TestAccount, revision: int, lifetime: int = 3600):
    now = r.clock()
    return sign_route(
        account.key,
        r.context,
        relay_id=r.relay_id,
        revision=revision,
        updated_at=now,
        expires_at=now + lifetime,
    ).to_wire()


def _profile(r: RelayUnderTest, account: TestAccount, updated_at: int, nickname: str):
    dev = account.device()
    return sign_profile(
        dev.keys,
        account.account,
        r.context,
        public_discovery=False,
        updated_at=updated_at,
        nickname=nickname,
    ).to_wire()


async def test_two_processes_agree_on_routes_profiles_and_grants(
    two_relays: tuple[RelayProcess, RelayProcess],
) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        ra, rb = (remote(p, http) for p in two_relays)
        assert ra.relay_id == rb.relay_id  # one key, kept in the database
        alice, bob, carol = make_account(), make_account(), make_account()
        await ra.publish(alice, public=False)
        await rb.publish(bob, public=False)
        await rb.publish(carol, public=False)
        # A route accepted by A is what B resolves, and B knows its revision.
        final = await ra.ok(
            "account.route.publish", _draft(ra, alice, 10), token=await ra.account_login(alice)
        )
        assert await rb.ok("account.route.resolve", {"account": alice.account}) == final
        on_b = await rb.account_login(alice)
        assert await rb.error("account.route.publish", _draft(rb, alice, 10, 60), token=on_b) == (
            409,
            "state_conflict",
        )
        assert await rb.error("account.route.publish", _draft(rb, alice, 9), token=on_b) == (
            400,
            "stale_state",
        )
        newer = await rb.ok("account.route.publish", _draft(rb, alice, 11), token=on_b)
        assert await ra.ok("account.route.resolve", {"account": alice.account}) == newer
        # A profile accepted by B is what A answers, and A refuses an older one.
        now = ra.clock()
        alice_b = await rb.login(alice)
        published = _profile(rb, alice, now, "from B")
        assert (await rb.call("profile.publish", published, token=alice_b)).status_code == 204
        alice_a = await ra.login(alice)
        answer = await ra.ok("profile.resolve", {"account": alice.account}, token=alice_a)
        assert answer["profile"] == published
        older = _profile(ra, alice, now - 1, "older")
        assert await ra.error("profile.publish", older, token=alice_a) == (400, "stale_state")
        # Alice is not public; her grant to bob, checked by A, against her state from A.
        dev = alice.device()
        grant = issue_grant(
            dev.keys, dev.device_id, ra.context, grantor=alice.account, grantee=bob.account
        )
        for relay, sender, code in ((ra, bob, None), (rb, carol, "forbidden")):
            wire = make_send_params(sender, alice, sender_boxes=False).to_wire()
            wire["authorization"] = grant.to_wire()
            token = await relay.login(sender)
            if code is None:
                assert (await relay.ok("message.send", wire, token=token))["status"] == (
                    "target_accepted"
                )
            else:
                assert await relay.error("message.send", wire, token=token) == (403, code)


async def test_concurrent_publications_through_both_processes(
    two_relays: tuple[RelayProcess, RelayProcess],
) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        ra, rb = (remote(p, http) for p in two_relays)
        for round_ in range(5):
            alice = make_account()
            await ra.publish(alice, public=False)
            tokens = [await ra.account_login(alice), await rb.account_login(alice)]
            drafts = [_draft(ra, alice, 100, 3600), _draft(rb, alice, 100, 1800)]
            answers = await asyncio.gather(
                *(
                    relay.call("account.route.publish", draft, token=token)
                    for relay, draft, token in zip((ra, rb), drafts, tokens, strict=True)
                )
            )
            statuses = sorted(a.status_code for a in answers)
            assert statuses == [200, 409], [a.text for a in answers]
            winner = next(a.json() for a in answers if a.status_code == 200)
            for relay in (ra, rb):
                resolved = await relay.ok("account.route.resolve", {"account": alice.account})
                assert resolved == winner
                assert AccountRoute.from_wire(resolved).revision == 100
            # Two profiles at once: whatever the order, the later updated_at is what stays.
            now = ra.clock()
            devices = [await ra.login(alice), await rb.login(alice)]
            profiles = [
                _profile(ra, alice, now - round_ - 1, "earlier"),
                _profile(rb, alice, now, "later"),
            ]
            await asyncio.gather(
                *(
                    relay.call("profile.publish", profile, token=token)
                    for relay, profile, token in zip((ra, rb), profiles, devices, strict=True)
                )
            )
            for relay, token in zip((ra, rb), devices, strict=True):
                stored = await relay.ok("profile.resolve", {"account": alice.account}, token=token)
                assert stored["profile"]["nickname"] == "later"
