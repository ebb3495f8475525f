"""The async client against the in-test relay over HTTP and WebSocket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gapline.meshline import InvalidPage, MeshlineError, RelayError
from gapline.meshline._client import Backoff, DeviceIdentity, MeshlineClient, RelayEndpoint
from gapline.meshline._store import MeshlineStore
from gapline.meshline._timeline import AcceptedMessage, GapState, RetentionGap
from gapline.meshline._transport_http import HttpTransport, encode_query
from gapline.meshline.testing import TEST_CONTEXT, TestAccount, make_account, make_send_params
from gapline.storage import open_backend
from tests.meshline.fake_relay import FakeRelay


@pytest.fixture
async def relay() -> AsyncIterator[FakeRelay]:
    fake = await FakeRelay(TEST_CONTEXT).start()
    try:
        yield fake
    finally:
        await fake.stop()


@pytest.fixture
async def store_for(tmp_path):
    backends = []

    async def make(account: TestAccount) -> MeshlineStore:
        backend = await open_backend(str(tmp_path / f"{len(backends)}.db"))
        backends.append(backend)
        return await MeshlineStore.open(backend, account.context, account.account)

    yield make
    for backend in backends:
        await backend.close()


def client_for(
    account: TestAccount, relay: FakeRelay, store: MeshlineStore, *, ws: bool, **kw
) -> MeshlineClient:
    dev = account.device(0)
    identity = DeviceIdentity(account.context, dev.keys, dev.certificate)
    endpoint = RelayEndpoint(relay.relay_id, relay.base, relay.ws_url if ws else None)
    return MeshlineClient(
        identity, endpoint, store, backoff=Backoff(initial=0.01, maximum=0.05), **kw
    )


def texts(items: list) -> list[str | None]:
    return [i.text for i in items if isinstance(i, AcceptedMessage)]


async def take(client: MeshlineClient, n: int) -> list:
    items = []
    async with asyncio.timeout(20):
        async for item in client.messages():
            items.append(item)
            if len(items) == n:
                break
    return items


@pytest.mark.parametrize("ws", [False, True], ids=["http", "websocket"])
async def test_messages_stream(relay: FakeRelay, store_for, ws: bool) -> None:
    alice, bob = make_account(), make_account()
    for i in range(3):
        relay.append(make_send_params(bob, alice, text=f"m{i}"), bob.device(0).certificate)
    store = await store_for(alice)
    client = client_for(alice, relay, store, ws=ws, page_limit=2, poll_interval=0.05)
    items = await take(client, 3)
    assert all(isinstance(i, AcceptedMessage) for i in items)
    assert [i.sequence for i in items] == [0, 1, 2]
    assert texts(items) == ["m0", "m1", "m2"]
    assert await store.position(relay.relay_id) == 2
    assert relay.calls.count("message.timeline.sync") >= 2  # paged by has_more


async def test_websocket_notification_wakes_client(relay: FakeRelay, store_for) -> None:
    alice, bob = make_account(), make_account()
    store = await store_for(alice)
    client = client_for(alice, relay, store, ws=True, poll_interval=3600)

    async def later() -> None:
        await relay.ws_authenticated.wait()  # the client is connected and authenticated
        relay.append(make_send_params(bob, alice, text="pushed"), bob.device(0).certificate)

    async with asyncio.TaskGroup() as tg:
        tg.create_task(later())
        items = await take(client, 1)
    assert texts(items)[0] == "pushed"


async def test_reconnects_after_temporary_failures_and_lost_session(
    relay: FakeRelay, store_for
) -> None:
    alice, bob = make_account(), make_account()
    relay.append(make_send_params(bob, alice, text="one"), bob.device(0).certificate)
    relay.fail_next = 3  # relay.info / auth fail with temporarily_unavailable
    store = await store_for(alice)
    client = client_for(alice, relay, store, ws=False, poll_interval=0.01)
    seen = []
    async with asyncio.timeout(20):
        async for item in client.messages():
            seen.append(item)
            if len(seen) == 1:
                relay.drop_sessions()  # the next sync gets unauthorized and re-authenticates
                relay.append(make_send_params(bob, alice, text="two"), bob.device(0).certificate)
            else:
                break
    assert texts(seen) == ["one", "two"]
    assert relay.calls.count("auth.device.verify") >= 2


async def test_retention_gap_surfaced_once(relay: FakeRelay, store_for) -> None:
    alice, bob = make_account(), make_account()
    for text in ("old", "kept"):
        relay.append(make_send_params(bob, alice, text=text), bob.device(0).certificate)
    relay.expire(alice.account, 0)
    store = await store_for(alice)
    client = client_for(alice, relay, store, ws=False, poll_interval=0.01)
    items = await client.sync()
    assert isinstance(items[0], RetentionGap) and items[0].state is GapState.UNAVAILABLE
    assert items[0].after == -1 and items[0].before == 1
    assert texts(items[1:]) == ["kept"]
    assert await client.sync() == []  # neither the gap nor the message again
    await client.close()


async def test_duplicate_delivery_not_reapplied(relay: FakeRelay, store_for) -> None:
    alice, bob = make_account(), make_account()
    params = make_send_params(bob, alice, text="once")
    relay.append(params, bob.device(0).certificate)
    relay.append(params, bob.device(0).certificate)  # a relay bug or a replay: same message twice
    store = await store_for(alice)
    client = client_for(alice, relay, store, ws=False)
    items = await client.sync()
    assert len(items) == 1 and await store.position(relay.relay_id) == 1
    await client.close()


async def test_wrong_relay_identity_is_fatal(relay: FakeRelay, store_for) -> None:
    alice = make_account()
    store = await store_for(alice)
    dev = alice.device(0)
    client = MeshlineClient(
        DeviceIdentity(alice.context, dev.keys, dev.certificate),
        RelayEndpoint("0x" + "00" * 20, relay.base),
        store,
    )
    with pytest.raises(MeshlineError) as info:
        await take(client, 1)
    assert info.value.code == "relay_mismatch"


async def test_http_transport_errors_and_query(relay: FakeRelay) -> None:
    assert encode_query({"after": -1, "limit": 5, "flag": True}) == {
        "after": "-1",
        "limit": "5",
        "flag": "true",
    }
    transport = HttpTransport(relay.base)
    try:
        with pytest.raises(RelayError) as info:
            await transport.call("message.timeline.sync", {"after": -1}, session="nope")
        assert info.value.code == "unauthorized"
        info_result = await transport.call("relay.info")
        assert info_result["relay_id"] == relay.relay_id
    finally:
        await transport.aclose()


@pytest.mark.parametrize("ws", [False, True], ids=["http", "websocket"])
async def test_send_then_both_sides_sync(relay: FakeRelay, store_for, ws: bool) -> None:
    alice, bob = make_account(2), make_account()
    bob_client = client_for(bob, relay, await store_for(bob), ws=ws)
    alice_client = client_for(alice, relay, await store_for(alice), ws=ws)
    status = await alice_client.send(
        bob.account,
        {
            "$type": "meshline.message.direct",
            "body": {"content_type": "text/plain", "text": "hello bob"},
        },
        recipients=[bob.device(0).certificate],
        own_devices=[d.certificate for d in alice.devices],
    )
    assert status["status"] == "target_accepted"
    received = await bob_client.sync()
    assert texts(received) == ["hello bob"]
    sent = await alice_client.sync()  # the sent record, through alice's sender box
    assert texts(sent) == ["hello bob"]
    assert isinstance(sent[0], AcceptedMessage) and sent[0].direction.value == "outbound"
    await alice_client.close()
    await bob_client.close()


async def test_invalid_page_applies_nothing(relay: FakeRelay, store_for) -> None:
    alice, bob = make_account(), make_account()
    relay.append(make_send_params(bob, alice, text="uncertified"), bob.device(0).certificate)
    relay.omit_certificates = True  # the relay breaks the response rules
    store = await store_for(alice)
    client = client_for(alice, relay, store, ws=False)
    with pytest.raises(InvalidPage):
        await take(client, 1)
    assert await store.messages() == [] and await store.position(relay.relay_id) == -1
    relay.omit_certificates = False
    assert texts(await client.sync()) == ["uncertified"]
    await client.close()


async def test_publish_device_state_with_an_account_session(relay: FakeRelay, store_for) -> None:
    alice = make_account(2)
    client = client_for(alice, relay, await store_for(alice), ws=False)
    assert await client.publish_device_state(alice.key, alice.state) == {"status": "accepted"}
    assert relay.states[alice.account] == alice.state
    other = make_account()
    with pytest.raises(RelayError) as info:  # the account key must derive the challenged account
        await client.publish_device_state(other.key, other.state)
    assert info.value.code == "invalid_signature"


async def test_two_relays_one_store_first_copy_wins(store_for) -> None:
    """One account reads the same message through two relays: it is yielded once."""
    alice, bob = make_account(), make_account()
    one = await FakeRelay(TEST_CONTEXT).start()
    two = await FakeRelay(TEST_CONTEXT).start()
    try:
        params = make_send_params(bob, alice, text="everywhere")
        one.append(params, bob.device(0).certificate)
        two.append(make_send_params(bob, alice, text="only on two"), bob.device(0).certificate)
        two.append(params, bob.device(0).certificate)
        store = await store_for(alice)
        first = client_for(alice, one, store, ws=False)
        second = client_for(alice, two, store, ws=False)
        assert texts(await first.sync()) == ["everywhere"]
        assert texts(await second.sync()) == ["only on two"]  # the copy on two is a duplicate
        assert await store.position(one.relay_id) == 0 and await store.position(two.relay_id) == 1
        assert [m.relay_id for m in await store.messages()] == [one.relay_id, two.relay_id]
        await first.close()
        await second.close()
    finally:
        await one.stop()
        await two.stop()


async def test_clock_skew_corrected_from_the_challenge(relay: FakeRelay, store_for) -> None:
    alice, bob = make_account(), make_account()
    relay.append(make_send_params(bob, alice, text="late clock"), bob.device(0).certificate)
    relay.clock_offset = 3600  # the relay's clock is an hour ahead of ours
    client = client_for(alice, relay, await store_for(alice), ws=False)
    assert texts(await client.sync()) == ["late clock"]
    assert relay.calls.count("auth.challenge") == 2  # one refused proof, one corrected
    await client.close()
