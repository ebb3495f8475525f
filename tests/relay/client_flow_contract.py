"""The timeline rules end to end with the `gapline.meshline` client: it authenticates,
publishes state, seals and sends, then syncs over HTTP or WebSocket, validating
certificates and decrypting each record as the processing flow says.

``ClientFlowContract`` is not collected itself (no ``Test`` prefix); ``test_sqlite.py`` and
``test_postgres.py`` subclass it with a ``relay_dsn`` fixture.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import cast

from gapline.meshline import (
    AcceptedMessage,
    DeviceIdentity,
    Direction,
    MeshlineClient,
    MeshlineStore,
    NetworkContext,
    PageOutcome,
    RelayEndpoint,
    RelayError,
    RetentionGap,
    SendParams,
    StoredPage,
    TimelineItem,
)
from gapline.meshline.testing import TestAccount, make_account, make_send_params
from gapline.storage import Backend, open_backend
from tests.relay.harness import Clock, RelayUnderTest, start_relay


class _PagesSeen(MeshlineStore):
    """A client store that sets ``committed`` once the client has committed a synced page."""

    def __init__(self, backend: Backend, context: NetworkContext, owner: str) -> None:
        super().__init__(backend, context, owner)
        self.committed = asyncio.Event()

    async def commit_page(self, relay_id: str, outcome: PageOutcome) -> StoredPage:
        stored = await super().commit_page(relay_id, outcome)
        self.committed.set()
        return stored


@contextlib.asynccontextmanager
async def _client(
    r: RelayUnderTest,
    account: TestAccount,
    device: int,
    tmp: Path,
    *,
    ws: bool = False,
    store_type: type[MeshlineStore] = MeshlineStore,
) -> AsyncGenerator[MeshlineClient]:
    dev = account.device(device)
    backend = await open_backend(str(tmp / f"{dev.device_id}.db"))
    try:
        store = await store_type.open(backend, r.context, account.account)
        identity = DeviceIdentity(r.context, dev.keys, dev.certificate)
        endpoint = RelayEndpoint(r.relay_id, r.url, r.ws_url if ws else None)
        async with MeshlineClient(identity, endpoint, store, poll_interval=30.0) as client:
            yield client
    finally:
        await backend.close()


async def _next(stream: AsyncIterator[TimelineItem]) -> TimelineItem:
    return await anext(stream)


def _texts(items: list) -> list[str]:
    return [
        i.content.body.text
        for i in items
        if isinstance(i, AcceptedMessage) and i.content.body is not None
    ]


class ClientFlowContract:
    """The client against the relay; each backend module subclasses this with ``relay_dsn``."""

    async def test_client_send_and_sync_decrypts_with_fixed_visibility(
        self, relay_dsn: str, tmp_path: Path
    ) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob = make_account(2), make_account(1)
            async with (
                _client(r, alice, 0, tmp_path) as a0,
                _client(r, alice, 1, tmp_path) as a1,
                _client(r, bob, 0, tmp_path) as b0,
            ):
                assert await a0.publish_device_state(alice.key, alice.state) == {
                    "status": "accepted"
                }
                assert await b0.publish_device_state(bob.key, bob.state) == {"status": "accepted"}
                await b0.publish_profile(public_discovery=True)  # anyone may write to bob
                status = await a0.send(
                    bob.account,
                    {
                        "$type": "meshline.message.direct",
                        "body": {"content_type": "text/plain", "text": "hi bob"},
                    },
                    recipients=[bob.device().certificate],
                    own_devices=[alice.device(0).certificate],  # not device 1
                )
                assert status["status"] == "target_accepted"
                received = await b0.sync()
                assert _texts(received) == ["hi bob"]
                assert isinstance(received[0], AcceptedMessage)
                assert received[0].direction is Direction.INBOUND and received[0].sequence == 0
                sent = await a0.sync()
                assert _texts(sent) == ["hi bob"]
                assert (
                    isinstance(sent[0], AcceptedMessage) and sent[0].direction is Direction.OUTBOUND
                )
                assert await a1.sync() == []  # no sender box for device 1: never visible to it
                assert await b0.sync() == []  # the position advanced; nothing new

    async def test_client_over_websocket_is_woken_by_the_notification(
        self, relay_dsn: str, tmp_path: Path
    ) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob = make_account(), make_account()
            await r.publish(alice)
            await r.publish(bob)
            async with (
                _client(r, bob, 0, tmp_path, ws=True, store_type=_PagesSeen) as b0,
                _client(r, alice, 0, tmp_path) as a0,
            ):
                stream = b0.messages()
                async with asyncio.TaskGroup() as group:
                    first = group.create_task(_next(stream))
                    # Bob's first sync has been answered (empty) before alice sends: the
                    # message can reach him only through a later sync.
                    await asyncio.wait_for(cast(_PagesSeen, b0.store).committed.wait(), 20)
                    await a0.send(
                        bob.account,
                        {
                            "$type": "meshline.message.direct",
                            "body": {"content_type": "text/plain", "text": "over ws"},
                        },
                        recipients=[bob.device().certificate],
                    )
                    # With a 30 s poll interval, only the notification can wake the client in
                    # time.
                    item = await asyncio.wait_for(first, 20)
                assert _texts([item]) == ["over ws"]
                await b0.close()

    async def test_client_surfaces_the_retention_gap(self, relay_dsn: str, tmp_path: Path) -> None:
        clock = Clock()
        async with start_relay(relay_dsn, clock=clock, retention=100) as r:
            alice, bob = make_account(), make_account()
            await r.publish(alice)
            await r.publish(bob)
            token = await r.login(alice)
            await r.ok(
                "message.send",
                make_send_params(alice, bob, text="old", created_at=clock()).to_wire(),
                token=token,
            )
            clock.advance(60)
            await r.ok(
                "message.send",
                make_send_params(alice, bob, text="new", created_at=clock()).to_wire(),
                token=token,
            )
            clock.advance(50)
            await r.server.cleanup_once()
            async with _client(r, bob, 0, tmp_path) as b0:
                items = await b0.sync()
            gaps = [i for i in items if isinstance(i, RetentionGap)]
            assert len(gaps) == 1 and gaps[0].after == -1
            assert _texts(items) == ["new"]

    async def test_client_retry_is_idempotent_and_changed_content_conflicts(
        self, relay_dsn: str, tmp_path: Path
    ) -> None:
        async with start_relay(relay_dsn) as r:
            alice, bob = make_account(), make_account()
            await r.publish(alice)
            await r.publish(bob)
            params: SendParams = make_send_params(alice, bob)
            async with _client(r, alice, 0, tmp_path) as a0:
                first = await a0.call("message.send", params.to_wire())
                assert await a0.call("message.send", params.to_wire()) == first
                changed = make_send_params(
                    alice, bob, text="other", message_id=params.envelope.message_id
                )
                try:
                    await a0.call("message.send", changed.to_wire())
                except RelayError as exc:
                    assert exc.code == "state_conflict"
                else:
                    raise AssertionError("a changed retry must be refused")
            async with _client(r, bob, 0, tmp_path) as b0:
                assert _texts(await b0.sync()) == ["hello"]
