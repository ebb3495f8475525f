"""The account message timeline page, rule by rule, through the relay's real HTTP transport
(and WebSocket for notifications): a contract every backend passes.

``TimelineContract`` is not collected itself (no ``Test`` prefix); ``test_sqlite.py`` and
``test_postgres.py`` subclass it with a ``relay_dsn`` fixture.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from gapline.meshline.testing import TestAccount, make_account, make_send_params
from gapline.relay import TimelineStore
from tests.relay.harness import Clock, RelayUnderTest, WsClient, start_relay


async def _send(
    r: RelayUnderTest, token: str, sender: TestAccount, to: TestAccount, **kw: Any
) -> dict[str, Any]:
    params = make_send_params(sender, to, created_at=r.clock(), **kw)
    return await r.ok("message.send", params.to_wire(), token=token)


async def _sync(
    r: RelayUnderTest, token: str, after: int = -1, limit: int | None = None
) -> dict[str, Any]:
    params: dict[str, Any] = {"after": after}
    if limit is not None:
        params["limit"] = limit
    return await r.ok("message.timeline.sync", params, token=token)


async def _pair(
    r: RelayUnderTest, alice_devices: int = 1, bob_devices: int = 1
) -> tuple[TestAccount, TestAccount, str, str]:
    alice, bob = make_account(alice_devices), make_account(bob_devices)
    await r.publish(alice)
    await r.publish(bob)
    return alice, bob, await r.login(alice), await r.login(bob)


def _seqs(page: dict[str, Any]) -> list[int]:
    return [item["sequence"] for item in page["items"]]


def _reversed_members(value: Any) -> Any:
    """The same JSON value with every object's members in reverse order."""
    if isinstance(value, dict):
        return {k: _reversed_members(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_members(v) for v in value]
    return value


class TimelineContract:
    """Every timeline rule; each backend module subclasses this with a ``relay_dsn`` fixture."""

    async def test_sequences_are_nonnegative_and_strictly_increasing(self, relay_dsn: str) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob, ta, tb = await _pair(r)
            for _ in range(5):
                await _send(r, ta, alice, bob, sender_boxes=False)
            seqs = _seqs(await _sync(r, tb))
            assert len(seqs) == 5
            assert seqs[0] >= 0
            assert all(a < b for a, b in itertools.pairwise(seqs))

    async def test_head_is_never_reduced_by_cleanup_or_restart(self, relay_dsn: str) -> None:
        clock = Clock()
        async with start_relay(relay_dsn, clock=clock, retention=100) as r:
            alice, bob, ta, tb = await _pair(r)
            for _ in range(3):
                await _send(r, ta, alice, bob, sender_boxes=False)
            last = _seqs(await _sync(r, tb))[-1]
            clock.advance(101)
            await r.server.cleanup_once()
            page = await _sync(r, tb, after=last)  # `after` = head stays valid after cleanup
            assert page["items"] == [] and page["has_more"] is False
        async with start_relay(relay_dsn, clock=clock, retention=100) as r:
            tb = await r.login(bob)
            ta = await r.login(alice)
            assert (await _sync(r, tb, after=last))["items"] == []  # head survived the restart
            await _send(r, ta, alice, bob, sender_boxes=False)
            assert _seqs(await _sync(r, tb, after=last)) == [last + 1]

    async def test_inbound_envelope_occupies_one_sequence_for_all_devices(
        self, relay_dsn: str
    ) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob, ta, tb0 = await _pair(r, bob_devices=2)
            tb1 = await r.login(bob, bob.device(1))
            await _send(r, ta, alice, bob, sender_boxes=False)
            p0, p1 = await _sync(r, tb0), await _sync(r, tb1)
            assert _seqs(p0) == _seqs(p1) == [0]
            assert p0["items"][0]["key_box"]["device_id"] == bob.device(0).device_id
            assert p1["items"][0]["key_box"]["device_id"] == bob.device(1).device_id
            assert p0["items"][0]["envelope"] == p1["items"][0]["envelope"]
            assert [c["signing_public_key"] for c in p0["certificates"]] == [
                alice.device().certificate.signing_public_key
            ]

    async def test_device_revoked_before_send_never_reads_it_even_when_reenabled(
        self,
        relay_dsn: str,
    ) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob, ta, tb0 = await _pair(r, bob_devices=2)
            await r.publish(bob, bob.new_state([bob.device(0)], revision=bob.state.revision + 1))
            await _send(r, ta, alice, bob, sender_boxes=False)  # boxes for both devices
            assert _seqs(await _sync(r, tb0)) == [0]
            await r.publish(bob, bob.new_state(list(bob.devices), revision=bob.state.revision + 2))
            tb1 = await r.login(bob, bob.device(1))
            page = await _sync(r, tb1)
            assert page["items"] == [] and page["has_more"] is False
            assert not page.get("has_retention_gap", False)

    async def test_device_revoked_after_send_keeps_visibility_when_reenabled(
        self, relay_dsn: str
    ) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob, ta, _tb0 = await _pair(r, bob_devices=2)
            tb1 = await r.login(bob, bob.device(1))
            await _send(r, ta, alice, bob, sender_boxes=False)
            await r.publish(bob, bob.new_state([bob.device(0)], revision=bob.state.revision + 1))
            status, code = await r.error("message.timeline.sync", {}, token=tb1)
            assert (status, code) == (401, "unauthorized")  # its session died with the removal
            await r.publish(bob, bob.new_state(list(bob.devices), revision=bob.state.revision + 2))
            tb1 = await r.login(bob, bob.device(1))
            assert _seqs(await _sync(r, tb1)) == [0]

    async def test_unknown_and_not_yet_effective_devices_cannot_read(self, relay_dsn: str) -> None:
        clock = Clock()
        async with start_relay(relay_dsn, clock=clock) as r:
            alice, bob, ta, _tb = await _pair(r)
            stranger = bob.add_device()  # never in bob's state: unknown
            later = bob.add_device(not_before=clock() + 1000)  # in state, not yet effective
            await r.publish(
                bob, bob.new_state([bob.device(0), later], revision=bob.state.revision + 1)
            )
            await _send(
                r,
                ta,
                alice,
                bob,
                sender_boxes=False,
                recipient_devices=[bob.device(0), stranger, later],
            )
            clock.advance(1001)
            t_later = await r.login(bob, later)
            page = await _sync(r, t_later)
            assert page["items"] == [] and not page.get("has_retention_gap", False)

    async def test_expired_device_cannot_read_what_arrived_while_expired(
        self, relay_dsn: str
    ) -> None:
        from gapline.meshline import issue_certificate
        from gapline.meshline.testing import TestDevice

        clock = Clock()
        async with start_relay(relay_dsn, clock=clock) as r:
            alice = make_account(1)
            bob = make_account(1)
            short = bob.add_device(not_before=clock() - 10, lifetime=100)
            await r.publish(alice)
            await r.publish(bob, bob.new_state([bob.device(0), short], revision=bob.state.revision))
            ta = await r.login(alice)
            clock.advance(200)  # `short` has expired
            await _send(
                r, ta, alice, bob, sender_boxes=False, recipient_devices=[bob.device(0), short]
            )
            renewed_cert = issue_certificate(
                bob.key, short.keys, bob.context, not_before=clock() - 10, expires_at=clock() + 1000
            )
            renewed = TestDevice(short.keys, renewed_cert, renewed_cert.device_id(bob.context))
            assert renewed.device_id == short.device_id
            await r.publish(
                bob, bob.new_state([bob.device(0), renewed], revision=bob.state.revision + 1)
            )
            page = await _sync(r, await r.login(bob, renewed))
            assert page["items"] == []

    async def test_send_with_no_valid_target_device_fails_and_appends_nothing(
        self, relay_dsn: str
    ) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob, ta, _tb = await _pair(r, bob_devices=2)
            params = make_send_params(
                alice, bob, created_at=r.clock(), recipient_devices=[bob.device(1)]
            )
            await r.publish(bob, bob.new_state([bob.device(0)], revision=bob.state.revision + 1))
            assert await r.error("message.send", params.to_wire(), token=ta) == (
                400,
                "device_unknown",
            )
            tb0 = await r.login(bob)
            assert await r.error("message.timeline.sync", {"after": 0}, token=tb0) == (
                400,
                "bad_request",
            )
            assert (await _sync(r, tb0))["items"] == []
            # Alice's sent record was not appended either, and no result was kept.
            assert await r.error("message.timeline.sync", {"after": 0}, token=ta) == (
                400,
                "bad_request",
            )
            status = await r.error(
                "message.delivery.status", {"message_id": params.envelope.message_id}, token=ta
            )
            assert status == (404, "not_found")

    async def test_sent_record_visible_only_to_boxed_valid_sender_devices(
        self, relay_dsn: str
    ) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob, ta0, _tb = await _pair(r, alice_devices=2)
            ta1 = await r.login(alice, alice.device(1))
            await _send(r, ta0, alice, bob, sender_devices=[alice.device(0)])
            mine = await _sync(r, ta0)
            assert _seqs(mine) == [0]
            assert mine["items"][0]["key_box"]["device_id"] == alice.device(0).device_id
            assert mine["items"][0]["envelope"]["to"] == bob.account
            assert (await _sync(r, ta1))["items"] == []

    async def test_no_sender_boxes_means_no_sent_record(self, relay_dsn: str) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob, ta, _tb = await _pair(r)
            await _send(r, ta, alice, bob, sender_boxes=False)
            assert await r.error("message.timeline.sync", {"after": 0}, token=ta) == (
                400,
                "bad_request",
            )

    async def test_an_account_unknown_at_one_send_is_served_once_it_publishes(
        self, relay_dsn: str
    ) -> None:
        # The relay remembers that it holds no state for an account (single writer): the
        # account's first publish must end that at once.
        async with start_relay(relay_dsn) as r:
            alice, bob = make_account(), make_account()
            await r.publish(alice)
            ta = await r.login(alice)
            first = make_send_params(alice, bob, created_at=r.clock(), sender_boxes=False)
            assert await r.error("message.send", first.to_wire(), token=ta) == (
                400,
                "device_unknown",
            )
            await r.publish(bob, public=False)
            # Now held here: receiving rule 4 applies (no grant, no public discovery).
            second = make_send_params(alice, bob, created_at=r.clock(), sender_boxes=False)
            assert (await r.error("message.send", second.to_wire(), token=ta))[1] == "forbidden"
            await r.publish_profile(bob, public_discovery=True)
            await _send(r, ta, alice, bob, sender_boxes=False)
            page = await _sync(r, await r.login(bob))
            assert len(page["items"]) == 1

    async def test_sender_boxes_all_unavailable_is_device_unknown(self, relay_dsn: str) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob, ta, tb = await _pair(r)
            ghost = alice.add_device()
            params = make_send_params(alice, bob, created_at=r.clock(), sender_devices=[ghost])
            assert await r.error("message.send", params.to_wire(), token=ta) == (
                400,
                "device_unknown",
            )
            assert (await _sync(r, tb))["items"] == []

    async def test_self_delivery_is_one_record_and_refuses_sender_boxes(
        self, relay_dsn: str
    ) -> None:
        async with start_relay(relay_dsn) as r:
            alice = make_account(2)
            await r.publish(alice)
            ta = await r.login(alice)
            result = await _send(r, ta, alice, alice)
            assert result["status"] == "target_accepted"
            assert _seqs(await _sync(r, ta)) == [0]
            wire = make_send_params(alice, alice, created_at=r.clock()).to_wire()
            wire["sender_boxes"] = wire["recipient_boxes"]
            assert await r.error("message.send", wire, token=ta) == (400, "bad_request")

    async def test_retention_is_fixed_at_acceptance(self, relay_dsn: str) -> None:
        clock = Clock()
        async with start_relay(relay_dsn, clock=clock, retention=100) as r:
            alice, bob, ta, _tb = await _pair(r)
            await _send(r, ta, alice, bob, sender_boxes=False)
        async with start_relay(relay_dsn, clock=clock, retention=10) as r:
            assert (await r.ok("relay.info"))["limits"]["message_retention"] == 10
            tb = await r.login(bob)
            clock.advance(50)
            await r.server.cleanup_once()
            page = await _sync(r, tb)
            assert _seqs(page) == [0] and not page.get("has_retention_gap", False)
            clock.advance(51)
            tb = await r.login(bob)
            page = await _sync(r, tb)
            assert page["items"] == [] and page["has_retention_gap"] is True

    async def test_retention_gap_true_before_and_after_cleanup(self, relay_dsn: str) -> None:
        clock = Clock()
        async with start_relay(relay_dsn, clock=clock, retention=100) as r:
            alice, bob, ta, _tb = await _pair(r)
            await _send(r, ta, alice, bob, sender_boxes=False)
            clock.advance(60)
            await _send(r, ta, alice, bob, sender_boxes=False)
            clock.advance(50)  # the first record expired, the second not
            tb = await r.login(bob)
            before = await _sync(r, tb)
            assert _seqs(before) == [1] and before["has_retention_gap"] is True
            await r.server.cleanup_once()
            after = await _sync(r, tb)
            assert _seqs(after) == [1] and after["has_retention_gap"] is True
            # Reading past the expired position: no gap.
            past = await _sync(r, tb, after=0)
            assert _seqs(past) == [1] and not past.get("has_retention_gap", False)

    async def test_the_gap_mark_never_falls_when_an_earlier_record_expires_later(
        self, relay_dsn: str
    ) -> None:
        clock = Clock()
        async with start_relay(relay_dsn, clock=clock, retention=100) as r:
            alice, bob, ta, _tb = await _pair(r)
            await _send(r, ta, alice, bob, sender_boxes=False)  # sequence 0, kept 100 s
        async with start_relay(relay_dsn, clock=clock, retention=10) as r:
            ta = await r.login(alice)
            await _send(r, ta, alice, bob, sender_boxes=False)  # sequence 1, kept 10 s
            clock.advance(11)
            await r.server.cleanup_once()  # 1 expires first ...
            clock.advance(90)
            await r.server.cleanup_once()  # ... then 0: the device's mark stays at 1
            tb = await r.login(bob)
            page = await _sync(r, tb, after=0)
            assert page["items"] == [] and page["has_retention_gap"] is True

    async def test_records_not_addressed_to_a_device_never_form_a_gap(self, relay_dsn: str) -> None:
        clock = Clock()
        async with start_relay(relay_dsn, clock=clock, retention=100) as r:
            alice, bob, ta, _tb0 = await _pair(r, bob_devices=2)
            await _send(r, ta, alice, bob, sender_boxes=False, recipient_devices=[bob.device(0)])
            clock.advance(101)
            for cleanup in (False, True):
                if cleanup:
                    await r.server.cleanup_once()
                tb0 = await r.login(bob)
                tb1 = await r.login(bob, bob.device(1))
                assert (await _sync(r, tb0))["has_retention_gap"] is True
                assert not (await _sync(r, tb1)).get("has_retention_gap", False)

    async def test_has_more_pages_and_false_on_empty_page(self, relay_dsn: str) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob, ta, tb = await _pair(r)
            empty = await _sync(r, tb)
            assert empty == {"items": [], "certificates": [], "has_more": False}
            for _ in range(3):
                await _send(r, ta, alice, bob, sender_boxes=False)
            first = await _sync(r, tb, limit=2)
            assert _seqs(first) == [0, 1] and first["has_more"] is True
            second = await _sync(r, tb, after=1, limit=2)
            assert _seqs(second) == [2] and second["has_more"] is False
            last = await _sync(r, tb, after=2, limit=2)
            assert last["items"] == [] and last["has_more"] is False

    async def test_sync_skips_invisible_positions_without_counting_them(
        self, relay_dsn: str
    ) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob, ta, _tb0 = await _pair(r, bob_devices=2)
            tb1 = await r.login(bob, bob.device(1))
            for _ in range(3):
                await _send(
                    r, ta, alice, bob, sender_boxes=False, recipient_devices=[bob.device(0)]
                )
            await _send(r, ta, alice, bob, sender_boxes=False)
            page = await _sync(r, tb1, limit=1)
            assert _seqs(page) == [3] and page["has_more"] is False

    async def test_after_outside_minus_one_to_head_is_bad_request(self, relay_dsn: str) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob, ta, tb = await _pair(r)
            assert await r.error("message.timeline.sync", {"after": 0}, token=tb) == (
                400,
                "bad_request",
            )
            await _send(r, ta, alice, bob, sender_boxes=False)
            assert await r.error("message.timeline.sync", {"after": -2}, token=tb) == (
                400,
                "bad_request",
            )
            assert await r.error("message.timeline.sync", {"after": 1}, token=tb) == (
                400,
                "bad_request",
            )
            assert await r.error("message.timeline.sync", {"limit": 0}, token=tb) == (
                400,
                "bad_request",
            )
            assert (await _sync(r, tb, after=0))["items"] == []

    async def test_retry_with_same_content_returns_first_result_and_appends_nothing(
        self,
        relay_dsn: str,
    ) -> None:
        clock = Clock()
        async with start_relay(relay_dsn, clock=clock) as r:
            alice, bob, ta, tb = await _pair(r)
            async with WsClient.connect(r.ws_url) as ws:
                challenge = await ws.result("auth.challenge", {"account": bob.account})
                await ws.result(
                    "auth.device.verify",
                    r.device_verify_params(bob, bob.device(), challenge["nonce"]),
                )
                params = make_send_params(alice, bob, created_at=clock()).to_wire()
                first = await r.ok("message.send", params, token=ta)
                note = await asyncio.wait_for(ws.notifications.get(), 10)
                assert note["params"] == {"head": 0}
                clock.advance(5)
                again = await r.ok("message.send", params, token=ta)
                assert again == first  # accepted_at unchanged
                # A later, distinct send is the next notification: the retry produced none.
                await _send(r, ta, alice, bob, sender_boxes=False)
                note = await asyncio.wait_for(ws.notifications.get(), 10)
                assert note["params"] == {"head": 1}
            assert _seqs(await _sync(r, tb)) == [0, 1]
            assert _seqs(await _sync(r, ta)) == [0]

    async def test_retry_with_reordered_members_is_the_same_request(self, relay_dsn: str) -> None:
        # Idempotency compares canonical forms, not request texts.
        clock = Clock()
        async with start_relay(relay_dsn, clock=clock) as r:
            alice, bob, ta, tb = await _pair(r)
            params = make_send_params(alice, bob, created_at=clock()).to_wire()
            first = await r.ok("message.send", params, token=ta)
            clock.advance(5)
            again = await r.ok("message.send", _reversed_members(params), token=ta)
            assert again == first
            assert _seqs(await _sync(r, tb)) == [0]
            assert _seqs(await _sync(r, ta)) == [0]

    async def test_retry_with_different_content_is_state_conflict(self, relay_dsn: str) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob, ta, tb = await _pair(r)
            params = make_send_params(alice, bob, created_at=r.clock())
            await r.ok("message.send", params.to_wire(), token=ta)
            other = make_send_params(
                alice,
                bob,
                created_at=r.clock(),
                text="changed",
                message_id=params.envelope.message_id,
            )
            assert await r.error("message.send", other.to_wire(), token=ta) == (
                409,
                "state_conflict",
            )
            dropped = params.to_wire()
            del dropped["sender_boxes"]  # optional-field presence is part of the content
            assert await r.error("message.send", dropped, token=ta) == (409, "state_conflict")
            assert len((await _sync(r, tb))["items"]) == 1

    async def test_delivery_status_found_expired_and_not_found(self, relay_dsn: str) -> None:
        clock = Clock()
        async with start_relay(relay_dsn, clock=clock, retention=100) as r:
            alice, bob, ta, _tb = await _pair(r)
            params = make_send_params(alice, bob, created_at=clock())
            sent = await r.ok("message.send", params.to_wire(), token=ta)
            mid = {"message_id": params.envelope.message_id}
            assert await r.ok("message.delivery.status", mid, token=ta) == sent
            clock.advance(101)
            ta = await r.login(alice)
            assert await r.error("message.delivery.status", mid, token=ta) == (
                400,
                "message_expired",
            )
            await r.server.cleanup_once()
            assert await r.error("message.delivery.status", mid, token=ta) == (404, "not_found")

    async def test_timeline_and_device_state_notifications_on_websocket(
        self, relay_dsn: str
    ) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob, ta, _tb = await _pair(r, bob_devices=2)
            async with WsClient.connect(r.ws_url) as ws:
                challenge = await ws.result("auth.challenge", {"account": bob.account})
                await ws.result(
                    "auth.device.verify",
                    r.device_verify_params(bob, bob.device(), challenge["nonce"]),
                )
                await _send(r, ta, alice, bob)
                note = await asyncio.wait_for(ws.notifications.get(), 10)
                assert note == {
                    "jsonrpc": "2.0",
                    "method": "message.timeline.changed",
                    "params": {"head": 0},
                }
                page = await ws.result("message.timeline.sync", {"after": -1})
                assert [i["sequence"] for i in page["items"]] == [0]
                revision = bob.state.revision + 1
                await r.publish(bob, bob.new_state([bob.device(0)], revision=revision))
                note = await asyncio.wait_for(ws.notifications.get(), 10)
                assert note["method"] == "device.state.changed" and note["params"] == {
                    "revision": revision
                }

    async def test_store_never_lowers_head_row(self, relay_dsn: str) -> None:
        """Cleanup deletes content, never the head row (checked on the store directly)."""
        from gapline.storage import open_backend

        clock = Clock()
        async with start_relay(relay_dsn, clock=clock, retention=10) as r:
            alice, bob, ta, _tb = await _pair(r)
            await _send(r, ta, alice, bob, sender_boxes=False)
        backend = await open_backend(relay_dsn)
        try:
            store = TimelineStore(backend, clock)
            report = await store.cleanup(clock() + 11)
            assert report.records == 1 and report.visibility_rows == 1
            assert await store.timelines.head(bob.account) == 0
        finally:
            await backend.close()

    async def test_retry_after_the_delivery_age_limit_still_gets_its_result(
        self, relay_dsn: str
    ) -> None:
        clock = Clock()
        async with start_relay(relay_dsn, clock=clock, retention=1000, delivery_age_limit=100) as r:
            alice, bob, ta, _tb = await _pair(r)
            params = make_send_params(alice, bob, created_at=clock()).to_wire()
            first = await r.ok("message.send", params, token=ta)
            clock.advance(200)
            ta = await r.login(alice)
            assert await r.ok("message.send", params, token=ta) == first
            late = make_send_params(alice, bob, created_at=clock() - 150).to_wire()
            assert await r.error("message.send", late, token=ta) == (400, "message_expired")
