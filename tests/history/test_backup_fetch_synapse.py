"""A recovered device fetches keys from the backup as it shows history, on a real Synapse.

nio sends encrypted history; alice's first device reads it (its room keys come
over to-device) and backs them up. Her second device lives through the same
syncs but never receives a room key (its client drops the to-device part of
every sync), so every row it holds is undecryptable until it recovers with the
recovery key, without restoring the whole backup: the visible rows heal on
their own, and filling the gap decrypts each page before it commits, with the
same pages and events the first device's fill reported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from gapline.e2ee import bootstrap_cross_signing, enable_backup, set_up_recovery
from gapline.history import (
    Engine,
    EventItem,
    FillGap,
    HistoryGapItem,
    HistoryRepair,
    HistoryRepairChanged,
    Ok,
    OpenRoom,
    RepairPhase,
)
from gapline.matrix import MatrixClient, Session
from gapline.storage import KdfParams
from tests.e2ee.synapse_peers import NioDevice

from .test_engine_e2ee_synapse import Sink

pytestmark = pytest.mark.timeout(300)

LIMIT = 5  # each sync's timeline: a longer burst leaves a gap


class _NoToDevice(httpx.AsyncBaseTransport):
    """Synapse, except that ``/sync`` answers lose their to-device events (so no room key
    reaches this device); records every request path."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.paths: list[tuple[str, str]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append((request.method, request.url.path))
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/sync") and response.status_code == 200:
            body = json.loads(await response.aread())
            body.pop("to_device", None)
            return httpx.Response(200, json=body, request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def _rows(engine: Engine, room: str) -> dict[str, EventItem]:
    return {
        i.event_id: i
        for i in engine.timeline(room).state.items
        if isinstance(i, EventItem) and i.event_id is not None and i.encrypted
    }


def _readable(engine: Engine, room: str) -> dict[str, str | None]:
    return {e: r.body for e, r in _rows(engine, room).items()}


async def _fill(engine: Engine, sink: Sink, room: str) -> tuple[int, int]:
    """Fill the room's one gap; the (pages, events) its settled report gave."""
    [gap] = [i for i in engine.timeline(room).state.items if isinstance(i, HistoryGapItem)]
    sink.events.clear()
    assert await engine.execute(HistoryRepair(FillGap(room, gap.id))) == Ok()
    [report] = [
        e.report
        for e in sink.events
        if isinstance(e, HistoryRepairChanged) and e.report.phase is not RepairPhase.Bridging
    ]
    return report.pages, report.events


def _engine(store: Path, client: MatrixClient, sink: Sink) -> Any:
    return Engine.open(
        store, client, passphrase="pw", sink=sink, sync=False, send=False, e2ee=True,
        kdf_cost=KdfParams.cheap(), sync_timeline_limit=LIMIT,
    )  # fmt: skip


async def _sees(nio: NioDevice, user_id: str, devices: set[str]) -> None:
    for _ in range(40):
        await nio.step(timeout_ms=500)
        known = {d.device_id for d in nio.client.device_store.active_user_devices(user_id)}
        if devices <= known:
            return
    raise AssertionError("nio never saw both of alice's devices")


async def test_a_recovered_device_heals_on_open_and_through_a_fill_like_the_first(
    synapse_kit, tmp_path: Path, peers: tuple[Session, NioDevice, str]
) -> None:
    alice, nio, room = peers
    async with MatrixClient(synapse_kit.base_url) as login:
        second = await login.login(alice.user_id, "password")
    transport = _NoToDevice()
    sink_a, sink_b = Sink(), Sink()
    async with (
        MatrixClient(synapse_kit.base_url, session=alice, trust_env=False) as client_a,
        MatrixClient(synapse_kit.base_url, session=second, transport=transport) as client_b,
        _engine(tmp_path / "a", client_a, sink_a) as a,
        _engine(tmp_path / "b", client_b, sink_b) as b,
    ):
        for engine in (a, b):
            await engine.sync_once()
            await engine.execute(OpenRoom(room))
            await engine.wait_idle(room)
        assert a.crypto is not None and a.crypto.driver is not None
        driver = a.crypto.driver
        await bootstrap_cross_signing(driver, password="password")
        await enable_backup(driver)
        recovery_key = (await set_up_recovery(driver)).recovery_key
        await _sees(nio, alice.user_id, {alice.device_id, second.device_id})

        first = [await nio.send_text(room, f"first {i}") for i in range(3)]
        for engine in (a, b):
            await engine.sync_once()
        burst = []
        for i in range(36):  # three sessions, more than a sync shows: a gap on both
            if i % 12 == 0:
                nio.olm.outbound_group_sessions.pop(room, None)
            burst.append(await nio.send_text(room, f"burst {i}"))
        for engine in (a, b):
            await engine.sync_once()
        for _ in range(20):  # A's steps back its keys up
            if not driver.machine.backup.pending:
                break
            await a.sync_once(timeout_ms=200)
        assert driver.machine.backup.pending == 0
        await a.flush_history(room)
        await b.flush_history(room)
        shown = set(_rows(b, room))
        assert shown and all(_readable(b, room)[e] is None for e in shown)  # no key on B

        # B recovers: nothing is restored up front, the visible rows heal by themselves.
        fetcher = b.backup_fetch
        assert fetcher is not None
        fetcher.pause_s = 3600  # the rest of the room waits: the fill has to fetch its pages
        report = await b.recover_keys(recovery_key)
        assert report.imported == ()
        await fetcher.wait_idle(rooms=False)
        await b.flush_history(room)
        assert all(_readable(b, room)[e] == _readable(a, room)[e] for e in shown)
        assert all(_readable(b, room)[e] is not None for e in shown)
        assert ("GET", "/_matrix/client/v3/room_keys/keys") not in transport.paths

        a_fill = await _fill(a, sink_a, room)
        asked = fetcher.asked
        b_fill = await _fill(b, sink_b, room)
        assert b_fill == a_fill and a_fill[1] >= len(burst) - LIMIT
        assert fetcher.asked > asked  # the fill's pages fetched their own sessions
        await b.flush_history(room)
        assert _readable(b, room) == _readable(a, room)
        assert set(first + burst) <= set(_readable(b, room))
        assert all(body is not None for body in _readable(b, room).values())

        fetcher.pause_s = 0  # the background fetch takes the rest of the room now
        fetcher.wake()
        await fetcher.wait_idle()
        rooms_asked = [
            p for m, p in transport.paths
            if m == "GET" and p.startswith("/_matrix/client/v3/room_keys/keys/")
            and p.count("/") == 6
        ]  # fmt: skip
        assert rooms_asked == [f"/_matrix/client/v3/room_keys/keys/{room}"]
