"""The durable send queue against a real Synapse: the homeserver process stopped while
messages are queued and started again (each arrives once, in order); SIGKILL of the
engine's process at every boundary of a send, then a restart (the room has the message
exactly once); a message over Synapse's size limit (a clear Failed row, the text kept)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import httpx
import pytest

from gapline.history import (
    EngineConfig,
    EventItem,
    Ok,
    OpenRoom,
    SendMessage,
    SendStateKind,
)
from gapline.matrix import MatrixClient, RetryPolicy
from gapline.matrix.devserver import SynapseServer, SynapseStartError
from tests.activity import Activity
from tests.fixtures.synapse import OWN_HOMESERVER
from tests.history.test_engine_support import PASSPHRASE, open_engine

pytestmark = [pytest.mark.synapse, pytest.mark.slow, OWN_HOMESERVER]

FAST = EngineConfig(send_backoff_s=(0.05, 0.5))
QUICK = RetryPolicy(attempts=1, rate_limit_attempts=3)


async def bodies(client: MatrixClient, room_id: str) -> list[str]:
    """The room's message bodies, oldest first, as Synapse's ``/messages`` orders them."""
    out: list[str] = []
    token = None
    while True:
        page = await client.messages(room_id, from_=token, dir="b", limit=100)
        out.extend(
            e.content["body"]
            for e in page.chunk
            if e.type == "m.room.message" and isinstance(e.content.get("body"), str)
        )
        if page.end is None:
            return out[::-1]
        token = page.end


def rows(h, room_id: str) -> list[EventItem]:
    items = h.mirror.items(room_id) or ()
    return [i for i in items if isinstance(i, EventItem) and i.event_type == "m.room.message"]


@pytest.fixture
async def own_synapse(tmp_path: Path):
    """A Synapse of this test's own, on a database file: it can be stopped and started."""
    try:
        server = await SynapseServer.astart(tmp_path / "synapse", persistent=True)
    except SynapseStartError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"Synapse could not start under CI=true: {exc}", pytrace=False)
        pytest.skip(f"Synapse could not start: {str(exc).splitlines()[0]}")
    try:
        yield server
    finally:
        await server.astop()


async def test_messages_queued_while_synapse_is_down_arrive_once_in_order(
    tmp_path: Path, own_synapse: SynapseServer
):
    activity = Activity.current()
    alice = await own_synapse.register_user(own_synapse.unique_localpart("alice"), "password")
    room = await own_synapse.create_room(alice, name="outage")
    transport = activity.transport(httpx.AsyncHTTPTransport())
    texts = [f"queued {i}" for i in range(5)]
    async with (
        own_synapse.client(alice, retry=QUICK, transport=transport) as client,
        open_engine(tmp_path / "store", client, config=FAST, sync=True, sync_timeout_ms=500) as h,
    ):
        engine = h.engine
        await engine.wait_synced(1)
        assert await engine.execute(OpenRoom(room)) == Ok()
        await own_synapse.ahalt()
        for text in texts:
            assert await engine.execute(SendMessage(room, text)) == Ok()
        assert [r.body for r in rows(h, room)] == texts
        assert all(r.send_state is not None for r in rows(h, room))
        # The worker tried and found the homeserver gone (it backs off, keeping them).
        await activity.until(
            lambda: _value(engine.send_queue.error),
            what="a send attempt against the stopped Synapse",
            within=60,
        )
        assert engine.send_queue.sent == 0
        await own_synapse.aresume()
        await engine.send_queue.wait_sent(len(texts))
        await activity.until(
            lambda: _value(
                [r.body for r in rows(h, room)] == texts
                and all(r.send_state is None for r in rows(h, room))
            ),
            what="the sync bringing every queued message back as the server's event",
            within=60,
        )
        assert h.mirror.send_queue.pending == 0
        assert await bodies(client, room) == texts


async def _value(value):
    return value


# The child: an engine whose transport stops at one boundary of the first send, and
# prints when it got there; the parent kills it with SIGKILL at that line.
DRIVER = r"""
import asyncio, json, sys
import httpx
from gapline.history import Engine, OpenRoom, SendMessage
from gapline.matrix import MatrixClient, Session
from gapline.storage import KdfParams

args = json.loads(sys.argv[1])
mode = args["mode"]

class Boundary(httpx.AsyncBaseTransport):
    def __init__(self):
        self.inner = httpx.AsyncHTTPTransport()
    async def handle_async_request(self, request):
        if "/send/" in request.url.path and mode == "before":
            print("at-boundary", flush=True)
            await asyncio.Event().wait()  # never sent: killed here
        response = await self.inner.handle_async_request(request)
        if "/send/" in request.url.path and mode == "answered":
            await response.aread()
            print("at-boundary", flush=True)
            await asyncio.Event().wait()  # the server answered; the answer is never read
        return response

async def main():
    session = Session.from_dict(args["session"])
    async with MatrixClient(session.homeserver, session=session, transport=Boundary()) as client:
        async with Engine.open(args["store"], client, passphrase=args["passphrase"],
                               sync=False, send=True, kdf_cost=KdfParams.cheap()) as engine:
            await engine.sync_once()
            await engine.execute(OpenRoom(args["room"]))
            answer = await engine.execute(SendMessage(args["room"], args["body"]))
            assert answer.__class__.__name__ == "Ok", answer
            if mode == "committed":
                await engine.send_queue.wait_sent(1)
                print("at-boundary", flush=True)
            await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.parametrize("mode", ["before", "answered", "committed"])
async def test_sigkill_at_each_boundary_of_a_send_leaves_the_message_once(
    tmp_path: Path, synapse_kit, mode: str
):
    alice = await synapse_kit.user("alice")
    room = await synapse_kit.room(alice, name=f"kill {mode}")
    body = f"survives a kill {mode}"
    store = tmp_path / "store"
    store.mkdir()
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        DRIVER,
        json.dumps(
            {
                "session": alice.to_dict(),
                "store": str(store),
                "passphrase": PASSPHRASE,
                "room": room,
                "body": body,
                "mode": mode,
            }
        ),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert child.stdout is not None
    try:
        line = await asyncio.wait_for(child.stdout.readline(), 90)
        assert line.strip() == b"at-boundary", (
            (await child.stderr.read()).decode() if child.stderr else "child exited"
        )
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    assert child.returncode == -signal.SIGKILL

    async with synapse_kit.client(alice, retry=QUICK) as client:
        sent_before = (await bodies(client, room)).count(body)
        assert sent_before == (0 if mode == "before" else 1)
        async with open_engine(store, client, config=FAST) as h:
            await h.engine.sync_once()
            assert await h.engine.execute(OpenRoom(room)) == Ok()
            if mode != "committed":
                await h.engine.send_queue.wait_sent(1)  # the same transaction, again
            await h.engine.sync_once()
            mine = [r for r in rows(h, room) if r.body == body]
            assert len(mine) == 1 and mine[0].send_state is None
            assert h.mirror.send_queue.pending == 0
        assert (await bodies(client, room)).count(body) == 1


async def test_a_message_over_the_size_limit_fails_clearly_and_keeps_its_text(
    tmp_path: Path, synapse_kit
):
    alice = await synapse_kit.user("alice")
    room = await synapse_kit.room(alice, name="big")
    huge = "x" * 70_000  # Synapse refuses events over 65,536 bytes
    async with (
        synapse_kit.client(alice, retry=QUICK) as client,
        open_engine(tmp_path, client, config=FAST) as h,
    ):
        await h.engine.sync_once()
        assert await h.engine.execute(OpenRoom(room)) == Ok()
        assert await h.engine.execute(SendMessage(room, huge)) == Ok()
        assert await h.engine.execute(SendMessage(room, "small")) == Ok()
        await h.engine.send_queue.wait_failed(1)
        await h.engine.send_queue.wait_sent(1)
        await h.engine.sync_once()
        [big] = [r for r in rows(h, room) if r.body == huge]
        assert big.send_state is not None and big.send_state.kind is SendStateKind.Failed
        assert "too large" in (big.send_state.message or "")
        # The failed row stays after the events (where the user left it); the next
        # message went on and arrived.
        assert [r.body for r in rows(h, room) if r.send_state is None] == ["small"]
        assert rows(h, room)[-1].id == big.id
        assert (await bodies(client, room)) == ["small"]
