"""The ``gapline.meshline`` client's account flows against the real relay: routes published
and resolved (relay co-signature checked with the key from ``relay.descriptor``), profiles,
and the contact flow ``send_to`` (route → device state by signed query → seal → send) with
a grant or an invitation, over HTTP or WebSocket.

``AccountsClientContract`` is not collected itself; ``test_sqlite.py`` and
``test_postgres.py`` subclass it with a ``relay_dsn`` fixture.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable
from pathlib import Path

import pytest

from gapline.meshline import (
    AcceptedMessage,
    DeviceIdentity,
    MeshlineClient,
    MeshlineStore,
    RelayEndpoint,
    RelayError,
    StaticDirectory,
)
from gapline.meshline.testing import TestAccount, make_account
from gapline.storage import open_backend
from tests.relay.harness import RelayUnderTest, start_relay

TEXT = {"$type": "meshline.message.direct", "body": {"content_type": "text/plain", "text": "hi"}}


@contextlib.asynccontextmanager
async def _client(
    r: RelayUnderTest, account: TestAccount, tmp: Path, *, ws: bool = False
) -> AsyncGenerator[MeshlineClient]:
    """A client whose account has published its device state and a route to ``r``."""
    dev = account.device()
    backend = await open_backend(str(tmp / f"{dev.device_id}.db"))
    try:
        store = await MeshlineStore.open(backend, r.context, account.account)
        endpoint = RelayEndpoint(r.relay_id, r.url, r.ws_url if ws else None)
        client = MeshlineClient(
            DeviceIdentity(r.context, dev.keys, dev.certificate),
            endpoint,
            store,
            directory=StaticDirectory.of(endpoint),
            poll_interval=30.0,
        )
        async with client:
            assert await client.publish_device_state(account.key, account.state) == {
                "status": "accepted"
            }
            await client.publish_route(account.key)
            yield client
    finally:
        await backend.close()


async def _code(call: Awaitable[object]) -> str:
    with pytest.raises(RelayError) as info:
        await call
    return info.value.code


def _texts(items: list) -> list[str | None]:
    return [i.text for i in items if isinstance(i, AcceptedMessage)]


class AccountsClientContract:
    @pytest.mark.parametrize("ws", [False, True], ids=["http", "websocket"])
    async def test_routes_profiles_and_the_contact_flow(
        self, relay_dsn: str, tmp_path: Path, ws: bool
    ) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob, carol = make_account(), make_account(), make_account()
            async with (
                _client(r, alice, tmp_path, ws=ws) as a,
                _client(r, bob, tmp_path, ws=ws) as b,
                _client(r, carol, tmp_path, ws=ws) as c,
            ):
                route = await b.resolve_route(alice.account)
                assert route.relay_id == r.relay_id and route.relay_signature is not None
                assert (await b.home_relay(alice.account)).relay_id == r.relay_id
                published = await a.publish_profile(public_discovery=False, nickname="Alice")
                resolved = await b.resolve_profile(alice.account)
                assert resolved.profile == published
                assert resolved.signer_certificate == alice.device().certificate
                # Not public: neither the device state nor a send without material.
                assert await _code(b.send_to(alice.account, TEXT)) == "forbidden"
                grant = a.make_grant(bob.account, expires_at=a.now() + 3600)
                status = await b.send_to(alice.account, TEXT, authorization=grant)
                assert status["status"] == "target_accepted"
                # Bob's grant is no use to carol, at the query or at the send itself.
                assert await _code(c.send_to(alice.account, TEXT, authorization=grant)) == (
                    "forbidden"
                )
                devices = list(alice.state.certificates)
                assert await _code(
                    c.send(alice.account, TEXT, recipients=devices, authorization=grant)
                ) == ("forbidden")
                invite = a.make_invite(expires_at=a.now() + 600)
                state = await c.resolve_device_state(alice.account, authorization=invite)
                assert state == alice.state
                status = await c.send_to(alice.account, TEXT, authorization=invite)
                assert status["status"] == "target_accepted"
                assert _texts(await a.sync()) == ["hi", "hi"]
                # Self-delivery through the same flow, without authorization.
                assert (await a.send_to(alice.account, TEXT))["status"] == "target_accepted"
                assert _texts(await a.sync()) == ["hi"]

    async def test_route_revisions_through_the_client(self, relay_dsn: str, tmp_path: Path) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob = make_account(), make_account()
            async with _client(r, alice, tmp_path) as a, _client(r, bob, tmp_path) as b:
                first = await b.resolve_route(alice.account)
                newer = await a.publish_route(alice.key)
                assert newer.revision > first.revision
                assert (await b.resolve_route(alice.account)).revision == newer.revision
                code = await _code(a.publish_route(alice.key, revision=newer.revision, lifetime=60))
                assert code == "state_conflict"
                code = await _code(a.publish_route(alice.key, revision=first.revision))
                assert code == "stale_state"
                assert await _code(b.resolve_route(make_account().account)) == "not_found"
                await a.publish_profile(public_discovery=True)
                # Public now: the flow reads the device state by account, no material.
                assert (await b.send_to(alice.account, TEXT))["status"] == "target_accepted"
                assert _texts(await a.sync()) == ["hi"]
