"""Contact authorization at the relay: ``message.send`` with and without a ``ContactGrant`` or
``ContactInvite`` (receiving rule 4), and the three forms of ``device.state.resolve`` (own
state, public query, signed query), through the real HTTP and WebSocket transports.

``ContactsContract`` is not collected itself; ``test_sqlite.py`` and ``test_postgres.py``
subclass it with a ``relay_dsn`` fixture. A refused send appends nothing: every test
checks the recipient's timeline holds exactly the sends that were accepted.
"""

from __future__ import annotations

from typing import Any

import pytest

from gapline.meshline import (
    ContactGrant,
    ContactInvite,
    issue_grant,
    issue_invite,
    sign_state_query,
)
from gapline.meshline.testing import TestAccount, make_account, make_send_params
from tests.relay.channels import TRANSPORTS, Channel, Channels
from tests.relay.harness import Clock, RelayUnderTest, start_relay

SKEW = 300  # the relay's default --clock-skew


def _grant(grantor: TestAccount, grantee: TestAccount, device: int = 0, **kw: Any) -> ContactGrant:
    dev = grantor.device(device)
    return issue_grant(
        dev.keys,
        dev.device_id,
        grantor.context,
        grantor=grantor.account,
        grantee=grantee.account,
        **kw,
    )


def _invite(inviter: TestAccount, expires_at: int, device: int = 0) -> ContactInvite:
    dev = inviter.device(device)
    return issue_invite(
        dev.keys, dev.device_id, inviter.context, inviter=inviter.account, expires_at=expires_at
    )


def _send(
    r: RelayUnderTest, sender: TestAccount, to: TestAccount, authorization: Any = None, **kw: Any
) -> dict[str, Any]:
    wire = make_send_params(sender, to, created_at=r.clock(), sender_boxes=False, **kw).to_wire()
    if authorization is not None:
        wire["authorization"] = (
            authorization.to_wire()
            if isinstance(authorization, ContactGrant | ContactInvite)
            else authorization
        )
    return wire


async def _received(ch: Channel) -> list[str]:
    page = await ch.ok("message.timeline.sync", {})
    return [item["envelope"]["message_id"] for item in page["items"]]


def _query(r: RelayUnderTest, asker: TestAccount, target: TestAccount, material: Any, **kw: Any):
    dev = asker.device()
    kw.setdefault("created_at", r.clock())
    return sign_state_query(
        dev.keys, dev.certificate, r.context, account=target.account, authorization=material, **kw
    ).to_wire()


class ContactsContract:
    @pytest.mark.parametrize("transport", TRANSPORTS)
    async def test_a_non_public_account_needs_a_valid_grant(
        self, relay_dsn: str, transport: str
    ) -> None:
        clock = Clock()
        async with start_relay(relay_dsn, clock=clock) as r, Channels(r, transport) as ch:
            alice, bob, carol = make_account(2), make_account(), make_account()
            for who in (alice, bob, carol):
                await r.publish(who, public=False)
            b, c = await ch.device(bob), await ch.device(carol)
            accepted: list[str] = []

            async def sends(channel: Channel, wire: dict[str, Any]) -> None:
                result = await channel.ok("message.send", wire)
                assert result["status"] == "target_accepted"
                accepted.append(wire["envelope"]["message_id"])

            # No profile at all, then a profile without public discovery: refused.
            assert await b.code("message.send", _send(r, bob, alice)) == "forbidden"
            await r.publish_profile(alice, public_discovery=False)
            assert await b.code("message.send", _send(r, bob, alice)) == "forbidden"
            grant = _grant(alice, bob)
            await sends(b, _send(r, bob, alice, grant))
            # Replayed by another sender (the grant names bob): refused.
            assert await c.code("message.send", _send(r, carol, alice, grant)) == "forbidden"
            # Expired.
            lapsing = _grant(alice, bob, expires_at=clock() + 10)
            await sends(b, _send(r, bob, alice, lapsing))
            clock.advance(10)
            assert await b.code("message.send", _send(r, bob, alice, lapsing)) == "forbidden"
            # Wrongly signed: a body changed after signing, a signature by another key.
            changed = ContactGrant(grant.grantor, grant.grantee, grant.signatures, clock() + 99)
            assert await b.code("message.send", _send(r, bob, alice, changed)) == (
                "invalid_signature"
            )
            device_id = alice.device().device_id
            foreign = _grant(carol, bob).signatures[carol.device().device_id]
            wrong_key = ContactGrant(alice.account, bob.account, {device_id: foreign})
            assert await b.code("message.send", _send(r, bob, alice, wrong_key)) == (
                "invalid_signature"
            )
            # Issued by another account than the recipient.
            assert await b.code("message.send", _send(r, bob, alice, _grant(carol, bob))) == (
                "forbidden"
            )
            # Revoked: its only signing device leaves alice's state.
            by_device_1 = _grant(alice, bob, device=1)
            await sends(b, _send(r, bob, alice, by_device_1))
            await r.publish(
                alice, alice.new_state([alice.device(0)], revision=alice.state.revision + 1)
            )
            assert await b.code("message.send", _send(r, bob, alice, by_device_1)) == "forbidden"
            await sends(b, _send(r, bob, alice, grant))  # a grant by device 0 still works
            a = await ch.device(alice)
            assert await _received(a) == accepted

    @pytest.mark.parametrize("transport", TRANSPORTS)
    async def test_invitations_public_discovery_and_no_fallback(
        self, relay_dsn: str, transport: str
    ) -> None:
        async with start_relay(relay_dsn) as r, Channels(r, transport) as ch:
            alice, bob, carol = make_account(), make_account(), make_account()
            for who in (alice, bob, carol):
                await r.publish(who, public=False)
            await r.publish_profile(alice, public_discovery=False)
            b, c = await ch.device(bob), await ch.device(carol)
            accepted = []
            invite = _invite(alice, r.clock() + 600)
            for channel, sender in ((b, bob), (c, carol)):  # no usage count
                wire = _send(r, sender, alice, invite)
                assert (await channel.ok("message.send", wire))["status"] == "target_accepted"
                accepted.append(wire["envelope"]["message_id"])
            lapsed = _invite(alice, r.clock() - 1)
            assert await b.code("message.send", _send(r, bob, alice, lapsed)) == "forbidden"
            forged = ContactInvite(
                invite.inviter,
                invite.signer_device_id,
                invite.expires_at + 1,
                invite.device_signature,
            )
            assert await b.code("message.send", _send(r, bob, alice, forged)) == "invalid_signature"
            carols = _invite(carol, r.clock() + 600)
            assert await b.code("message.send", _send(r, bob, alice, carols)) == "forbidden"
            # Public discovery on: a send without material is accepted; invalid material is
            # still refused, never taken as a public send.
            await r.publish_profile(alice, public_discovery=True)
            wire = _send(r, bob, alice)
            assert (await b.ok("message.send", wire))["status"] == "target_accepted"
            accepted.append(wire["envelope"]["message_id"])
            assert await b.code("message.send", _send(r, bob, alice, lapsed)) == "forbidden"
            assert await b.code("message.send", _send(r, bob, alice, forged)) == "invalid_signature"
            # And off again: the published profile decides, read at every send.
            await r.publish_profile(alice, public_discovery=False, updated_at=r.clock() + 1)
            assert await b.code("message.send", _send(r, bob, alice)) == "forbidden"
            assert await _received(await ch.device(alice)) == accepted

    @pytest.mark.parametrize("transport", TRANSPORTS)
    async def test_malformed_material_is_a_bad_request(
        self, relay_dsn: str, transport: str
    ) -> None:
        async with start_relay(relay_dsn) as r, Channels(r, transport) as ch:
            alice, bob = make_account(), make_account()
            await r.publish(alice)  # public: a malformed grant must not pass as public
            await r.publish(bob)
            b = await ch.device(bob)
            grant = _grant(alice, bob).to_wire()
            for material in (
                {"$type": "meshline.friend.invite", "inviter": alice.account},
                {**grant, "signatures": {}},
                {**grant, "expires_at": None},
                {**grant, "grantee": 7},
                "a grant",
            ):
                assert await b.code("message.send", _send(r, bob, alice, material)) == (
                    "bad_request"
                )
            wire = _send(r, bob, alice)
            wire["authorization"] = None
            assert await b.code("message.send", wire) == "bad_request"
            # Self-delivery carries no authorization.
            self_grant = _grant(bob, bob)
            assert await b.code("message.send", _send(r, bob, bob, self_grant)) == "bad_request"
            assert await _received(await ch.device(alice)) == []
            assert await _received(b) == []

    async def test_a_retry_keeps_its_result_after_the_grant_lapses(self, relay_dsn: str) -> None:
        clock = Clock()
        async with start_relay(relay_dsn, clock=clock) as r, Channels(r, "http") as ch:
            alice, bob = make_account(), make_account()
            await r.publish(alice, public=False)
            await r.publish(bob, public=False)
            b = await ch.device(bob)
            wire = _send(r, bob, alice, _grant(alice, bob, expires_at=clock() + 5))
            first = await b.ok("message.send", wire)
            clock.advance(5)
            assert await b.ok("message.send", wire) == first  # idempotent, nothing appended
            assert len(await _received(await ch.device(alice))) == 1

    # --- device.state.resolve -----------------------------------------------------------

    @pytest.mark.parametrize("transport", TRANSPORTS)
    async def test_public_and_own_state_reads(self, relay_dsn: str, transport: str) -> None:
        async with start_relay(relay_dsn) as r, Channels(r, transport) as ch:
            alice, bob = make_account(), make_account()
            await r.publish(alice, public=False)
            await r.publish(bob, public=False)
            b, alice_account = await ch.device(bob), await ch.account(alice)
            params = {"account": alice.account}
            assert await b.code("device.state.resolve", params) == "forbidden"  # no profile
            await r.publish_profile(alice, public_discovery=False)
            assert await b.code("device.state.resolve", params) == "forbidden"
            await r.publish_profile(alice, public_discovery=True, updated_at=r.clock() + 1)
            assert await b.ok("device.state.resolve", params) == alice.state.to_wire()
            assert await alice_account.ok("device.state.resolve", params) == alice.state.to_wire()
            bobs = {"account": bob.account}
            assert await alice_account.code("device.state.resolve", bobs) == "forbidden"
            unknown = {"account": make_account().account}
            assert await b.code("device.state.resolve", unknown) == "not_found"
            assert await (await ch.anonymous()).code("device.state.resolve", params) == (
                "unauthorized"
            )

    @pytest.mark.parametrize("transport", TRANSPORTS)
    async def test_signed_queries(self, relay_dsn: str, transport: str) -> None:
        async with start_relay(relay_dsn) as r, Channels(r, transport) as ch:
            alice, bob, carol = make_account(), make_account(2), make_account()
            for who in (alice, bob, carol):
                await r.publish(who, public=False)
            b = await ch.device(bob)
            state = alice.state.to_wire()
            grant, invite = _grant(alice, bob), _invite(alice, r.clock() + 600)
            assert await b.ok("device.state.resolve", _query(r, bob, alice, grant)) == state
            assert await b.ok("device.state.resolve", _query(r, bob, alice, invite)) == state

            async def refused(params: dict[str, Any]) -> str:
                return await b.code("device.state.resolve", params)

            assert await refused(_query(r, bob, alice, _grant(alice, carol))) == "forbidden"
            assert (
                await refused(_query(r, bob, alice, _invite(alice, r.clock() - 1))) == "forbidden"
            )
            forged = ContactInvite(
                invite.inviter,
                invite.signer_device_id,
                invite.expires_at + 1,
                invite.device_signature,
            )
            assert await refused(_query(r, bob, alice, forged)) == "invalid_signature"
            assert (
                await refused(_query(r, bob, alice, _invite(carol, r.clock() + 60))) == "forbidden"
            )
            late = _query(r, bob, alice, grant, created_at=r.clock() + SKEW + 30)
            early = _query(r, bob, alice, grant, created_at=r.clock() - SKEW - 30)
            assert await refused(late) == "clock_skew"
            assert await refused(early) == "clock_skew"
            tampered = {**_query(r, bob, alice, grant), "created_at": r.clock() - 1}
            assert await refused(tampered) == "invalid_signature"
            # The certificate of another of bob's devices than the calling one.
            other = bob.device(1)
            not_mine = sign_state_query(
                other.keys,
                other.certificate,
                r.context,
                account=alice.account,
                authorization=grant,
                created_at=r.clock(),
            ).to_wire()
            assert await refused(not_mine) == "forbidden"
            assert await refused(_query(r, bob, bob, _invite(bob, r.clock() + 60))) == "forbidden"
            complete = _query(r, bob, alice, grant)
            for field in ("authorization", "signer_certificate", "created_at", "device_signature"):
                partial = {k: v for k, v in complete.items() if k != field}
                assert await refused(partial) == "bad_request"
            assert await refused({"account": alice.account, "authorization": grant.to_wire()}) == (
                "bad_request"
            )
            unknown = make_account()
            assert await refused(_query(r, bob, unknown, _grant(unknown, bob))) == "not_found"
            as_account = await ch.account(bob)
            assert await as_account.code("device.state.resolve", complete) == "forbidden"
