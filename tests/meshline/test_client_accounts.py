"""The client's profile, route, device-state and contact calls against the in-test relays."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import httpx
import pytest

from gapline.meshline import (
    AccessBasis,
    DeviceUnknown,
    MeshlineError,
    Refusal,
    RelayError,
    StaleState,
    StaticDirectory,
    sign_profile,
    sign_route,
)
from gapline.meshline._client import DeviceIdentity, MeshlineClient, RelayEndpoint
from gapline.meshline._store import MeshlineStore
from gapline.meshline._timeline import AcceptedMessage
from gapline.meshline._transport_http import HttpTransport
from gapline.meshline.testing import TEST_CONTEXT, TestAccount, make_account
from gapline.storage import open_backend
from tests.meshline.fake_relay_accounts import AccountsRelay, FakeNetwork

TEXT = {"$type": "meshline.message.direct", "body": {"content_type": "text/plain", "text": "hi"}}


def endpoint(relay: AccountsRelay, *, ws: bool = False) -> RelayEndpoint:
    return RelayEndpoint(relay.relay_id, relay.base, relay.ws_url if ws else None)


@dataclass
class World:
    network: FakeNetwork
    relays: list[AccountsRelay]
    make: Callable[..., Awaitable[MeshlineClient]]


@pytest.fixture
async def world(tmp_path) -> AsyncIterator[World]:
    network = FakeNetwork()
    relays = [AccountsRelay(TEST_CONTEXT, network=network) for _ in range(2)]
    for relay in relays:
        await relay.start()
    directory = StaticDirectory.of(*(endpoint(r) for r in relays))
    clients: list[MeshlineClient] = []
    backends = []

    async def make(
        account: TestAccount, relay: int = 0, *, ws: bool = False, route: bool = True
    ) -> MeshlineClient:
        backend = await open_backend(str(tmp_path / f"{len(backends)}.db"))
        backends.append(backend)
        store = await MeshlineStore.open(backend, account.context, account.account)
        dev = account.device(0)
        client = MeshlineClient(
            DeviceIdentity(account.context, dev.keys, dev.certificate),
            endpoint(relays[relay], ws=ws),
            store,
            directory=directory,
            poll_interval=0.05,
        )
        clients.append(client)
        assert await client.publish_device_state(account.key, account.state) == {
            "status": "accepted"
        }
        if route:
            await client.publish_route(account.key)
        return client

    try:
        yield World(network, relays, make)
    finally:
        for client in clients:
            await client.close()
        for relay in relays:
            await relay.stop()
        for backend in backends:
            await backend.close()


async def relay_code(call: Awaitable[object]) -> str:
    with pytest.raises(RelayError) as info:
        await call
    return info.value.code


def texts(items: list) -> list[str | None]:
    return [i.text for i in items if isinstance(i, AcceptedMessage)]


# --- routes ---------------------------------------------------------------------------


async def test_publish_and_resolve_routes(world: World) -> None:
    alice, bob = make_account(), make_account()
    a = await world.make(alice)
    b = await world.make(bob, relay=1)
    route = await b.resolve_route(alice.account)
    assert route.relay_id == world.relays[0].relay_id and route.relay_signature is not None
    assert (await a.home_relay(bob.account)).relay_id == world.relays[1].relay_id
    newer = await a.publish_route(alice.key)
    assert newer.revision > route.revision
    assert (await b.resolve_route(alice.account)).revision == newer.revision
    assert await relay_code(a.resolve_route(make_account().account)) == "not_found"


async def test_route_publication_refusals(world: World) -> None:
    alice = make_account()
    a = await world.make(alice, route=False)
    stateless = make_account()
    s = await world.make(stateless, route=False)
    world.network.states.pop(stateless.account)
    assert await relay_code(s.publish_route(stateless.key)) == "state_conflict"
    first = await a.publish_route(alice.key)
    assert await relay_code(a.publish_route(alice.key, revision=first.revision - 1)) == (
        "stale_state"
    )
    # The same revision with other content: another lifetime.
    code = await relay_code(a.publish_route(alice.key, revision=first.revision, lifetime=60))
    assert code == "state_conflict"
    # A route naming another relay is not this relay's to sign.
    now = int(time.time())
    elsewhere = sign_route(
        alice.key,
        TEST_CONTEXT,
        relay_id=world.relays[1].relay_id,
        revision=first.revision + 1,
        updated_at=now,
        expires_at=now + 60,
    )
    code = await relay_code(a.account_call(alice.key, "account.route.publish", elsewhere.to_wire()))
    assert code == "bad_request"
    far = sign_route(
        alice.key,
        TEST_CONTEXT,
        relay_id=world.relays[0].relay_id,
        revision=first.revision + 1,
        updated_at=now + 86400,
        expires_at=now + 2 * 86400,
    )
    code = await relay_code(a.account_call(alice.key, "account.route.publish", far.to_wire()))
    assert code == "clock_skew"
    assert (await a.resolve_route(alice.account)).revision == first.revision  # nothing changed


async def test_a_lying_relay_cannot_roll_a_route_back(world: World) -> None:
    alice, bob = make_account(), make_account()
    await world.make(alice)
    b = await world.make(bob)
    old = await b.resolve_route(alice.account)
    a = await world.make(alice)  # publishes a higher revision
    new = await b.resolve_route(alice.account)
    assert new.revision > old.revision and a.identity.account == alice.account
    # The relay forgets everything and serves the old record again.
    key = next(iter(k for k, v in world.network.records.items() if old.to_json() in v))
    world.network.records[key] = [old.to_json()]
    world.relays[0].histories.clear()
    with pytest.raises(StaleState):
        await b.resolve_route(alice.account)


# --- profiles -------------------------------------------------------------------------


async def test_profiles(world: World) -> None:
    alice, bob = make_account(), make_account()
    a = await world.make(alice)
    b = await world.make(bob, relay=1)
    published = await a.publish_profile(public_discovery=True, nickname="Alice")
    resolved = await b.resolve_profile(alice.account, relay=await b.home_relay(alice.account))
    assert resolved.profile == published
    assert resolved.signer_certificate == alice.device(0).certificate
    assert await relay_code(b.resolve_profile(make_account().account)) == "not_found"
    older = sign_profile(
        alice.device(0).keys,
        alice.account,
        TEST_CONTEXT,
        public_discovery=False,
        updated_at=published.updated_at - 1,
    )
    assert await relay_code(a.call("profile.publish", older.to_wire())) == "stale_state"
    forged = sign_profile(bob.device(0).keys, alice.account, TEST_CONTEXT, public_discovery=False)
    assert await relay_code(a.call("profile.publish", forged.to_wire())) == "invalid_signature"
    bobs = sign_profile(bob.device(0).keys, bob.account, TEST_CONTEXT, public_discovery=False)
    assert await relay_code(a.call("profile.publish", bobs.to_wire())) == "forbidden"
    oversized = {**published.to_wire(), "pad": "p" * 8192}
    assert await relay_code(a.call("profile.publish", oversized)) == "request_too_large"
    assert (await b.resolve_profile(alice.account)).profile == published  # nothing replaced


# --- contacts and delivery --------------------------------------------------------------


@pytest.mark.parametrize("ws", [False, True], ids=["http", "websocket"])
async def test_public_discovery_lets_strangers_send(world: World, ws: bool) -> None:
    alice, bob = make_account(), make_account()
    a = await world.make(alice, ws=ws)
    b = await world.make(bob, ws=ws)
    assert await relay_code(b.send_to(alice.account, TEXT)) == "forbidden"  # no profile yet
    await a.publish_profile(public_discovery=False)
    assert await relay_code(b.send_to(alice.account, TEXT)) == "forbidden"
    await a.publish_profile(public_discovery=True)
    status = await b.send_to(alice.account, TEXT)
    assert status["status"] == "target_accepted"
    assert texts(await a.sync()) == ["hi"]


async def test_a_grant_reaches_a_non_public_account(world: World) -> None:
    alice, bob, carol = make_account(), make_account(), make_account()
    a = await world.make(alice)
    b = await world.make(bob)
    c = await world.make(carol)
    await a.publish_profile(public_discovery=False)
    grant = a.make_grant(bob.account, expires_at=a.now() + 3600)
    assert b.check_grant(grant, alice.state).basis is AccessBasis.GRANT
    assert (await b.send_to(alice.account, TEXT, authorization=grant))["status"] == (
        "target_accepted"
    )
    assert texts(await a.sync()) == ["hi"]
    # Replayed by another sender: refused at the signed query.
    assert c.check_grant(grant, alice.state).refusal is Refusal.WRONG_AUDIENCE
    assert await relay_code(c.send_to(alice.account, TEXT, authorization=grant)) == "forbidden"
    # And at message.send itself, even with the devices already known.
    devices = list(alice.state.certificates)
    code = await relay_code(c.send(alice.account, TEXT, recipients=devices, authorization=grant))
    assert code == "forbidden"


async def test_invalid_grants_are_refused(world: World) -> None:
    alice, bob = make_account(2), make_account()
    a = await world.make(alice)
    b = await world.make(bob)
    await a.publish_profile(public_discovery=True)  # invalid material never falls back to public
    devices = list(alice.state.certificates)
    expired = a.make_grant(bob.account, expires_at=a.now() - 1)
    assert await relay_code(
        b.send(alice.account, TEXT, recipients=devices, authorization=expired)
    ) == ("forbidden")
    good = a.make_grant(bob.account)
    wrong = type(good)(good.grantor, good.grantee, good.signatures, a.now() + 99)
    code = await relay_code(b.send(alice.account, TEXT, recipients=devices, authorization=wrong))
    assert code == "invalid_signature"
    # Revoked: the signing device leaves Alice's state.
    removed = alice.new_state([alice.device(1)], revision=alice.state.revision + 1)
    await a.publish_device_state(alice.key, removed)
    code = await relay_code(
        b.send(alice.account, TEXT, recipients=[alice.device(1).certificate], authorization=good)
    )
    assert code == "forbidden"
    assert texts(await a.sync()) == []
    code = await relay_code(b.send_to(alice.account, TEXT, authorization=good))
    assert code == "forbidden"  # the signed device-state query is refused the same way


@pytest.mark.parametrize("ws", [False, True], ids=["http", "websocket"])
async def test_an_invitation_bootstraps_contact(world: World, ws: bool) -> None:
    alice, bob, carol = make_account(), make_account(), make_account()
    a = await world.make(alice, ws=ws)
    b = await world.make(bob, ws=ws)
    c = await world.make(carol, ws=ws)
    invite = a.make_invite(expires_at=a.now() + 600)
    assert b.check_invite(invite, alice.state).allowed
    state = await b.resolve_device_state(alice.account, authorization=invite)
    assert state == alice.state
    for client in (b, c):  # no usage count
        assert (await client.send_to(alice.account, TEXT, authorization=invite))["status"] == (
            "target_accepted"
        )
    assert texts(await a.sync()) == ["hi", "hi"]
    lapsed = a.make_invite(expires_at=a.now() - 1)
    assert await relay_code(b.resolve_device_state(alice.account, authorization=lapsed)) == (
        "forbidden"
    )
    forged = type(invite)(
        invite.inviter, invite.signer_device_id, invite.expires_at + 1, invite.device_signature
    )
    assert await relay_code(b.resolve_device_state(alice.account, authorization=forged)) == (
        "invalid_signature"
    )


async def test_the_flow_follows_the_route_to_another_relay(world: World) -> None:
    """Alice (home A) writes to Bob (home B) with Bob's grant: route on A → B; signed
    device-state query on B; message.send on A; Bob reads it on B."""
    alice, bob = make_account(), make_account()
    a = await world.make(alice, relay=0)
    b = await world.make(bob, relay=1)
    grant = b.make_grant(alice.account)
    one, two = world.relays
    before = len(two.calls)
    status = await a.send_to(bob.account, TEXT, authorization=grant)
    assert status["status"] == "target_accepted"
    assert (
        "device.state.resolve" in two.calls[before:] and "auth.device.verify" in two.calls[before:]
    )
    assert "message.send" in one.calls and "message.send" not in two.calls
    assert texts(await b.sync()) == ["hi"]


async def test_own_state_and_device_checks(world: World) -> None:
    alice = make_account()
    a = await world.make(alice)
    assert await a.resolve_device_state(alice.account) == alice.state
    assert len(await a.contact_devices(alice.account)) == 1
    # Self-delivery through the same flow, without authorization.
    assert (await a.send_to(alice.account, TEXT))["status"] == "target_accepted"
    empty = alice.new_state([], revision=alice.state.revision + 1)
    await a.publish_device_state(alice.key, empty)
    with pytest.raises(DeviceUnknown):
        await a.contact_devices(alice.account)
    # An older state answered after a newer one is refused by the client.
    world.network.states[alice.account] = alice.state
    with pytest.raises(StaleState):
        await a.resolve_device_state(alice.account)


async def test_unknown_relays_are_not_guessed(world: World) -> None:
    alice = make_account()
    a = await world.make(alice)
    with pytest.raises(MeshlineError) as info:
        a.endpoint_of("0x" + "9" * 40)
    assert info.value.code == "relay_unknown"


async def test_signed_state_queries_go_as_post() -> None:
    seen: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path))
        return httpx.Response(200, json={"ok": True})

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    transport = HttpTransport("https://relay.example/meshline/v1", client=client)
    try:
        await transport.call("device.state.resolve", {"account": "neo:1:x"})
        await transport.call("device.state.resolve", {"$type": "meshline.device.state.resolve"})
        await transport.call("profile.resolve", {"account": "neo:1:x"})
    finally:
        await client.aclose()
    path = "/meshline/v1/device/state/resolve"
    assert seen == [("GET", path), ("POST", path), ("GET", "/meshline/v1/profile/resolve")]
