"""SIGKILL in the middle of a multi-page fill (a real Synapse, the engine in a child
process): after restart the cache is consistent (every committed page with its cursor,
nothing half-written) and the fill resumes from the last committed cursor."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import pytest

from gapline.history import FillGap, HistoryRepair, Ok, OpenRoom, RetryRecent
from tests.history.test_engine_support import NO_RETRY, event_ids, gap_rows, open_engine
from tests.integration.test_history_synapse import retain_all, server_history

pytestmark = [pytest.mark.synapse, pytest.mark.slow]

# The child: open the store, start the fill, print one line per committed page (each
# page's TimelineChanged is published after its transaction committed). Its transport
# lets the fill's first two /messages requests through and holds every later one for
# good, so the fill commits exactly two pages and then waits: the parent kills it there.
DRIVER = r"""
import asyncio, json, sys
import httpx
from gapline.history import Cancel, Engine, FillGap, HistoryRepair, OpenRoom, TimelineChanged
from gapline.matrix import MatrixClient, Session
from gapline.storage import KdfParams

args = json.loads(sys.argv[1])

class TwoPages(httpx.AsyncBaseTransport):
    def __init__(self):
        self.inner = httpx.AsyncHTTPTransport()
        self.allowed = None  # no limit until the fill starts
    async def handle_async_request(self, request):
        if request.url.path.endswith("/messages") and self.allowed is not None:
            if self.allowed == 0:
                await asyncio.Event().wait()  # held until the process is killed
            self.allowed -= 1
        return await self.inner.handle_async_request(request)

class Lines:
    counting = False
    async def publish(self, event):
        if self.counting and isinstance(event, TimelineChanged):
            print("page", flush=True)

async def main():
    session = Session.from_dict(args["session"])
    transport, lines = TwoPages(), Lines()
    async with MatrixClient(session.homeserver, session=session, transport=transport) as client:
        async with Engine.open(args["store"], client, passphrase=args["passphrase"],
                               sink=lines, sync=False, kdf_cost=KdfParams.cheap()) as engine:
            await engine.execute(OpenRoom(args["room"]))
            await engine.execute(HistoryRepair(Cancel(args["room"])))
            print("ready", flush=True)
            transport.allowed, lines.counting = 2, True
            await engine.execute(HistoryRepair(FillGap(args["room"], args["gap"])))
            print("finished", flush=True)

asyncio.run(main())
"""


async def test_sigkill_mid_fill_keeps_a_consistent_cache_and_resumes(tmp_path, synapse_kit):
    from tests.history.test_engine_support import PASSPHRASE

    alice = await synapse_kit.user("alice")
    room = await synapse_kit.room(alice, name="crash")
    async with synapse_kit.client(alice, retry=NO_RETRY) as client:
        await retain_all(tmp_path, client)
        async with open_engine(tmp_path, client) as h:
            await h.engine.execute(OpenRoom(room))
            await h.engine.execute(HistoryRepair(RetryRecent(room)))
            await synapse_kit.send_messages(alice, room, [f"g {i}" for i in range(310)])
            await h.engine.sync_once()
            [gap] = gap_rows(h.engine.timeline(room).state.items)
            before = len(await h.engine.store.all_events(room))
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        DRIVER,
        json.dumps(
            {
                "session": alice.to_dict(),
                "store": str(tmp_path),
                "passphrase": PASSPHRASE,
                "room": room,
                "gap": gap.id,
            }
        ),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert child.stdout is not None
    pages = 0
    try:
        while pages < 2:
            line = await asyncio.wait_for(child.stdout.readline(), 60)
            assert line, (await child.stderr.read()).decode() if child.stderr else "child exited"
            pages += line.strip() == b"page"
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    assert child.returncode == -signal.SIGKILL

    async with synapse_kit.client(alice, retry=NO_RETRY) as client:
        truth = await server_history(client, room)
        async with open_engine(tmp_path, client) as h:
            stored = [e.event_id for e in await h.engine.store.all_events(room)]
            assert len(stored) >= before + 100  # the two pages reported committed
            assert len(stored) == len(set(stored))
            index = {e: i for i, e in enumerate(truth)}
            assert [index[e] for e in stored] == sorted(index[e] for e in stored)
            [row] = [g for g in await h.engine.store.all_gaps(room) if not g.is_top]
            assert row.gap_id == gap.id
            # Boundaries and cursor agree with the events: the newer boundary is the first
            # retained event after the older one, and the cursor continues from it.
            at = stored.index(row.older_boundary or "")
            assert stored[at + 1] == row.newer_boundary
            page = await client.messages(room, from_=row.cursor, dir="b", limit=1)
            assert index[page.chunk[0].event_id] == index[row.newer_boundary] - 1
            # Reopening resumes too: the recent load walks down into the same gap.
            await h.engine.execute(OpenRoom(room))
            await h.engine.execute(HistoryRepair(RetryRecent(room)))
            for _ in range(3):
                if not [g for g in await h.engine.store.all_gaps(room) if not g.is_top]:
                    break
                answer = await h.engine.execute(HistoryRepair(FillGap(room, gap.id)))
                assert answer == Ok()
            assert [g for g in await h.engine.store.all_gaps(room) if not g.is_top] == []
            assert [e.event_id for e in await h.engine.store.all_events(room)] == truth
            assert (
                event_ids(h.engine.timeline(room).state.items)
                == truth[-len(event_ids(h.engine.timeline(room).state.items)) :]
            )
